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
        let fb = dir.join(format!("{name}.nv_fatbin"));
        std::fs::write(&fb, fatbin).unwrap();
        let ok = Command::new("objcopy")
            .arg(format!("--add-section=.nv_fatbin={}", fb.display()))
            .args(["--set-section-flags", ".nv_fatbin=alloc,readonly"])
            .arg(&lib)
            .status()
            .unwrap();
        assert!(ok.success(), "objcopy failed on {}", lib.display());
    }
    lib
}
