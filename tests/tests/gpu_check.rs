//! scripts/gpu-check and gpuarch-gpu-check where there is no GPU (CI, this
//! build machine): every part fails at once saying why, the report is
//! still written, and the driver code answers "no CUDA driver" instead of
//! panicking. And the unit's sandbox wrapper, which needs no GPU: the
//! seccomp programs generated from systemd's own lists refuse what
//! gpuarchd.service refuses, and PR_SET_MDWE refuses a writable and
//! executable mapping. The GPU runs themselves are in docs/gpu/.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use gpuarch_tests::{artifacts, skip, which, workspace_root};
use serde_json::Value;

fn has_gpu_driver() -> bool {
    which("nvidia-smi").is_some()
        || Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists()
        || Path::new("/usr/local/nvidia/lib64/libcuda.so.1").exists()
}

#[test]
fn without_a_driver_every_part_says_so_and_the_report_is_written() {
    if has_gpu_driver() {
        // On a GPU host the script is run by hand (docs/gpu/README.md).
        gpuarch_tests::skip("this host has an NVIDIA driver; run scripts/gpu-check run");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let o = Command::new("python3")
        .arg(workspace_root().join("scripts/gpu-check"))
        .args(["run", "--bundle"])
        .arg(out.path().join("no-bundle"))
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for p in 1..=9 {
        let line =
            format!("FAIL part{p} prerequisites: no NVIDIA driver here (nvidia-smi not found)\n");
        assert!(stdout.contains(&line), "{stdout}");
    }
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("gpu-check.json")).unwrap()).unwrap();
    assert_eq!(report["passed"], 0);
    assert_eq!(report["failed"], 9);
    assert!(report["gpu"].is_null());
}

/// Part 7 rehearsed where there is no GPU: real runc through
/// gpuarch-runtime with `jit_cache` on, the host's software as the image,
/// and in each container torch's own `cpp_extension.load` building a CUDA
/// extension with nvcc into `TORCH_EXTENSIONS_DIR`, and Triton compiling a
/// kernel for the planned GPU into `TRITON_CACHE_DIR`. Nothing runs on a
/// GPU; the driver's PTX JIT cache is the one check skipped. What this
/// holds is what a GPU run adds only the kernel launches to
/// (docs/gpu/README.md): the hook's cache is mounted where the variables
/// say, torch builds sm_90 SASS for the H100 fixture under the image's
/// CUDA 13.0, a second container of the same uid and image loads the first
/// one's build without rebuilding, and another uid and another image each
/// get a cache of their own. Part 8 in the same run: the hook reads this
/// host's root as the image, finds its torch through the venv on PATH, and
/// an extension built under that Plan carries sm_90. Part 9 too: the
/// audit's verdicts on libraries nvcc builds (sm_75 only, sm_90, PTX only,
/// and a package with sm_90 and a backend for sm_100 alone) for the H100
/// fixture, and this host's own image audited.
#[test]
fn parts_7_8_and_9_rehearsed_without_a_gpu() {
    gpuarch_tests::skip_unless!(gpuarch_tests::cannot_run(
        "to run containers",
        &["runc", "unshare"]
    ));
    let (python, cuda_home) = match gpuarch_tests::torch_image() {
        Ok(found) => found,
        Err(why) => return skip(&why),
    };
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bundle/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let a = artifacts();
    for p in [
        &a.gpuarchctl,
        &a.gpuarchd,
        &a.gpuarch_hook,
        &a.gpuarch_runtime,
        &a.gpu_check,
    ] {
        std::os::unix::fs::symlink(p, bin.join(p.file_name().unwrap())).unwrap();
    }
    // The image's environment, as NVIDIA's CUDA images set it: the venv's
    // bin (ninja) first on PATH, CUDA_HOME, CUDA_VERSION.
    let path = format!(
        "{}:{}",
        python.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = dir.path().join("out");
    let o = Command::new("python3")
        .arg(workspace_root().join("scripts/gpu-check"))
        .args(["run", "--parts", "7,8,9", "--rehearse", "--python"])
        .arg(&python)
        .arg("--bundle")
        .arg(dir.path().join("bundle"))
        .arg("--out")
        .arg(&out)
        .env_remove("GPUARCH_INVENTORY")
        .env("PATH", path)
        .env("CUDA_HOME", &cuda_home)
        .env("CUDA_VERSION", "13.0.2")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", said(&o));
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("gpu-check.json")).unwrap()).unwrap();
    assert_eq!(report["rehearsal"], true);
    assert_eq!(
        (report["failed"].as_u64(), report["skipped"].as_u64()),
        (Some(0), Some(1))
    );
    let checks = report["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    let mut want = vec![
        "build in a container",
        "reuse by a second container",
        "Triton's cache reused by a second container",
        "the driver's PTX JIT cache reused by a second container",
        "another uid builds its own",
        "another image builds its own",
    ];
    // The checkout may sit where other users cannot reach (under /root):
    // then there is no uid-1000 container, and the script says why.
    if !names.contains(&"another uid builds its own") {
        assert!(stdout.contains("-- no uid-1000 container:"), "{stdout}");
        want.remove(4);
    }
    want.extend([
        "the host's own image read",
        "an extension built under the image's Plan",
        // Part 9: the audit's verdicts on nvcc's libraries for the H100
        // fixture, and this host's own image audited.
        "xformers",
        "probe-native",
        "probe-ptx",
        "probe-backend",
        "probe-backend, built for newer GPUs",
        "the host's own image",
    ]);
    assert_eq!(names, want, "{stdout}");
    let audit = |name: &str| &checks.iter().find(|c| c["name"] == name).unwrap()["data"];
    assert_eq!(audit("xformers")["audit"]["runs"], "no");
    assert_eq!(audit("probe-native")["audit"]["runs"], "sass");
    assert_eq!(audit("probe-ptx")["audit"]["runs"], "jit");
    // A package built for this GPU, with a backend built for sm_100 alone.
    assert_eq!(audit("probe-backend")["audit"]["runs"], "sass");
    assert_eq!(
        audit("probe-backend, built for newer GPUs")["audit"]["runs"],
        "other_gpus"
    );
    assert_eq!(
        audit("the host's own image")["cannot"],
        serde_json::json!([])
    );
    assert!(checks[3]["ok"].is_null(), "{}", checks[3]);
    let result = |name: &str| &checks.iter().find(|c| c["name"] == name).unwrap()["data"]["result"];
    let (first, second) = (result(want[0]), result(want[1]));
    // The hook's variables, torch's flags from them, and the SASS in the
    // .so, read back with cuobjdump.
    assert_eq!(first["env"]["TORCH_CUDA_ARCH_LIST"], "9.0");
    assert_eq!(
        first["arch_flags"],
        serde_json::json!(["-gencode=arch=compute_90,code=sm_90"])
    );
    assert_eq!(first["sass"], serde_json::json!(["sm_90"]));
    assert!(first["ran"].is_null() && first["gpu"].is_null());
    assert_eq!(
        first["env"]["TORCH_EXTENSIONS_DIR"],
        "/var/cache/gpuarch/jit/torch_extensions"
    );
    assert_eq!(
        first["env"]["TRITON_CACHE_DIR"],
        "/var/cache/gpuarch/jit/triton"
    );
    assert_eq!(
        first["env"]["CUDA_CACHE_PATH"],
        "/var/cache/gpuarch/jit/nv-compute-cache"
    );
    // The cache is per targets and toolkit: sm_90 under CUDA 13.0.
    let first_cache = first["host_cache"].as_str().unwrap();
    assert!(first_cache.ends_with("/sm_90-cuda13.0"), "{first_cache}");
    assert_eq!(second["host_cache"], first["host_cache"]);
    assert_eq!(second["so"], first["so"]);
    let triton = &checks[2]["data"];
    assert_eq!(triton["first"]["compiled_for"], 90);
    assert_eq!(triton["first"]["before"], 0);
    assert_eq!(triton["second"]["before"], triton["first"]["after"]);
    for (name, uid, scope) in [
        ("another uid builds its own", 1000, "/uid1000-image-"),
        ("another image builds its own", 0, "/uid0-image-"),
    ] {
        if !want.contains(&name) {
            continue;
        }
        let third = result(name);
        assert_eq!(third["uid"], uid);
        let cache = third["host_cache"].as_str().unwrap();
        assert!(cache.contains(scope) && cache != first_cache, "{third}");
    }
    // Part 8: the hook read this host's root as the image, found the
    // image's Python through the venv on PATH, and named its torch; the
    // extension built under that Plan carries the H100's SASS.
    let data = |name: &str| &checks.iter().find(|c| c["name"] == name).unwrap()["data"];
    let image = data("the host's own image read");
    let site = image["site"].as_str().unwrap();
    assert!(
        image["sites"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.as_str() == Some(site)),
        "{image}"
    );
    let torch = image["torch"].as_str().unwrap();
    let public = torch.split('+').next().unwrap();
    assert!(
        image["note"]
            .as_str()
            .unwrap()
            .starts_with(&format!("torch {public}")),
        "{image}"
    );
    assert_eq!(image["plan"]["TORCH_CUDA_ARCH_LIST"], "9.0");
    let built = data("an extension built under the image's Plan");
    assert_eq!(built["targets"], serde_json::json!(["sm_90"]));
    assert!(built["result"]["ran"].is_null(), "{built}");
}

#[test]
fn the_driver_checks_say_no_cuda_driver_and_exit_2() {
    if has_gpu_driver() {
        gpuarch_tests::skip("this host has an NVIDIA driver");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.cubin");
    std::fs::write(&file, b"\x7fELF").unwrap();
    let gc = &artifacts().gpu_check;
    let store = dir.path().join("store");
    let runs: [Vec<&std::ffi::OsStr>; 2] = [
        vec!["kernels".as_ref(), "--store".as_ref(), store.as_os_str()],
        vec!["load".as_ref(), file.as_os_str()],
    ];
    for args in runs {
        let o = Command::new(gc).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("no CUDA driver: libcuda.so.1 could not be loaded"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The seccomp programs as `scripts/gpu-check bundle` makes them.
fn bpf_dir() -> Option<tempfile::TempDir> {
    let has_seccomp = Command::new("/usr/bin/python3")
        .args(["-c", "import seccomp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_seccomp || which("systemd-analyze").is_none() {
        skip("needs python3-seccomp (/usr/bin/python3) and systemd-analyze");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new("/usr/bin/python3")
        .arg(workspace_root().join("scripts/lib/seccomp-bpf.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Some(dir)
}

/// A mount(2) of a tmpfs on a path that does not exist: ENOENT where the
/// call is allowed, EPERM where a filter refuses it.
const MOUNT: &str = "import ctypes, os; l = ctypes.CDLL(None, use_errno=True); \
    l.mount(b'none', b'/nonexistent/gpuarch', b'tmpfs', 0, None); \
    print(os.strerror(ctypes.get_errno()))";
/// A writable and executable anonymous mapping.
const WX_MAP: &str = "import mmap\ntry:\n    mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_EXEC)\n    print('mapped')\nexcept OSError as e:\n    print(e.strerror)";

fn sandboxed(flags: &[&std::ffi::OsStr], code: &str) -> Output {
    Command::new(&artifacts().gpu_check)
        .arg("sandbox")
        .args(flags)
        .args(["--", "python3", "-c", code])
        .output()
        .unwrap()
}

fn bpf(p: &Path) -> [&std::ffi::OsStr; 2] {
    ["--bpf".as_ref(), p.as_os_str()]
}

fn said(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[test]
fn the_units_seccomp_filters_refuse_what_the_unit_refuses() {
    let Some(dir) = bpf_dir() else { return };
    let service = dir.path().join("system-service.bpf");
    let mdwe = dir.path().join("mdwe.bpf");
    // Bare, the calls reach the kernel.
    assert_eq!(said(&sandboxed(&[], MOUNT)), "No such file or directory");
    assert_eq!(said(&sandboxed(&[], WX_MAP)), "mapped");
    // @system-service has no mount(2); the process still runs.
    assert_eq!(
        said(&sandboxed(&bpf(&service), MOUNT)),
        "Operation not permitted"
    );
    assert_eq!(said(&sandboxed(&bpf(&service), WX_MAP)), "mapped");
    // MemoryDenyWriteExecute= as seccomp refuses the mapping, not mount.
    assert_eq!(
        said(&sandboxed(&bpf(&mdwe), WX_MAP)),
        "Operation not permitted"
    );
    assert_eq!(
        said(&sandboxed(&bpf(&mdwe), MOUNT)),
        "No such file or directory"
    );
}

#[test]
fn pr_set_mdwe_refuses_a_writable_executable_mapping() {
    let mdwe = ["--mdwe".as_ref()];
    let o = sandboxed(&mdwe, WX_MAP);
    let err = String::from_utf8_lossy(&o.stderr);
    if err.contains("prctl(PR_SET_MDWE)") {
        skip(&format!(
            "this kernel has no PR_SET_MDWE (Linux 6.3): {err}"
        ));
        return;
    }
    assert_eq!(said(&o), "Permission denied");
    // A bad program is refused before anything is applied.
    let o = Command::new(&artifacts().gpu_check)
        .args(["sandbox", "--bpf", "/dev/null", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a BPF program (0 bytes)"));
}
