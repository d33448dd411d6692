//! Shared libraries carrying GPU code, made with gcc and objcopy as the
//! tests need them. Plain std, so that kernels/tests includes this file too
//! (`#[path]`): that crate cannot depend on this one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `dir/<name>` (also its soname) built with gcc from a one-function C file; with `fatbin`
/// non-empty, it is added as the `.nv_fatbin` section with objcopy, where
/// nvcc puts a library's device code.
#[allow(clippy::unwrap_used)] // test helper: a failed build is a failed test
pub fn shared_library_with(dir: &Path, name: &str, fatbin: &[u8]) -> PathBuf {
    shared_library_with_section(dir, name, ".nv_fatbin", fatbin)
}

/// `dir/<name>` as [`shared_library_with`] makes it, `data` added as
/// section `section` (a library's own `.ldata`, as cuFFT keeps its
/// fatbins there).
#[allow(clippy::unwrap_used)] // test helper: a failed build is a failed test
pub fn shared_library_with_section(
    dir: &Path,
    name: &str,
    section: &str,
    fatbin: &[u8],
) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, "int probe(void) { return 42; }\n").unwrap();
    let lib = dir.join(name);
    let ok = Command::new("gcc")
        .args(["-shared", "-fPIC"])
        .arg(format!("-Wl,-soname,{name}"))
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success(), "gcc failed on {}", src.display());
    if !fatbin.is_empty() {
        let fb = dir.join(format!("{name}{section}"));
        std::fs::write(&fb, fatbin).unwrap();
        let ok = Command::new("objcopy")
            .arg(format!("--add-section={section}={}", fb.display()))
            .arg("--set-section-flags")
            .arg(format!("{section}=alloc,readonly"))
            .arg(&lib)
            .status()
            .unwrap();
        assert!(ok.success(), "objcopy failed on {}", lib.display());
    }
    lib
}
