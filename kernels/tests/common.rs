//! Shared by the kernel tests: where the NVIDIA wheels are, and cuobjdump.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The unpacked NVIDIA wheels; None (with the reason printed) when absent.
pub fn cuda_dir() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = gpuarch_kernels::toolchain::local_wheels(&root);
    if found.is_none() {
        let why = "no NVRTC wheel under .local/cuda (scripts/test installs it)";
        // As gpuarch_tests::skip (this crate cannot depend on it).
        if std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("GPUARCH_TEST_REQUIRE_ALL").is_ok_and(|v| v == "1")
        {
            panic!("cannot run (CI=true or GPUARCH_TEST_REQUIRE_ALL=1): {why}");
        }
        eprintln!("SKIPPED: {why}");
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

/// A fatbin container of `(kind, sm, payload)` entries, kind 1 = PTX and
/// 2 = ELF, uncompressed, in the layout nvcc's fatbinary writes (the tests
/// check cuobjdump reads what this makes).
pub fn fatbin(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, sm, payload) in entries {
        let mut data = payload.to_vec();
        if *kind == 1 {
            data.push(0);
        }
        while data.len() % 8 != 0 {
            data.push(0);
        }
        let mut h = vec![0u8; 64];
        h[0..2].copy_from_slice(&kind.to_le_bytes());
        h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        h[4..8].copy_from_slice(&64u32.to_le_bytes());
        h[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let (major, minor): (u16, u16) = if *kind == 1 { (8, 8) } else { (1, 7) };
        h[24..26].copy_from_slice(&minor.to_le_bytes());
        h[26..28].copy_from_slice(&major.to_le_bytes());
        h[28..32].copy_from_slice(&sm.to_le_bytes());
        h[40..48].copy_from_slice(&0x11u64.to_le_bytes()); // 64-bit, Linux host
        body.extend(h);
        body.extend(data);
    }
    let mut out = Vec::new();
    out.extend(0xBA55_ED50u32.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend((body.len() as u64).to_le_bytes());
    out.extend(body);
    out
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
