//! Shared by the kernel tests: where the NVIDIA wheels are, and cuobjdump.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The `nvidia/` directory of the wheels `scripts/test` unpacks, or
/// `$GPUARCH_CUDA_DIR`. None (with the reason printed) when absent.
pub fn cuda_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("GPUARCH_CUDA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.local/cuda/nvidia"));
    if dir.join("cuda_nvrtc/lib/libnvrtc.so.12").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: no NVRTC wheel at {} (scripts/test installs it)",
            dir.display()
        );
        None
    }
}

pub fn packages_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packages")
}

/// The arch `cuobjdump -lelf` reports for a cubin (`sm_86`).
pub fn cuobjdump_arch(cuda: &Path, cubin: &Path) -> String {
    let out = std::process::Command::new(cuda.join("cu13/bin/cuobjdump"))
        .arg("-lelf")
        .arg(cubin)
        .output()
        .expect("run cuobjdump");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // "ELF file    1: saxpy.sm_86.cubin"
    text.rsplit(".sm_")
        .next()
        .and_then(|s| {
            s.strip_suffix(".cubin")
                .or_else(|| s.trim().strip_suffix(".cubin"))
        })
        .map(|s| format!("sm_{s}"))
        .unwrap_or_else(|| panic!("no arch in cuobjdump output: {text}"))
}
