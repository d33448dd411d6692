//! The real wheels, audited as cuobjdump reads them: torch's and NVIDIA's
//! of the torch image, and bitsandbytes', xformers' and vLLM's from PyPI
//! (scripts/lib/setup.sh `ensure_audit_images`).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::{audit, code_of, cuobjdump_listed, cuobjdump_targets, stdout};

/// The torch image's real wheels (torch 2.12.0 for CUDA 13.0, cuBLAS,
/// cuFFT, NCCL): each audited binary's targets are cuobjdump's, except
/// the fatbins cuFFT keeps in its own `.ldata`, which cuobjdump does not
/// list and the audit does (without them cuFFT would read as sm_75-only,
/// a false alarm on every newer GPU). torch 2.12's linear algebra library
/// carries sm_80 and up, fewer GPUs than its libtorch_cuda.so: the audit
/// says a 7.5 GPU runs none of it, as code built for other GPUs.
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
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(doc["stopped"].is_null(), "{doc}");
    let binaries = doc["binaries"].as_array().unwrap();
    let find = |suffix: &str| {
        binaries
            .iter()
            .find(|b| b["path"].as_str().unwrap().ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix} in {text}"))
    };
    let code = code_of;
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
    // The one binary a 7.5 GPU runs nothing of: built for sm_80 and up,
    // fewer GPUs than torch's own libtorch_cuda.so. Targets cannot tell it
    // from a backend a package gates on the capability, so it is said
    // ("other_gpus"), not counted as a failure; 9.0 runs every one.
    let linalg = find("torch/lib/libtorch_cuda_linalg.so");
    assert_eq!(linalg["gpus"][0]["runs"], "other_gpus", "{linalg}");
    let judged = |runs: &str| -> Vec<&str> {
        binaries
            .iter()
            .filter(|b| {
                b["gpus"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|g| g["runs"] == runs)
            })
            .map(|b| b["path"].as_str().unwrap())
            .collect()
    };
    assert!(judged("no").is_empty(), "{text}");
    assert_eq!(
        judged("other_gpus"),
        [linalg["path"].as_str().unwrap()],
        "{text}"
    );
    assert!(
        text.contains("capability 7.5: runs all of them (24 from SASS, 0 by PTX JIT, 1 built only for other GPUs)"),
        "{text}"
    );
    assert!(text.contains("capability 9.0: runs all of them"), "{text}");
}

/// bitsandbytes 0.45.5 from PyPI, as an image keeps it: a library per CUDA
/// release. Those for CUDA 11.7 to 12.6 carry SASS from sm_50 to sm_86 or
/// sm_90 and the PTX of the last (which cuobjdump lists only with `-all`),
/// the one for CUDA 12.8 SASS from sm_70 to sm_120: a Pascal GPU (6.1)
/// runs nothing of that one, built for newer GPUs only (said, not a
/// failure), and a Blackwell one (12.0) runs it from SASS and the others by
/// PTX JIT. cuobjdump 13.5 reads seven of the ten whole; in
/// the CUDA 12.0 to 12.2 ones it stops at "Invalid ELF" after four cubins.
#[test]
fn the_bitsandbytes_wheel_is_audited_as_cuobjdump_reads_it() {
    let Some(image) = std::env::var_os("GPUARCH_BNB_IMAGE") else {
        gpuarch_tests::skip(
            "GPUARCH_BNB_IMAGE names no image (scripts/test unpacks bitsandbytes' wheel)",
        );
        return;
    };
    let image = std::path::PathBuf::from(image);
    if gpuarch_tests::cuda_dir().is_none() {
        return;
    }
    let (o, doc) = audit(&["audit", image.to_str().unwrap(), "--cap", "6.1,8.6,12.0"]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    let binaries = doc["binaries"].as_array().unwrap();
    let libs: Vec<&Value> = binaries
        .iter()
        .filter(|b| {
            b["path"]
                .as_str()
                .unwrap()
                .contains("/libbitsandbytes_cuda")
        })
        .collect();
    assert_eq!(libs.len(), 10, "{text}");
    assert_eq!(
        binaries.len(),
        10,
        "the CPU library carries no GPU code: {text}"
    );
    let cuda124 = libs
        .iter()
        .find(|b| b["path"].as_str().unwrap().ends_with("cuda124.so"))
        .map(|b| code_of(b))
        .unwrap();
    let mut compared = 0;
    for b in libs {
        let path = b["path"].as_str().unwrap();
        assert_eq!(b["owner"], "bitsandbytes 0.45.5", "{b}");
        let code = code_of(b);
        let on_host = image.join(path.trim_start_matches('/'));
        match cuobjdump_listed(&on_host, &["-all"]) {
            (listed, None) => {
                assert_eq!(code, listed, "{path}");
                compared += 1;
            }
            // cuobjdump 13.5 stops at "Invalid ELF" in the CUDA 12.0 to
            // 12.2 libraries after their first four cubins: what it listed
            // is the audit's, and the rest is the same build matrix as
            // CUDA 12.4's, which it reads whole.
            (listed, Some(fatal)) => {
                assert!(listed.is_subset(&code), "{path}: {listed:?} {fatal}");
                assert_eq!(code, cuda124, "{path}: {fatal}");
            }
        }
        let runs: Vec<&str> = b["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["runs"].as_str().unwrap())
            .collect();
        if path.ends_with("cuda128.so") {
            assert!(!code.contains("sm_61") && code.contains("sm_120"), "{b}");
            // Built for newer GPUs than a Pascal alone: bitsandbytes loads
            // the library of torch's CUDA runtime, and CUDA 12.8's torch
            // has no Pascal build. Said, not a failure.
            assert_eq!(runs, ["other_gpus", "sass", "sass"], "{b}");
        } else {
            // 11.7's PTX is compute_86, the others' compute_90.
            assert!(code.contains("sm_61"), "{b}");
            assert!(code.iter().any(|c| c.starts_with("compute_")), "{b}");
            assert!(
                !code
                    .iter()
                    .any(|c| c.ends_with("_100") || c.ends_with("_120")),
                "{b}"
            );
            assert_eq!(runs, ["sass", "sass", "jit"], "{b}");
        }
    }
    assert!(compared >= 7, "cuobjdump read {compared} of the 10 whole");
    assert!(
        text.contains(
            "capability 6.1: runs all of them (9 from SASS, 0 by PTX JIT, 1 built only for other GPUs)"
        ),
        "{text}"
    );
    assert!(
        text.contains("capability 12.0: runs all of them (1 from SASS, 9 by PTX JIT)"),
        "{text}"
    );
}

/// The image of wheel `var` (`GPUARCH_XFORMERS_IMAGE`), or None (a skip).
fn wheel_image(var: &str) -> Option<std::path::PathBuf> {
    let Some(image) = std::env::var_os(var) else {
        gpuarch_tests::skip(&format!(
            "{var} names no image (scripts/test unpacks the wheel: ensure_audit_images)"
        ));
        return None;
    };
    gpuarch_tests::cuda_dir()?;
    Some(image.into())
}

/// Each binary's path under its site, and how each capability runs it.
type Runs = Vec<(String, Vec<String>)>;

/// The audit of `image` on `caps`, each binary's targets held to
/// cuobjdump's: its exit status, its text, and the [`Runs`].
fn judged(image: &std::path::Path, caps: &str) -> (Option<i32>, String, Runs) {
    let (o, doc) = audit(&["audit", image.to_str().unwrap(), "--cap", caps]);
    let text = stdout(&o);
    let mut out = Vec::new();
    for b in doc["binaries"].as_array().unwrap() {
        let path = b["path"].as_str().unwrap();
        let (listed, fatal) =
            cuobjdump_listed(&image.join(path.trim_start_matches('/')), &["-all"]);
        assert_eq!(fatal, None, "{path}");
        assert_eq!(code_of(b), listed, "{path}");
        let runs = b["gpus"].as_array().unwrap().iter();
        let runs = runs.map(|g| g["runs"].as_str().unwrap().to_owned());
        let short = path.rsplit("site-packages/").next().unwrap().to_owned();
        out.push((short, runs.collect()));
    }
    (o.status.code(), text, out)
}

/// xformers 0.0.34 from PyPI: its own library carries sm_75 to sm_90a;
/// its FlashAttention-3 sm_80 and sm_90a, which xformers launches only
/// from 8.0 (`CUDA_MINIMUM_COMPUTE_CAPABILITY = (8, 0)` in its
/// `ops/fmha/flash3.py`). A 2080 Ti runs xformers: FlashAttention-3 is
/// said to be for other GPUs, never a failure.
#[test]
fn the_xformers_wheel_is_audited_as_cuobjdump_reads_it() {
    let Some(image) = wheel_image("GPUARCH_XFORMERS_IMAGE") else {
        return;
    };
    let (code, text, runs) = judged(&image, "7.5,8.6,9.0");
    assert_eq!(code, Some(0), "{text}");
    let want = |s: &[&str]| s.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        runs,
        [
            ("xformers/_C.so".to_owned(), want(&["sass", "sass", "sass"])),
            (
                "xformers/flash_attn_3/_C.so".to_owned(),
                want(&["other_gpus", "sass", "sass"])
            ),
        ],
        "{text}"
    );
    assert!(
        text.contains("capability 7.5: runs all of them (1 from SASS, 0 by PTX JIT, 1 built only for other GPUs)"),
        "{text}"
    );
}

/// vLLM 0.33.0 from PyPI: nine libraries. Its main ones carry sm_75 to
/// sm_120; the others are built for Hopper (`sm_90a`) or SM100 alone,
/// which vLLM chooses by capability (FlashMLA only on the 9.x family,
/// DeepSelect only on 10.x). An A100 and an RTX 5090 run vLLM, with those
/// said to be for other GPUs; a V100 (7.0) runs none of it, and the audit
/// fails it.
#[test]
fn the_vllm_wheel_is_audited_as_cuobjdump_reads_it() {
    let Some(image) = wheel_image("GPUARCH_VLLM_IMAGE") else {
        return;
    };
    let (code, text, runs) = judged(&image, "8.0,9.0,12.0");
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(runs.len(), 9, "{text}");
    let of = |suffix: &str| {
        runs.iter()
            .find(|(p, _)| p.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix}: {text}"))
            .1
            .join(" ")
    };
    assert_eq!(of("vllm/_C_stable_libtorch.abi3.so"), "sass sass sass");
    assert_eq!(of("vllm/_moe_C_stable_libtorch.abi3.so"), "sass sass sass");
    // FlashAttention-2 has sm_80 SASS and its PTX: Hopper and Blackwell
    // would JIT it (vLLM takes FlashAttention-3 on Hopper).
    assert_eq!(of("_vllm_fa2_C.abi3.so"), "sass jit jit");
    assert_eq!(of("_vllm_fa3_C.abi3.so"), "other_gpus sass other_gpus");
    assert_eq!(of("vllm/_flashmla_C.abi3.so"), "other_gpus sass other_gpus");
    assert_eq!(
        of("vllm/_deepselect_C.abi3.so"),
        "other_gpus other_gpus other_gpus"
    );
    let (code, text, runs) = judged(&image, "7.0");
    assert_eq!(code, Some(1), "{text}");
    assert!(runs.iter().all(|(_, r)| r == &["no"]), "{text}");
    assert!(
        text.contains("capability 7.0: cannot run 9 of them"),
        "{text}"
    );
}
