#![allow(clippy::unwrap_used)]
//! `gpuarchctl audit` on real binaries: a library nvcc (from NVIDIA's
//! wheels) builds for sm_75 alone inside an xformers-shaped package, judged
//! on the RTX 2080 Ti + RTX 3090 fixture (issue "image audit", seed 000);
//! and the real torch, cuBLAS, cuFFT and NCCL wheels of the torch image,
//! every verdict's targets held to NVIDIA's cuobjdump.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuarch_tests::{artifacts, fixture};
use serde_json::Value;

const PROBE: &str = r#"
extern "C" __global__ void fmha_probe(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f;
}
"#;

/// `dir/_C.so` built by nvcc for `gencode` (`-gencode` values).
fn nvcc_library(cuda_home: &Path, dir: &Path, gencode: &[&str]) -> PathBuf {
    let src = dir.join("probe.cu");
    std::fs::write(&src, PROBE).unwrap();
    let out = dir.join("_C.so");
    let obj = dir.join("probe.o");
    // Compiled by nvcc, linked by the host's compiler: the library's
    // cudart symbols are left for the loader, as a wheel's are.
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

/// The SASS and PTX targets cuobjdump lists in `file` (`sm_75`,
/// `compute_80`).
fn cuobjdump_targets(file: &Path) -> BTreeSet<String> {
    let cuda = gpuarch_tests::cuda_dir().expect("the NVIDIA wheels");
    let o = Command::new(cuda.join("cu13/bin/cuobjdump"))
        .args(["--list-elf", "--list-ptx"])
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = BTreeSet::new();
    for line in text.lines() {
        // "ELF file    1: _C.1.sm_75.cubin", "PTX file    2: _C.2.sm_80.ptx"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let Some(arch) = name.split('.').find(|p| p.starts_with("sm_")) else {
            continue;
        };
        if line.starts_with("ELF file") {
            out.insert(arch.to_owned());
        } else if line.starts_with("PTX file") {
            out.insert(arch.replace("sm_", "compute_"));
        }
    }
    out
}

fn audit(args: &[&str]) -> (Output, Value) {
    let mut c = Command::new(&artifacts().gpuarchctl);
    c.env_clear()
        .env("GPUARCH_CONFIG", "/dev/null")
        .env("GPUARCH_INVENTORY", fixture("2080ti-3090"));
    let text = c.args(args).output().unwrap();
    let mut c = Command::new(&artifacts().gpuarchctl);
    c.env_clear()
        .env("GPUARCH_CONFIG", "/dev/null")
        .env("GPUARCH_INVENTORY", fixture("2080ti-3090"))
        .arg("--json");
    let o = c.args(args).output().unwrap();
    let doc = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(o.status.code(), text.status.code());
    (text, doc)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Seed 000: xformers built for sm_75 only. The 2080 Ti (GPU 0) runs it;
/// the 3090 (GPU 1) cannot, and the audit says so, naming the file, the
/// distribution and the list to rebuild with, with exit status 1.
#[test]
fn an_sm75_only_xformers_runs_on_the_2080ti_and_the_audit_says_the_3090_cannot() {
    let (_python, cuda_home) = match gpuarch_tests::torch_image() {
        Ok(t) => t,
        Err(why) => {
            gpuarch_tests::skip(&why);
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let lib = nvcc_library(&cuda_home, tmp.path(), &["arch=compute_75,code=sm_75"]);
    assert_eq!(
        cuobjdump_targets(&lib),
        BTreeSet::from(["sm_75".to_owned()])
    );
    let root = tmp.path().join("rootfs");
    let site = root.join("usr/local/lib/python3.12/dist-packages");
    std::fs::create_dir_all(site.join("xformers")).unwrap();
    std::fs::create_dir_all(site.join("xformers-0.0.29.dist-info")).unwrap();
    std::fs::copy(&lib, site.join("xformers/_C.so")).unwrap();
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
    let root_s = root.to_str().unwrap();
    let path = "/usr/local/lib/python3.12/dist-packages/xformers/_C.so";

    let (o, doc) = audit(&["audit", root_s, "--devices", "0"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!("xformers 0.0.29 {path}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(doc["binaries"][0]["gpus"][0]["runs"], "sass");

    let (o, doc) = audit(&["audit", root_s]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("GPU 1 NVIDIA GeForce RTX 3090 (8.6): will not run: it carries only sm_75")
            && text.contains("rebuild with TORCH_CUDA_ARCH_LIST=\"7.5;8.6\""),
        "{text}"
    );
    assert!(
        text.contains("GPU 0 NVIDIA GeForce RTX 2080 Ti (7.5): runs from SASS sm_75"),
        "{text}"
    );
    let b = &doc["binaries"][0];
    assert_eq!(b["path"], path);
    assert_eq!(b["owner"], "xformers 0.0.29");
    assert_eq!(b["code"], serde_json::json!(["sm_75"]));
    assert_eq!(b["gpus"][1]["runs"], "no");
    assert_eq!(doc["rebuild_arch_list"], "7.5;8.6");

    // Rebuilt for both, as the audit said: both GPUs run it from SASS.
    let both = tempfile::tempdir().unwrap();
    let lib = nvcc_library(
        &cuda_home,
        both.path(),
        &["arch=compute_75,code=sm_75", "arch=compute_86,code=sm_86"],
    );
    std::fs::copy(&lib, site.join("xformers/_C.so")).unwrap();
    let (o, doc) = audit(&["audit", root_s]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let code: BTreeSet<String> = doc["binaries"][0]["code"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(code, cuobjdump_targets(&lib));
}

/// The torch image's real wheels (torch 2.12.0 for CUDA 13.0, cuBLAS,
/// cuFFT, NCCL): each audited binary's targets are cuobjdump's, except
/// the fatbins cuFFT keeps in its own `.ldata`, which cuobjdump does not
/// list and the audit does (without them cuFFT would read as sm_75-only,
/// a false alarm on every newer GPU). torch 2.12's linear algebra library
/// carries no sm_75: the audit says a 7.5 GPU cannot run it.
#[test]
fn the_torch_images_wheels_are_audited_as_cuobjdump_reads_them() {
    let (python, _) = match gpuarch_tests::torch_image() {
        Ok(t) => t,
        Err(why) => {
            gpuarch_tests::skip(&why);
            return;
        }
    };
    if gpuarch_tests::cuda_dir().is_none() {
        return;
    }
    let venv = python.parent().unwrap().parent().unwrap().to_owned();
    let (o, doc) = audit(&["audit", venv.to_str().unwrap(), "--cap", "7.5,9.0"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(doc["stopped"].is_null(), "{doc}");
    let binaries = doc["binaries"].as_array().unwrap();
    let find = |suffix: &str| {
        binaries
            .iter()
            .find(|b| b["path"].as_str().unwrap().ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix} in {text}"))
    };
    let code = |b: &Value| -> BTreeSet<String> {
        b["code"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect()
    };
    let on_host = |b: &Value| venv.join(b["path"].as_str().unwrap().trim_start_matches('/'));
    // libtorch_cuda.so (441 MiB, 14 s of cuobjdump here) is held to
    // cuobjdump on the GPU host, by scripts/gpu-check part 3.
    assert!(find("torch/lib/libtorch_cuda.so")["owner"] == "torch 2.12.0");
    for (suffix, owner) in [
        ("torch/lib/libtorch_cuda_linalg.so", "torch 2.12.0"),
        ("cu13/lib/libcublas.so.13", "nvidia-cublas 13.1.1.3"),
        ("nccl/lib/libnccl.so.2", "nvidia-nccl-cu13"),
    ] {
        let b = find(suffix);
        assert!(b["owner"].as_str().unwrap().starts_with(owner), "{b}");
        assert_eq!(code(b), cuobjdump_targets(&on_host(b)), "{suffix}");
    }
    let cufft = find("cu13/lib/libcufft.so.12");
    let listed = cuobjdump_targets(&on_host(cufft));
    assert_eq!(listed, BTreeSet::from(["sm_75".to_owned()]));
    assert!(
        code(cufft).is_superset(&listed) && code(cufft).contains("sm_90"),
        "{cufft}"
    );
    assert_eq!(cufft["gpus"][1]["runs"], "sass", "{cufft}");
    // The one binary a 7.5 GPU cannot run; 9.0 runs every one.
    let linalg = find("torch/lib/libtorch_cuda_linalg.so");
    assert_eq!(linalg["gpus"][0]["runs"], "no", "{linalg}");
    let cannot: Vec<&str> = binaries
        .iter()
        .filter(|b| {
            b["gpus"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["runs"] == "no")
        })
        .map(|b| b["path"].as_str().unwrap())
        .collect();
    assert_eq!(cannot, [linalg["path"].as_str().unwrap()], "{text}");
    assert!(text.contains("capability 9.0: runs all of them"), "{text}");
}
