//! Image fixtures for the image audit: a CUDA library nvcc (from NVIDIA's
//! wheels, in the torch image) builds for the archs given, inside an
//! xformers-shaped package with its `.dist-info`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The probe kernel.
pub const PROBE: &str = r#"
extern "C" __global__ void fmha_probe(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f;
}
"#;

/// Where the fixture's package lives inside the image.
pub const SITE: &str = "usr/local/lib/python3.12/dist-packages";

/// `dir/_C.so` built by nvcc for `gencode` (`-gencode` values): compiled
/// by nvcc, linked by the host's compiler, its cudart symbols left for the
/// loader as a wheel's are.
#[allow(clippy::unwrap_used)] // test helper: a failed build is a failed test
pub fn nvcc_library(cuda_home: &Path, dir: &Path, gencode: &[&str]) -> PathBuf {
    let src = dir.join("probe.cu");
    std::fs::write(&src, PROBE).unwrap();
    let obj = dir.join("probe.o");
    let out = dir.join("_C.so");
    let mut c = Command::new(cuda_home.join("bin/nvcc"));
    c.args(["-c", "-Xcompiler", "-fPIC", "-o"])
        .arg(&obj)
        .arg(&src);
    for g in gencode {
        c.args(["-gencode", g]);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "nvcc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = Command::new("gcc")
        .args(["-shared", "-o"])
        .arg(&out)
        .arg(&obj)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// xformers 0.0.29 in `root`'s [`SITE`], its `_C.so` a copy of `lib`.
#[allow(clippy::unwrap_used)] // test helper: a failed write is a failed test
pub fn xformers_in(root: &Path, lib: &Path) {
    let site = root.join(SITE);
    std::fs::create_dir_all(site.join("xformers")).unwrap();
    std::fs::create_dir_all(site.join("xformers-0.0.29.dist-info")).unwrap();
    std::fs::copy(lib, site.join("xformers/_C.so")).unwrap();
    std::fs::write(site.join("xformers/__init__.py"), "").unwrap();
    std::fs::write(
        site.join("xformers-0.0.29.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.29\n\n",
    )
    .unwrap();
    std::fs::write(
        site.join("xformers-0.0.29.dist-info/RECORD"),
        "xformers/__init__.py,,\nxformers/_C.so,sha256=x,1\nxformers-0.0.29.dist-info/RECORD,,\n",
    )
    .unwrap();
}
