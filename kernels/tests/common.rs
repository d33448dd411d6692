//! Shared by the kernel tests: where the NVIDIA wheels are, and cuobjdump.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The unpacked NVIDIA wheels; None (with the reason printed) when absent.
pub fn cuda_dir() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = gpuarch_kernels::toolchain::local_wheels(&root);
    if found.is_none() {
        gpuarch_testkit::skip("no NVRTC wheel under .local/cuda (scripts/test installs it)");
    }
    found
}

pub fn packages_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packages")
}

/// The arch `cuobjdump -lelf` reports for a cubin (`sm_86`).
pub fn cuobjdump_arch(cuda: &Path, cubin: &Path) -> String {
    let text = cuobjdump(cuda, &["-lelf"], cubin);
    // "ELF file    1: saxpy.sm_86.cubin"
    text.rsplit(".sm_")
        .next()
        .and_then(|s| s.trim().strip_suffix(".cubin"))
        .map(|s| format!("sm_{s}"))
        .unwrap_or_else(|| panic!("no arch in cuobjdump output: {text}"))
}

/// A header-only cubin for SM `sm` (ABI 7): enough for the store's check.
pub fn tiny_cubin(sm: u8) -> Vec<u8> {
    let mut d = vec![0u8; 64];
    d[..4].copy_from_slice(b"\x7fELF");
    d[4] = 2;
    d[5] = 1;
    d[7] = 51;
    d[8] = 7;
    d[18..20].copy_from_slice(&190u16.to_le_bytes());
    d[48..52].copy_from_slice(&(u32::from(sm) | 0x500 | (u32::from(sm) << 16)).to_le_bytes());
    d
}

/// A fatbin of `(kind, sm, payload)` entries (`inspect::write_fatbin`).
pub fn fatbin(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
    gpuarch_kernels::inspect::write_fatbin(entries)
}

/// Run cuobjdump with `args` on `file`; its stdout.
pub fn cuobjdump(cuda: &Path, args: &[&str], file: &Path) -> String {
    let out = std::process::Command::new(cuda.join("cu13/bin/cuobjdump"))
        .args(args)
        .arg(file)
        .output()
        .expect("run cuobjdump");
    assert!(
        out.status.success(),
        "cuobjdump {args:?} {}: {out:?}",
        file.display()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
