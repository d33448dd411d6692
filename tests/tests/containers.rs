//! Real containers: runc and crun behind `gpuarch-runtime`, podman with the
//! shipped hooks.d file. Each test builds a busybox-static rootfs, starts a
//! container on the 2080 Ti + 3090 topology and reads what the process
//! inside sees: its env, `/run/gpuarch/env`, mounted kernel packages.
//!
//! Needs root and runc, crun, podman and a static busybox (`.ci/run`
//! installs them); a test whose tool is missing says so and skips.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuarch_tests::containers::{Scene, Seen, nvidia_nodes};
use gpuarch_tests::{artifacts, fixture, image_fixture, need_containers, workspace_root};
use serde_json::{Value, json};

/// What each way of naming GPUs gives, through one way of starting
/// containers.
/// `env_files`: whether the engine path writes `/run/gpuarch/env` for exec
/// sessions (the shim's `runtime.env_files`, off by default).
fn matrix(env_files: bool, start: impl Fn(&Scene, &[&str]) -> Seen) {
    let s = Scene::new();
    let cases: [(&[&str], _); 4] = [
        (&["NVIDIA_VISIBLE_DEVICES=0"], ("7.5", "float16", "sdpa")),
        (
            &["NVIDIA_VISIBLE_DEVICES=1"],
            ("8.6", "bfloat16", "flash_attention_2"),
        ),
        (
            &["NVIDIA_VISIBLE_DEVICES=0,1"],
            ("7.5;8.6", "float16", "sdpa"),
        ),
        (
            &["NVIDIA_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES=1"],
            ("8.6", "bfloat16", "flash_attention_2"),
        ),
    ];
    for (env, (arch, dtype, attn)) in cases {
        let seen = start(&s, env);
        assert_eq!(
            seen.ok().hints(),
            (Some(arch), Some(dtype), Some(attn)),
            "{env:?}: {seen:?}"
        );
        assert_eq!(seen.get("CUDA_DEVICE_ORDER"), Some("PCI_BUS_ID"));
    }
    for env in [
        &[][..],
        &["NVIDIA_VISIBLE_DEVICES=none"],
        &["NVIDIA_VISIBLE_DEVICES=all", "GPUARCH_DISABLE=1"],
    ] {
        start(&s, env).ok().untouched();
    }
    let own = start(
        &s,
        &["NVIDIA_VISIBLE_DEVICES=0", "TORCH_CUDA_ARCH_LIST=9.0"],
    );
    assert_eq!(own.ok().get("TORCH_CUDA_ARCH_LIST"), Some("9.0"));
    assert_eq!(own.get("GPUARCH_DTYPE"), Some("float16"));
    if env_files {
        // The same env, in the file exec sessions read.
        assert!(
            own.env_file.contains("TORCH_CUDA_ARCH_LIST=9.0\n")
                && own.env_file.contains("GPUARCH_DTYPE=float16\n"),
            "{}",
            own.env_file
        );
    } else {
        // The env says it all: nothing had to run inside the container.
        assert!(own.env_file.is_empty(), "{}", own.env_file);
    }
}

#[test]
fn runc_behind_the_shim() {
    need_containers!("runc");
    matrix(false, |s, env| s.shim("runc", env));
}

#[test]
fn crun_behind_the_shim() {
    need_containers!("crun", "runc", "unshare");
    matrix(false, |s, env| s.shim("crun", env));
}

#[test]
fn podman_with_the_precreate_hook() {
    need_containers!("podman", "runc");
    matrix(false, |s, env| {
        let args: Vec<String> = env
            .iter()
            .flat_map(|e| ["-e".to_owned(), (*e).to_owned()])
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s.podman(&args)
    });
}

#[test]
fn podman_device_nodes_assign_gpus() {
    need_containers!("podman", "runc");
    let s = Scene::new();
    // Stand-in device nodes with the NVIDIA major and each GPU's minor.
    let dev = nvidia_nodes(&s.path().join("dev"), &[0, 1]);
    let d = |n: u64| {
        format!(
            "{}:/dev/nvidia{n}",
            dev.join(format!("nvidia{n}")).display()
        )
    };
    let one = s.podman(&["--device", &d(1)]);
    assert_eq!(
        one.ok().hints(),
        (Some("8.6"), Some("bfloat16"), Some("flash_attention_2"))
    );
    let both = s.podman(&["--device", &d(0), "--device", &d(1)]);
    assert_eq!(
        both.ok().hints(),
        (Some("7.5;8.6"), Some("float16"), Some("sdpa"))
    );
    // The 2080 Ti's node (minor 0) under the 3090's name: podman puts the
    // real number in the config, and that is the GPU.
    let renamed = format!("{}:/dev/nvidia1", dev.join("nvidia0").display());
    let seen = s.podman(&["--device", &renamed]);
    assert_eq!(
        seen.ok().hints(),
        (Some("7.5"), Some("float16"), Some("sdpa"))
    );
}

/// CDI, the path of Kubernetes DRA and the NVIDIA device plugin's CDI
/// modes: podman resolves `--device nvidia.com/gpu=N` from a CDI spec into
/// device nodes before the precreate hook sees the config, and the hook
/// finds the GPU by the node's minor number, which here differs from the
/// index the CDI name uses. podman 4.3 reads specs only from /etc/cdi and
/// /var/run/cdi: the spec goes to the latter under a name of this test's,
/// and is removed after; podman 5 (`GPUARCH_ENGINES=sid`) reads the
/// scene's own directory (`--cdi-spec-dir`).
#[test]
fn podman_cdi_devices_get_the_plan_of_the_gpu_the_spec_names() {
    need_containers!("podman", "runc");
    let mut s = Scene::new();
    // The 2080 Ti (index 0) at minor 3, the 3090 (index 1) at minor 2.
    let mut inv: Value =
        serde_json::from_slice(&std::fs::read(fixture("2080ti-3090")).unwrap()).unwrap();
    inv["devices"][0]["minor"] = json!(3);
    inv["devices"][1]["minor"] = json!(2);
    let inv_path = s.path().join("inventory.json");
    std::fs::write(&inv_path, inv.to_string()).unwrap();
    s.inventory = Some(inv_path);
    let dev = nvidia_nodes(&s.path().join("dev"), &[2, 3]);
    let node = |minor: u32| {
        json!({"path": format!("/dev/nvidia{minor}"),
               "hostPath": dev.join(format!("nvidia{minor}"))})
    };
    let spec = json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node(3)]}},
            {"name": "1", "containerEdits": {"deviceNodes": [node(2)]}},
        ],
    });
    struct Spec(PathBuf);
    impl Drop for Spec {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    // podman 5 (an engine root's) is told where the specs are.
    let cdi_dir = if gpuarch_tests::roots::engine_root().unwrap().is_some() {
        let d = s.path().join("cdi");
        s.cdi_dir = Some(d.clone());
        d
    } else {
        PathBuf::from("/var/run/cdi")
    };
    let cdi_dir = cdi_dir.as_path();
    std::fs::create_dir_all(cdi_dir).unwrap();
    let spec_file = Spec(cdi_dir.join(format!("gpuarch-test-{}.json", std::process::id())));
    std::fs::write(&spec_file.0, spec.to_string()).unwrap();

    let one = s.podman(&["--device", "nvidia.com/gpu=1"]);
    assert_eq!(
        one.ok().hints(),
        (Some("8.6"), Some("bfloat16"), Some("flash_attention_2")),
        "{}",
        s.take_log()
    );
    assert!(s.take_log().contains("NVIDIA GeForce RTX 3090"));
    let zero = s.podman(&["--device", "nvidia.com/gpu=0"]);
    assert_eq!(
        zero.ok().hints(),
        (Some("7.5"), Some("float16"), Some("sdpa"))
    );

    // Kubernetes DRA: NVIDIA's DRA driver writes one transient spec per
    // claim, kind k8s.gpu.nvidia.com/claim, devices named <claim>-gpu-<N>,
    // and, in its common edits, NVIDIA_VISIBLE_DEVICES=void (so the legacy
    // hook adds nothing). The container's GPU is its device node.
    let claim = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a";
    let dra = json!({
        "cdiVersion": "0.5.0",
        "kind": "k8s.gpu.nvidia.com/claim",
        "devices": [{"name": format!("{claim}-gpu-2"), "containerEdits": {"deviceNodes": [node(2)]}}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": dev.join("nvidiactl")}],
        },
    });
    nix::sys::stat::mknod(
        &dev.join("nvidiactl"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(195, 255),
    )
    .unwrap();
    let dra_file = Spec(cdi_dir.join(format!(
        "k8s.gpu.nvidia.com-claim_gpuarch-test-{}.json",
        std::process::id()
    )));
    std::fs::write(&dra_file.0, dra.to_string()).unwrap();
    let claimed = s.podman(&[
        "--device",
        &format!("k8s.gpu.nvidia.com/claim={claim}-gpu-2"),
    ]);
    assert_eq!(
        claimed.ok().hints(),
        (Some("8.6"), Some("bfloat16"), Some("flash_attention_2")),
        "{}",
        s.take_log()
    );
    assert_eq!(claimed.get("NVIDIA_VISIBLE_DEVICES"), Some("void"));
}

/// `runtime.env_files`: the shim writes the exec sessions' env files itself
/// when nothing will be mounted over them, and has gpuarch-hook's
/// createContainer stage write them after the mounts when a mount (here a
/// tmpfs on /run) would hide them. Either way the container sees them.
#[test]
fn env_files_are_written_by_the_shim_or_after_the_mounts() {
    need_containers!("runc");
    let mut s = Scene::new();
    s.config_yaml = "runtime:\n  env_files: true\n".into();
    for run_tmpfs in [false, true] {
        s.run_tmpfs = run_tmpfs;
        s.take_log();
        let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]);
        assert!(
            seen.ok().env_file.contains("TORCH_CUDA_ARCH_LIST=8.6\n"),
            "/run tmpfs {run_tmpfs}: {}",
            seen.env_file
        );
        let log = s.take_log();
        let by_hook = log.contains("createContainer hook added: runtime.env_files");
        assert_eq!(by_hook, run_tmpfs, "{log}");
        // Without the tmpfs, /run/gpuarch/env is in the shared rootfs now.
        let _ = std::fs::remove_dir_all(s.rootfs().join("run/gpuarch"));
        let _ = std::fs::remove_dir_all(s.rootfs().join("etc/profile.d"));
    }
}

/// Kernel packages are mounted read-only where they serve every GPU.
#[test]
fn kernel_packages_are_mounted_read_only() {
    need_containers!("runc");
    let mut s = Scene::new();
    let root = s.path().join("kernels");
    for (name, targets) in [
        ("demo", r#"["sm_75", "sm_86"]"#),
        ("hopper", r#"["sm_90a"]"#),
    ] {
        std::fs::create_dir_all(root.join(name)).unwrap();
        std::fs::write(
            root.join(name).join("manifest.json"),
            format!(r#"{{"package": "{name}", "targets": {targets}}}"#),
        )
        .unwrap();
    }
    s.config_yaml = format!("kernels:\n  mount_root: {}\n", root.display());
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=0,1"]);
    seen.ok();
    // Cubins only, and no env files asked for: nothing ran inside.
    assert!(seen.env_file.is_empty(), "{}", seen.env_file);
    assert_eq!(
        seen.get("GPUARCH_KERNELS_DIR"),
        Some("/opt/gpuarch/kernels")
    );
    assert!(seen.kernels.starts_with("demo\n"), "{}", seen.kernels);
    assert!(
        seen.kernels.contains(r#""package": "demo""#),
        "{}",
        seen.kernels
    );
    assert!(!seen.kernels.contains("hopper"), "{}", seen.kernels);
    assert!(!seen.kernels.contains("WRITABLE"), "{}", seen.kernels);
    assert!(!root.join("demo/x").exists());
}

/// A rootfs whose /run and /opt/gpuarch point at host directories: every
/// write and mount lands inside the rootfs, and the host stays as it was.
#[test]
fn a_hostile_rootfs_cannot_reach_the_host() {
    need_containers!("runc", "podman");
    let mut s = Scene::new();
    let host_run = s.path().join("host-run");
    let host_opt = s.path().join("host-opt");
    std::fs::create_dir_all(&host_run).unwrap();
    std::fs::create_dir_all(&host_opt).unwrap();
    let rootfs = s.rootfs();
    std::fs::remove_dir(rootfs.join("run")).unwrap();
    symlink(&host_run, rootfs.join("run")).unwrap();
    symlink(&host_opt, rootfs.join("opt/gpuarch")).unwrap();
    let pkgs = s.path().join("kernels");
    std::fs::create_dir_all(pkgs.join("demo")).unwrap();
    std::fs::write(
        pkgs.join("demo/manifest.json"),
        r#"{"targets": ["sm_75", "sm_86"]}"#,
    )
    .unwrap();
    s.config_yaml = format!("kernels:\n  mount_root: {}\n", pkgs.display());

    let host_empty = || {
        for d in [&host_run, &host_opt] {
            let left: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            assert!(left.is_empty(), "written on the host: {left:?}");
        }
    };
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=0,1"]);
    assert_eq!(seen.ok().hints().0, Some("7.5;8.6"));
    assert!(seen.kernels.contains("\"targets\""), "{seen:?}");
    host_empty();
    let seen = s.podman(&["-e", "NVIDIA_VISIBLE_DEVICES=1"]);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    host_empty();
}

/// The container's loader variables never reach the hook or what it runs.
#[test]
fn the_containers_ld_preload_never_runs_on_the_host() {
    need_containers!("runc", "podman", "gcc");
    let s = Scene::new();
    let marker = s.path().join("preload-ran");
    let src = s.path().join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <fcntl.h>\n__attribute__((constructor)) static void evil(void) {{ open(\"{}\", O_CREAT | O_WRONLY, 0644); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let lib = s.path().join("evil.so");
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // The library works: a host program with it preloaded leaves the marker.
    Command::new("true")
        .env("LD_PRELOAD", &lib)
        .status()
        .unwrap();
    assert!(marker.exists(), "the test's preload library does not run");
    std::fs::remove_file(&marker).unwrap();

    let preload = format!("LD_PRELOAD={}", lib.display());
    let libpath = format!("LD_LIBRARY_PATH={}", s.path().display());
    let env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        preload.as_str(),
        libpath.as_str(),
    ];
    let seen = s.shim("runc", &env);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    let args: Vec<&str> = env.iter().flat_map(|e| ["-e", e]).collect();
    let seen = s.podman(&args);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    assert!(
        !marker.exists(),
        "the container's LD_PRELOAD ran on the host"
    );
}

/// Broken input in each mode: the container starts unchanged; with strict
/// it does not start, and the reason is one line on stderr.
#[test]
fn failures_are_open_by_default_and_closed_with_strict() {
    need_containers!("runc", "crun", "podman", "unshare");
    let mut s = Scene::new();
    let bad = s.path().join("bad-inventory.json");
    std::fs::write(&bad, "{\"schema\": 1, \"devices\": [").unwrap();
    s.inventory = Some(bad);
    let gpu = ["NVIDIA_VISIBLE_DEVICES=0"];
    type Start<'a> = &'a dyn Fn(&Scene) -> Seen;
    let starts: [(&str, Start); 3] = [
        ("runc", &|s| s.shim("runc", &gpu)),
        ("crun", &|s| s.shim("crun", &gpu)),
        ("podman", &|s| s.podman(&["-e", gpu[0]])),
    ];
    for (name, start) in starts {
        s.config_yaml = String::new();
        s.take_log();
        let seen = start(&s);
        seen.ok().untouched();
        // The reason is in gpuarch's log, and not in the container's output.
        let log = s.take_log();
        assert!(log.contains("bad-inventory.json"), "{name}: {log}");
        assert!(
            log.contains("the container starts unchanged"),
            "{name}: {log}"
        );
        assert!(
            !seen.stderr().contains("gpuarch"),
            "{name}: {}",
            seen.stderr()
        );
        s.config_yaml = "strict: true\n".into();
        let seen = start(&s);
        assert!(
            !seen.out.status.success(),
            "{name}: strict start succeeded: {seen:?}"
        );
        if name == "podman" {
            // podman drops a failing precreate hook's stderr and names the
            // hook; the reason is in the journal (journalctl -t gpuarch-hook).
            assert!(
                seen.stderr().contains("gpuarch-hook precreate"),
                "{}",
                seen.stderr()
            );
        } else {
            assert!(
                seen.stderr().contains("strict: refusing"),
                "{name}: {}",
                seen.stderr()
            );
            assert!(
                seen.stderr().contains("bad-inventory.json"),
                "{name}: {}",
                seen.stderr()
            );
        }
        assert!(seen.out.stdout.is_empty(), "{name}: the container ran");
    }
}

/// A container started through real runc.
type Start = fn(&Scene, &[&str]) -> Seen;

/// The two ways a container meets gpuarch under plain runc: behind the
/// shim, and with the createContainer hook alone.
fn runc_starts() -> [(&'static str, Start); 2] {
    [
        ("the shim", |s, env| s.shim("runc", env)),
        ("the createContainer hook", |s, env| {
            let hooks = json!({ "createContainer": s.hook_entry("create-container") });
            s.run_bundle("runc", &s.bundle_with("runc", env, Some(hooks)), false)
        }),
    ]
}

/// The image's `NVIDIA_REQUIRE_*` on each assigned GPU, through real runc
/// behind the shim and with the createContainer hook alone: a term the GPU
/// does not meet is a note naming the term and the GPU, and the container
/// starts with its Plan; with strict it does not start, and the reason is
/// the runtime's error. A device name that names no GPU here: likewise.
#[test]
fn unmet_requirements_are_noted_and_strict_refuses_them() {
    need_containers!("runc");
    let mut s = Scene::new();
    let unmet = [
        "NVIDIA_VISIBLE_DEVICES=0,1",
        "NVIDIA_REQUIRE_ARCH=arch>=8.0",
    ];
    let met = [
        "NVIDIA_VISIBLE_DEVICES=1",
        "NVIDIA_REQUIRE_ARCH=arch>=8.0 brand=tesla",
    ];
    let nowhere = ["NVIDIA_VISIBLE_DEVICES=1,7"];
    let starts = runc_starts();
    // The arch list the container got, in its env (the shim) or its env
    // file (the hook alone).
    let list = |seen: &Seen, want: &str| seen.ok().var("TORCH_CUDA_ARCH_LIST") == Some(want);
    let term = "arch>=8.0";
    let gpu0 = "is not met on GPU 0 (NVIDIA GeForce RTX 2080 Ti, 7.5)";
    for (how, start) in starts {
        s.config_yaml = String::new();
        s.take_log();
        let seen = start(&s, &unmet);
        assert!(list(&seen, "7.5;8.6"), "{how}: {seen:?}");
        let log = s.take_log();
        assert!(log.contains(gpu0) && log.contains(term), "{how}: {log}");
        assert!(!log.contains("is not met on GPU 1"), "{how}: {log}");
        let seen = start(&s, &nowhere);
        assert!(list(&seen, "8.6"), "{how}: {seen:?}");
        assert!(
            s.take_log().contains("NVIDIA_VISIBLE_DEVICES entry"),
            "{how}"
        );

        s.config_yaml = "strict: true\n".into();
        for (env, why) in [
            (&unmet[..], gpu0),
            (&nowhere[..], "NVIDIA_VISIBLE_DEVICES entry"),
        ] {
            let seen = start(&s, env);
            assert!(!seen.out.status.success(), "{how}: strict started {env:?}");
            let err = seen.stderr();
            assert!(
                err.contains("strict: refusing") && err.contains(why),
                "{how}: {err}"
            );
            assert!(seen.out.stdout.is_empty(), "{how}: the container ran");
        }
        // Met on the GPU (the second alternative is never needed): strict
        // starts it.
        let seen = start(&s, &met);
        assert!(list(&seen, "8.6"), "{how}: {seen:?}");
        assert!(
            s.take_log()
                .contains("the image's requirements (NVIDIA_REQUIRE_ARCH) are met"),
            "{how}"
        );
    }
}

/// The image's own consumers, from real dist-info in its rootfs
/// (tests/fixtures/images), shape the Plan through real runc, behind the
/// shim and with the createContainer hook alone: an image with xformers and
/// no DeepSpeed gets 9.0a on the H100; with DeepSpeed beside it, 9.0 and
/// the note why; an image with DeepSpeed on the 2080 Ti gets the ops that
/// cannot run there switched off; an image without DeepSpeed, none of that.
#[test]
fn the_images_own_consumers_shape_the_plan() {
    need_containers!("runc");
    let mut s = Scene::new();
    let starts = runc_starts();
    // A variable as the container has it: in its env (the shim) or its
    // env file (the hook alone).
    let var = |seen: &Seen, k: &str| seen.ok().var(k).map(str::to_owned);
    let put = |s: &Scene, image: &str| {
        let o = Command::new("cp")
            .arg("-a")
            .arg(image_fixture(image).join("."))
            .arg(s.rootfs())
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
    };
    let root = s.rootfs();
    let xformers_env = root.join("usr/local/lib/python3.12");
    let deepspeed_env = root.join("opt/conda");
    let h100 = ["NVIDIA_VISIBLE_DEVICES=1"];
    let turing = ["NVIDIA_VISIBLE_DEVICES=0"];
    for (how, start) in starts {
        let _ = std::fs::remove_dir_all(&xformers_env);
        let _ = std::fs::remove_dir_all(&deepspeed_env);
        s.inventory = Some(fixture("a100-h100"));
        s.take_log();
        // No Python environment in the image: the list every torch takes.
        let seen = start(&s, &h100);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0"),
            "{how}"
        );
        let log = s.take_log();
        assert!(
            log.contains(
                "the image's consumers: none of gpuarch's consumers (no Python environment)"
            ),
            "{how}: {log}"
        );

        put(&s, "xformers");
        let seen = start(&s, &h100);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}: {}",
            std::fs::read_to_string(s.log_file()).unwrap_or_default()
        );
        let log = s.take_log();
        assert!(
            log.contains(
                "the image's consumers: torch 2.9.1, xformers 0.0.34, read from /usr/local/lib/python3.12/dist-packages"
            ),
            "{how}: {log}"
        );
        // A second start of the same image: the same Plan (from the cache).
        let again = start(&s, &h100);
        assert_eq!(
            var(&again, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}"
        );
        s.take_log();

        // DeepSpeed beside it: 9.0a breaks DeepSpeed, 9.0 traps xformers'
        // FlashAttention 3; unset, each builds its own, so it is not set.
        put(&s, "deepspeed");
        let seen = start(&s, &h100);
        assert_eq!(var(&seen, "TORCH_CUDA_ARCH_LIST"), None, "{how}");
        let log = s.take_log();
        assert!(
            log.contains("TORCH_CUDA_ARCH_LIST not set: DeepSpeed 0.19.8 in the image rejects 9.0a, and xformers 0.0.34 built with 9.0 would trap"),
            "{how}: {log}"
        );

        // DeepSpeed on a Turing card: the ops that need Ampere are off.
        s.inventory = Some(fixture("2080ti-3090"));
        let seen = start(&s, &turing);
        for op in [
            "DS_BUILD_FP_QUANTIZER",
            "DS_BUILD_CUTLASS_OPS",
            "DS_BUILD_RAGGED_DEVICE_OPS",
        ] {
            assert_eq!(var(&seen, op).as_deref(), Some("0"), "{how}: {op}");
        }
        assert_eq!(var(&seen, "DS_BUILD_TRANSFORMER_INFERENCE"), None, "{how}");
        // Without DeepSpeed in the image, none of its switches.
        std::fs::remove_dir_all(&deepspeed_env).unwrap();
        let seen = start(&s, &turing);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("7.5"),
            "{how}"
        );
        assert_eq!(var(&seen, "DS_BUILD_FP_QUANTIZER"), None, "{how}");
        s.take_log();

        // A venv outside every usual place, found only through the
        // process's PATH (as the H100 host's /opt/torch/.venv).
        std::fs::remove_dir_all(&xformers_env).unwrap();
        let venv = root.join("srv/model/.venv");
        let site = venv.join("lib/python3.12/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        let o = Command::new("cp")
            .arg("-a")
            .arg(image_fixture("xformers").join("usr/local/lib/python3.12/dist-packages/."))
            .arg(&site)
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        std::fs::write(venv.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(venv.join("bin/python3"), "").unwrap();
        s.inventory = Some(fixture("a100-h100"));
        let on_path = ["NVIDIA_VISIBLE_DEVICES=1", "PATH=/srv/model/.venv/bin:/bin"];
        let seen = start(&s, &on_path);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}"
        );
        let log = s.take_log();
        assert!(
            log.contains("torch 2.9.1, xformers 0.0.34, read from /srv/model/.venv/lib/python3.12/site-packages"),
            "{how}: {log}"
        );
        // Off PATH, nothing leads there: no Python environment is known.
        let seen = start(&s, &h100);
        assert_eq!(
            var(&seen, "TORCH_CUDA_ARCH_LIST").as_deref(),
            Some("9.0"),
            "{how}"
        );
        std::fs::remove_dir_all(root.join("srv")).unwrap();
        s.take_log();
    }
    // The cache held the images' reads, in the test's own directory.
    let cached = std::fs::read_dir(s.path().join("images")).unwrap().count();
    assert!(cached >= 2, "{cached} cache entries");
}

/// Every place real images keep Python, in one rootfs
/// (tests/fixtures/images/layouts, real METADATA): Debian's dist-packages
/// (torch), conda's base (xformers) and a named env (flashinfer-python),
/// uv's `/app/.venv` on PATH (DeepSpeed), root's `~/.local` (accelerate),
/// RHEL's `lib64` (flash-attn), and the `~/.local` of a user whose home
/// only `/etc/passwd` names (bitsandbytes). Through runc behind the shim,
/// runc with the createContainer hook, and podman's precreate hook, as
/// root and (podman) as that user: each environment is read, each
/// consumer named, and the Plan follows them: DeepSpeed, seen only in the
/// venv, beside xformers leaves the H100's torch list unset (9.0a breaks
/// the one, 9.0 traps the other), and flash-attn, seen only in lib64,
/// lets the FlashAttention-2 hint stand.
#[test]
fn every_real_python_layout_is_read() {
    need_containers!("runc");
    let mut s = Scene::new();
    s.inventory = Some(fixture("a100-h100"));
    let o = Command::new("cp")
        .arg("-a")
        .arg(image_fixture("layouts").join("."))
        .arg(s.rootfs())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        gpuarch_tests::layouts::ENV[0],
        gpuarch_tests::layouts::ENV[1],
    ];
    let check = |how: &str, seen: &Seen, log: &str, user_site: bool| {
        let var = |k: &str| seen.ok().var(k).map(str::to_owned);
        assert_eq!(var("TORCH_CUDA_ARCH_LIST"), None, "{how}");
        assert_eq!(
            var("FLASHINFER_CUDA_ARCH_LIST").as_deref(),
            Some("9.0a"),
            "{how}"
        );
        assert_eq!(
            var("GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
            Some("flash_attention_2"),
            "{how}"
        );
        gpuarch_tests::layouts::assert_read(how, log, user_site);
        assert!(
            log.contains(
                "TORCH_CUDA_ARCH_LIST not set: DeepSpeed 0.19.8 in the image rejects 9.0a"
            ),
            "{how}: {log}"
        );
    };
    for (how, start) in runc_starts() {
        s.take_log();
        let seen = start(&s, &env);
        check(how, &seen, &s.take_log(), false);
    }
    if let Some(why) = gpuarch_tests::cannot_run("to run podman", &["podman"]) {
        return gpuarch_tests::skip(&why);
    }
    let args: Vec<&str> = env.iter().flat_map(|e| ["-e", e]).collect();
    for (how, user) in [
        ("podman, root", None),
        ("podman, uid 1000", Some("1000:1000")),
    ] {
        let mut a = args.clone();
        if let Some(u) = user {
            a.extend(["--user", u]);
        }
        let seen = s.podman(&a);
        check(how, &seen, &s.take_log(), user.is_some());
    }
}

/// A hung NVML costs at most the budget: the container starts unchanged.
#[test]
fn a_hung_nvml_costs_at_most_the_budget() {
    need_containers!("runc");
    let mut s = Scene::new();
    s.inventory = None;
    // A snapshot that is not there, whatever the host's /run/gpuarch holds:
    // the shim must ask NVML.
    s.config_yaml = format!(
        "hook:\n  timeout_ms: 300\ndaemon:\n  snapshot: {}\n",
        s.path().join("no-inventory.json").display()
    );
    s.extra_env = vec![
        (
            "GPUARCH_NVML_LIB".into(),
            artifacts().fake_nvml.display().to_string(),
        ),
        (
            "FAKE_NVML_TOPOLOGY".into(),
            fixture("2080ti-3090").display().to_string(),
        ),
        ("FAKE_NVML_SLEEP".into(), "nvmlInit_v2=20000".into()),
    ];
    let t = std::time::Instant::now();
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=0"]);
    seen.ok().untouched();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    let log = s.take_log();
    assert!(log.contains("gave up after 300ms"), "{log}");
}

/// Package `fa2` under `root`, for sm_80 and up, holding one shared library
/// (`lib/libgpuarchdemo.so.1`, built with gcc in `scratch`).
fn library_package(root: &Path, scratch: &Path) {
    let lib = root.join("fa2/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        root.join("fa2/manifest.json"),
        r#"{"targets": ["sm_80"], "libraries": ["lib"]}"#,
    )
    .unwrap();
    shared_library(
        scratch,
        "int gpuarch_demo(void) { return 86; }\n",
        "libgpuarchdemo.so.1",
        &lib.join("libgpuarchdemo.so.1"),
    );
}

/// A real shared library at `out` with `soname`, built by gcc from `code`
/// (its source written in `scratch`).
fn shared_library(scratch: &Path, code: &str, soname: &str, out: &Path) {
    let src = scratch.join(format!("{soname}.c"));
    std::fs::write(&src, code).unwrap();
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(out)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
}

/// A package with shared libraries: the shim adds a createContainer entry,
/// which registers them with the container's loader (ldconfig) and writes
/// the env files while inside.
#[test]
fn mounted_libraries_reach_the_containers_loader_cache() {
    need_containers!("runc", "gcc");
    let mut s = Scene::new();
    let root = s.path().join("kernels");
    library_package(&root, s.path());
    s.config_yaml = format!("kernels:\n  mount_root: {}\n", root.display());

    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]);
    seen.ok();
    assert!(
        seen.ld_cache
            .contains("/opt/gpuarch/kernels/fa2/lib/libgpuarchdemo.so.1"),
        "loader cache: {:?}\nstderr: {}",
        seen.ld_cache,
        seen.stderr()
    );
    assert!(
        seen.env_file
            .contains("GPUARCH_KERNELS_DIR=/opt/gpuarch/kernels\n"),
        "{}",
        seen.env_file
    );
    let conf = std::fs::read_to_string(s.rootfs().join("etc/ld.so.conf.d/gpuarch.conf")).unwrap();
    assert_eq!(conf, "/opt/gpuarch/kernels/fa2/lib\n");
    // The 2080 Ti has no sm_80 build: not mounted, nothing to register.
    std::fs::remove_file(s.rootfs().join("etc/ld.so.cache")).unwrap();
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=0,1"]);
    assert!(seen.ok().ld_cache.is_empty(), "{}", seen.ld_cache);
}

/// An import made with `--ldconfig`, stored and published by gpuarch's own
/// code as gpuarchd does: its library reaches the loader cache of a
/// container its code runs on (sm_80 SASS on the 3090), from the read-only
/// view; a container with the 2080 Ti gets neither the package nor a cache
/// entry.
#[test]
fn an_imported_library_reaches_the_loader_cache_where_it_runs() {
    need_containers!("runc", "gcc", "objcopy");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    use gpuarch_kernels::{import, publish, store::Store, toolchain::Nvrtc};
    let nvrtc = Nvrtc::load(std::slice::from_ref(&cuda)).unwrap();
    let src = std::fs::read(workspace_root().join("kernels/packages/saxpy/saxpy.cu")).unwrap();
    let sm80 = nvrtc
        .compile(
            ("saxpy.cu", &src),
            &[],
            gpuarch_core::arch::Target::parse("sm_80").unwrap(),
            &[],
        )
        .unwrap()
        .code;
    let mut s = Scene::new();
    let lib = gpuarch_tests::fatlib::shared_library_with(
        s.path(),
        "libsaxpy80.so",
        &gpuarch_kernels::inspect::write_fatbin(&[(2, 80, &sm80)]),
    );
    let (root, cache) = (s.path().join("kernels"), s.path().join("cache"));
    let store = Store::open(&cache, 1 << 30).unwrap();
    let staged = import::stage(&store, std::fs::File::open(&lib).unwrap(), 1 << 30).unwrap();
    let (entry, _) = import::store_file(&store, "saxpy80", "libsaxpy80.so", staged).unwrap();
    let record = import::Record {
        name: "saxpy80".into(),
        ldconfig: true,
        keys: vec![entry.manifest.key.clone()],
        imported_at: 0,
    };
    import::commit(&store, &record).unwrap();
    publish::publish_import(&root, &record, &[entry]).unwrap();
    s.config_yaml = format!(
        "kernels:\n  mount_root: {}\n  cache_dir: {}\n  spool_dir: {}\n",
        root.display(),
        cache.display(),
        s.path().join("spool").display()
    );

    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]);
    seen.ok();
    assert!(
        seen.ld_cache
            .contains("/opt/gpuarch/kernels/saxpy80/libsaxpy80.so/libsaxpy80.so"),
        "loader cache: {:?}\nstderr: {}",
        seen.ld_cache,
        seen.stderr()
    );
    let conf = std::fs::read_to_string(s.rootfs().join("etc/ld.so.conf.d/gpuarch.conf")).unwrap();
    assert_eq!(conf, "/opt/gpuarch/kernels/saxpy80/libsaxpy80.so\n");
    std::fs::remove_file(s.rootfs().join("etc/ld.so.cache")).unwrap();
    s.take_log();
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=0"]);
    assert!(seen.ok().ld_cache.is_empty(), "{}", seen.ld_cache);
    let log = s.take_log();
    assert!(
        log.contains("kernel package saxpy80 not mounted: no imported file runs on all of"),
        "{log}"
    );
    assert!(
        std::fs::read_dir(s.path().join("spool")).map_or(true, |mut d| d.next().is_none()),
        "an import was requested as a build"
    );
}

/// Engines with neither precreate nor the shim run gpuarch-hook as a plain
/// OCI hook: the env can no longer change, so the Plan is written into the
/// container for shells, at createContainer (runc says "creating", crun
/// "created" with pid 0) or at prestart (through /proc/PID/root).
#[test]
fn the_in_container_stages_write_the_plan_for_shells() {
    need_containers!("runc", "crun", "unshare");
    // Before pivot_root, /proc/PID/root is the host's tree: these must not
    // appear on the host (they did once, and this test caught it).
    let host_files = ["/run/gpuarch/env", "/etc/profile.d/gpuarch.sh"];
    let before: Vec<bool> = host_files.iter().map(|f| Path::new(f).exists()).collect();
    let s = Scene::new();
    for runtime in ["runc", "crun"] {
        for (stage, key) in [
            ("create-container", "createContainer"),
            ("prestart", "prestart"),
        ] {
            let hooks = json!({ key: s.hook_entry(stage) });
            let env = ["NVIDIA_VISIBLE_DEVICES=0,1", "TORCH_CUDA_ARCH_LIST=9.0"];
            let b = s.bundle_with(runtime, &env, Some(hooks.clone()));
            let seen = s.run_bundle(runtime, &b, false);
            let what = format!("{runtime} {stage}");
            seen.ok();
            assert_eq!(seen.get("GPUARCH_DTYPE"), None, "{what}: env changed");
            for line in [
                "GPUARCH_DTYPE=float16\n",
                "GPUARCH_COMPUTE_CAPABILITIES=7.5,8.6\n",
                "TORCH_CUDA_ARCH_LIST=9.0\n",
            ] {
                assert!(seen.env_file.contains(line), "{what}: {}", seen.env_file);
            }
            let profile =
                std::fs::read_to_string(s.rootfs().join("etc/profile.d/gpuarch.sh")).unwrap();
            assert!(
                profile.contains("export GPUARCH_DTYPE='float16'"),
                "{profile}"
            );

            let b = s.bundle_with(runtime, &["PATH=/bin"], Some(hooks));
            s.run_bundle(runtime, &b, false).ok().untouched();
            let after: Vec<bool> = host_files.iter().map(|f| Path::new(f).exists()).collect();
            assert_eq!(before, after, "{what} wrote {host_files:?} on the host");
        }
    }
}

/// The image ships FIFOs at the names the hook's temporary files had (the
/// file's name, `.gpuarch-`, the hook's pid) for the next 4,000 pids. At
/// prestart the hook runs in the host's device cgroup, and a device node
/// there would have been written through to a host device; a FIFO makes
/// the old open block until the budget runs out. Now the temporary names
/// are unpredictable and created exclusively: the Plan is written and
/// every FIFO is left as it was.
#[test]
fn things_the_image_put_at_temporary_names_are_never_opened() {
    need_containers!("runc", "crun", "unshare");
    use nix::sys::stat::{Mode, SFlag, mknod};
    let s = Scene::new();
    let dirs = [("run/gpuarch", "env"), ("etc/profile.d", "gpuarch.sh")];
    for (d, _) in dirs {
        std::fs::create_dir_all(s.rootfs().join(d)).unwrap();
    }
    let next_pid: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let fifos: Vec<PathBuf> = (next_pid + 1..next_pid + 4000)
        .flat_map(|pid| dirs.map(|(d, f)| s.rootfs().join(d).join(format!(".{f}.gpuarch-{pid}"))))
        .collect();
    for f in &fifos {
        mknod(f, SFlag::S_IFIFO, Mode::from_bits_truncate(0o666), 0).unwrap();
    }
    for runtime in ["runc", "crun"] {
        for (stage, key) in [
            ("create-container", "createContainer"),
            ("prestart", "prestart"),
        ] {
            let what = format!("{runtime} {stage}");
            let profile = s.rootfs().join("etc/profile.d/gpuarch.sh");
            let _ = std::fs::remove_file(s.rootfs().join("run/gpuarch/env"));
            let _ = std::fs::remove_file(&profile);
            let hooks = json!({ key: s.hook_entry(stage) });
            let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=0,1"], Some(hooks));
            let seen = s.run_bundle(runtime, &b, false);
            seen.ok();
            assert!(
                seen.env_file.contains("GPUARCH_DTYPE=float16\n"),
                "{what}: {}",
                seen.env_file
            );
            let profile = std::fs::read_to_string(&profile).unwrap_or_default();
            assert!(
                profile.contains("export GPUARCH_DTYPE='float16'"),
                "{what}: the profile was not written: {profile:?}"
            );
        }
    }
    for f in &fifos {
        let t = std::fs::symlink_metadata(f).unwrap().file_type();
        assert!(
            std::os::unix::fs::FileTypeExt::is_fifo(&t),
            "{} replaced",
            f.display()
        );
    }
}

/// A scene whose kernel mount root (returned) holds two packages: `demo`
/// (sm_75 and sm_86, one cubin) and `fa2` (a library for ldconfig).
fn kernel_scene() -> (Scene, PathBuf) {
    let mut s = Scene::new();
    let root = s.path().join("kernels");
    std::fs::create_dir_all(root.join("demo/sm_86")).unwrap();
    std::fs::write(
        root.join("demo/manifest.json"),
        r#"{"package": "demo", "targets": ["sm_75", "sm_86"]}"#,
    )
    .unwrap();
    std::fs::write(root.join("demo/sm_86/demo.cubin"), b"cubin").unwrap();
    library_package(&root, s.path());
    s.config_yaml = format!("kernels:\n  mount_root: {}\n", root.display());
    (s, root)
}

/// Add to [`kernel_scene`] a package as gpuarchd publishes it: `saxpy`,
/// its one build (sm_86) an entry of the store at `cache/` in the scene,
/// and the config that serves it (views in `cache/views`).
fn with_published(s: &mut Scene, root: &Path) {
    let key = "ab".repeat(32);
    let build = s.path().join("cache/objects/ab").join(&key);
    std::fs::create_dir_all(&build).unwrap();
    std::fs::write(build.join("saxpy.cubin"), b"cubin 86").unwrap();
    std::fs::create_dir_all(root.join("saxpy")).unwrap();
    std::fs::write(
        root.join("saxpy/manifest.json"),
        json!({
            "schema": 2, "package": "saxpy", "version": "1", "description": "",
            "targets": ["sm_86"],
            "builds": [{"arch": "sm_86", "variant": "fp32", "dtype": "float32", "key": key,
                        "dir": build, "files": ["saxpy.cubin"], "toolkit": "nvrtc 13.0"}],
            "unavailable": [], "pending": []
        })
        .to_string(),
    )
    .unwrap();
    // The 3090 (8.6) runs sm_80 SASS: fa2 serves it too.
    s.config_yaml = format!(
        "kernels:\n  mount_root: {}\n  cache_dir: {}\n  spool_dir: {}\n",
        root.display(),
        s.path().join("cache").display(),
        s.path().join("spool").display()
    );
}

/// A published package (builds in a store) beside hand-made ones: the
/// container gets one read-only view of the kernel directory, and each
/// hand-made package bound on its empty directory in it, through the shim
/// (the config's mounts, made by runc and crun) and through the
/// createContainer hook alone (made by the hook). Nothing of it is
/// writable, the library still reaches the loader cache, and the host's
/// rootfs is untouched.
#[test]
fn published_and_hand_made_packages_share_one_view() {
    need_containers!("runc", "crun", "gcc", "unshare");
    let (mut s, root) = kernel_scene();
    with_published(&mut s, &root);
    let check = |how: &str, seen: &Seen| {
        seen.ok();
        assert_eq!(
            seen.kernel_mounts,
            [
                "/opt/gpuarch/kernels",
                "/opt/gpuarch/kernels/demo",
                "/opt/gpuarch/kernels/fa2"
            ],
            "{how}"
        );
        assert!(
            seen.kernels.starts_with("demo\nfa2\nsaxpy\n"),
            "{how}: {}",
            seen.kernels
        );
        for f in [
            "/opt/gpuarch/kernels/saxpy/sm_86/saxpy.cubin",
            "/opt/gpuarch/kernels/demo/sm_86/demo.cubin",
            "/opt/gpuarch/kernels/fa2/lib/libgpuarchdemo.so.1",
        ] {
            assert!(seen.files().contains(f), "{how}: {f}: {}", seen.kernels);
        }
        assert_eq!(
            seen.manifests()["saxpy"]["gpus"][0]["arch"],
            "sm_86",
            "{how}"
        );
        assert!(
            !seen.kernels.contains("WRITABLE"),
            "{how}: {}",
            seen.kernels
        );
        assert!(
            seen.kernel_mounts_writable.is_empty(),
            "{how}: {:?}",
            seen.kernel_mounts_writable
        );
        assert!(
            seen.ld_cache
                .contains("/opt/gpuarch/kernels/fa2/lib/libgpuarchdemo.so.1"),
            "{how}: loader cache {:?}\nstderr: {}",
            seen.ld_cache,
            seen.stderr()
        );
        // The mounts lived in the container's namespace only.
        assert!(
            !s.rootfs().join("opt/gpuarch/kernels/saxpy").exists(),
            "{how}"
        );
        assert!(!root.join("demo/x").exists(), "{how}: source written");
        let _ = std::fs::remove_file(s.rootfs().join("etc/ld.so.cache"));
    };
    for runtime in ["runc", "crun"] {
        check(
            &format!("{runtime} behind the shim"),
            &s.shim(runtime, &["NVIDIA_VISIBLE_DEVICES=1"]),
        );
        let hooks = json!({ "createContainer": s.hook_entry("create-container") });
        let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
        check(
            &format!("{runtime} with the createContainer hook alone"),
            &s.run_bundle(runtime, &b, false),
        );
    }
    // Both ways and both runtimes shared one view.
    let views: Vec<_> = std::fs::read_dir(s.path().join("cache/views"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(views.len(), 1, "{views:?}");
}

/// Another container sharing the volume at /opt swaps /opt/gpuarch with a
/// decoy in a `renameat2(RENAME_EXCHANGE)` loop while GPU containers start
/// with the createContainer hook. The hook once bound
/// the store, then looked the path up again to make the mount read-only;
/// the second lookup could land on the decoy, fail, and leave the store
/// mounted writable. Now each mount is read-only before it is attached to
/// the one handle resolved: whichever directory it lands on, nothing the
/// container sees of the store is writable and the source is unchanged.
#[test]
fn a_path_swapped_during_the_mounts_never_leaves_the_store_writable() {
    need_containers!("runc", "crun", "gcc", "unshare");
    let (mut s, root) = kernel_scene();
    // A published package too: its view holds hard links of the store's
    // files (the same inodes), so a writable mount of it would write the
    // store.
    with_published(&mut s, &root);
    let hooks = json!({ "createContainer": s.hook_entry("create-container") });
    // One start lays out the mount points; the decoy is a copy of them.
    let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks.clone()));
    s.run_bundle("runc", &b, false).ok();
    let (real, decoy) = (s.rootfs().join("opt/gpuarch"), s.rootfs().join("opt/decoy"));
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&real)
        .arg(&decoy)
        .status()
        .unwrap();
    assert!(cp.success());
    let sources = [root.clone(), s.path().join("cache")];
    let before: Vec<_> = sources.iter().map(|d| tree(d)).collect();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (a, b) = (
            std::ffi::CString::new(real.as_os_str().as_encoded_bytes()).unwrap(),
            std::ffi::CString::new(decoy.as_os_str().as_encoded_bytes()).unwrap(),
        );
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: two valid NUL-terminated paths.
                let r = unsafe {
                    libc::renameat2(
                        libc::AT_FDCWD,
                        a.as_ptr(),
                        libc::AT_FDCWD,
                        b.as_ptr(),
                        libc::RENAME_EXCHANGE,
                    )
                };
                swaps += u64::from(r == 0);
            }
            swaps
        })
    };
    let mut seen_kernels = 0;
    for i in 0..60 {
        let runtime = if i % 2 == 0 { "runc" } else { "crun" };
        let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks.clone()));
        let seen = s.run_bundle(runtime, &b, false);
        seen.ok();
        // The probe touches a file in every kernel directory it sees: a
        // writable mount of the store would have put it in the source.
        // (The decoy, swapped in at /opt/gpuarch, is the container's own
        // and may well be writable.)
        let after: Vec<_> = sources.iter().map(|d| tree(d)).collect();
        assert!(
            after == before,
            "start {i} ({runtime}) wrote into the store: {}",
            seen.kernels
        );
        seen_kernels += usize::from(
            seen.kernels.contains("demo.cubin") && seen.kernels.contains("saxpy.cubin"),
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 1000, "the swapper ran only {swaps} times");
    eprintln!(
        "60 starts under {swaps} swaps: {seen_kernels} saw the kernels, none wrote into the store"
    );
}

/// Every file under `dir` and its contents, to compare before and after.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let data = std::fs::read(&p).unwrap_or_default();
                out.push((p, data));
            }
        }
    }
    out.sort();
    out
}

/// The createContainer hook alone, as an engine that can change neither its
/// runtime nor run precreate would wire it (CRI-O's hooks_dir, or a config
/// written by hand): the hook itself bind-mounts the kernel packages
/// read-only from the container's mount namespace, registers their
/// libraries with ldconfig and writes the env file. A rootfs whose /opt
/// leads to a host directory gets nothing mounted there.
#[test]
fn the_create_container_hook_alone_mounts_kernels() {
    need_containers!("runc", "crun", "gcc", "unshare");
    let (s, root) = kernel_scene();

    for runtime in ["runc", "crun"] {
        let hooks = json!({ "createContainer": s.hook_entry("create-container") });
        let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
        let seen = s.run_bundle(runtime, &b, false);
        seen.ok();
        // The env was fixed before the hook ran; the file has the Plan.
        assert_eq!(seen.get("GPUARCH_KERNELS_DIR"), None, "{runtime}");
        assert!(
            seen.env_file
                .contains("GPUARCH_KERNELS_DIR=/opt/gpuarch/kernels\n"),
            "{runtime}: {}",
            seen.env_file
        );
        assert!(
            seen.kernels.starts_with("demo\nfa2\n"),
            "{runtime}: {}",
            seen.kernels
        );
        assert!(
            seen.kernels
                .contains("/opt/gpuarch/kernels/demo/sm_86/demo.cubin"),
            "{runtime}: {}",
            seen.kernels
        );
        assert!(
            !seen.kernels.contains("WRITABLE"),
            "{runtime}: {}",
            seen.kernels
        );
        assert!(
            seen.ld_cache
                .contains("/opt/gpuarch/kernels/fa2/lib/libgpuarchdemo.so.1"),
            "{runtime}: loader cache {:?}\nstderr: {}",
            seen.ld_cache,
            seen.stderr()
        );
        // The mounts lived in the container's namespace only.
        let point = s.rootfs().join("opt/gpuarch/kernels/demo");
        assert_eq!(std::fs::read_dir(&point).unwrap().count(), 0, "{runtime}");
        assert!(!root.join("demo/x").exists(), "{runtime}: source written");
        std::fs::remove_file(s.rootfs().join("etc/ld.so.cache")).unwrap();
    }

    // /opt pointing at a host directory: resolved inside the rootfs, where it
    // leads nowhere, so nothing is mounted, the host dir stays empty and the
    // container starts (fail open) without its env file.
    std::fs::remove_dir_all(s.rootfs().join("opt")).unwrap();
    let host_opt = s.path().join("host-opt");
    std::fs::create_dir_all(&host_opt).unwrap();
    symlink(&host_opt, s.rootfs().join("opt")).unwrap();
    let hooks = json!({ "createContainer": s.hook_entry("create-container") });
    let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
    let seen = s.run_bundle("runc", &b, false);
    seen.ok();
    assert!(!seen.kernels.contains("demo"), "{}", seen.kernels);
    assert!(seen.env_file.is_empty(), "{}", seen.env_file);
    assert_eq!(
        std::fs::read_dir(&host_opt).unwrap().count(),
        0,
        "host written"
    );
}

/// A rootfs whose /etc points at a host path that the rootfs lacks: the
/// stage refuses to write there. Fail open starts the container; strict
/// fails it, with the reason in the runtime's error.
#[test]
fn a_stage_that_cannot_write_safely_fails_open_or_strict() {
    need_containers!("runc");
    let mut s = Scene::new();
    let host_etc = s.path().join("host-etc");
    std::fs::create_dir_all(&host_etc).unwrap();
    let rootfs = s.rootfs();
    std::fs::remove_dir(rootfs.join("etc")).unwrap();
    symlink(&host_etc, rootfs.join("etc")).unwrap();
    let env = ["NVIDIA_VISIBLE_DEVICES=1"];

    let hooks = json!({ "createContainer": s.hook_entry("create-container") });
    let b = s.bundle_with("runc", &env, Some(hooks));
    let seen = s.run_bundle("runc", &b, false);
    seen.ok();
    assert!(
        seen.env_file.contains("GPUARCH_DTYPE=bfloat16\n"),
        "{seen:?}"
    );

    s.config_yaml = "strict: true\n".into();
    let hooks = json!({ "createContainer": s.hook_entry("create-container") });
    let b = s.bundle_with("runc", &env, Some(hooks));
    let seen = s.run_bundle("runc", &b, false);
    assert!(!seen.out.status.success(), "{seen:?}");
    let err = seen.stderr();
    assert!(err.contains("strict: refusing"), "{err}");
    assert!(err.contains("/etc"), "{err}");
    assert_eq!(
        std::fs::read_dir(&host_etc).unwrap().count(),
        0,
        "host written"
    );
}

/// gpuarchd pre-warms the sample packages on the 2080 Ti + 3090 with real
/// NVRTC; a container on GPU 1 then sees only the sm_86 builds, read-only,
/// and one on both GPUs sees both, with a manifest mapping each GPU to its
/// file and variant. A request the hook leaves in the spool gets built.
#[test]
fn the_daemon_prewarms_and_each_container_gets_the_builds_for_its_gpus() {
    need_containers!("runc", "podman", "dbus-daemon");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    use gpuarch_tests::daemon::{Node, Policy, kernels_yaml};
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let pkgs = workspace_root().join("kernels/packages");
    let yaml = kernels_yaml(node.path("").as_path(), &[&pkgs], Some(&cuda));
    std::fs::write(node.path("config.yaml"), &yaml).unwrap();
    node.start(&[]);
    let published = |pkg: &str, arch: &str| {
        std::fs::read_to_string(node.path("kernels").join(pkg).join("manifest.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|m| m["targets"].as_array().unwrap().iter().any(|t| t == arch))
    };
    let t0 = std::time::Instant::now();
    while !["saxpy", "rmsnorm", "rotary"]
        .iter()
        .all(|p| published(p, "sm_75") && published(p, "sm_86"))
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(120),
            "no pre-warm: {}",
            node.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let listed = node.ctl(None, &["kernels"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(text.contains("6 builds"), "{text}");
    assert!(text.contains("rmsnorm    sm_75    fp16"), "{text}");
    assert!(text.contains("rmsnorm    sm_86    bf16"), "{text}");

    let mut s = Scene::new();
    s.config_yaml = yaml.clone();
    // GPU 1 (the 3090): sm_86 builds only.
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]);
    seen.ok();
    assert_eq!(
        seen.get("GPUARCH_KERNELS_DIR"),
        Some("/opt/gpuarch/kernels")
    );
    let files = seen.files();
    assert!(!files.contains("sm_75"), "{files}");
    for f in [
        "/opt/gpuarch/kernels/rmsnorm/sm_86/rmsnorm.cubin",
        "/opt/gpuarch/kernels/rotary/sm_86/rotary.cubin",
        "/opt/gpuarch/kernels/saxpy/sm_86/saxpy.cubin",
        "/opt/gpuarch/kernels/saxpy/sm_86/saxpy.ptx",
    ] {
        assert!(files.contains(f), "{f} missing: {files}");
    }
    assert!(!seen.kernels.contains("WRITABLE"), "{}", seen.kernels);
    // Three packages, one mount: the container's view, read-only.
    assert_eq!(seen.kernel_mounts, ["/opt/gpuarch/kernels"]);
    assert!(seen.kernel_mounts_writable.is_empty());
    let m = seen.manifests();
    let gpu = &m["rmsnorm"]["gpus"][0];
    assert_eq!(gpu["index"], 0);
    assert_eq!(gpu["host_index"], 1);
    assert_eq!(gpu["arch"], "sm_86");
    assert_eq!(gpu["variant"], "bf16");
    assert_eq!(gpu["files"][0], "sm_86/rmsnorm.cubin");
    assert!(gpu["uuid"].as_str().unwrap().starts_with("GPU-"));

    // Both GPUs, through podman's precreate hook: both builds, mapped.
    let seen = s.podman(&["-e", "NVIDIA_VISIBLE_DEVICES=0,1"]);
    seen.ok();
    let files = seen.files();
    assert!(
        files.contains("/opt/gpuarch/kernels/rmsnorm/sm_75/rmsnorm.cubin"),
        "{files}"
    );
    assert!(
        files.contains("/opt/gpuarch/kernels/rmsnorm/sm_86/rmsnorm.cubin"),
        "{files}"
    );
    assert!(!seen.kernels.contains("WRITABLE"), "{}", seen.kernels);
    assert_eq!(seen.kernel_mounts, ["/opt/gpuarch/kernels"]);
    let m = seen.manifests();
    let gpus = m["rmsnorm"]["gpus"].as_array().unwrap();
    assert_eq!(
        (gpus[0]["arch"].as_str(), gpus[0]["variant"].as_str()),
        (Some("sm_75"), Some("fp16"))
    );
    assert_eq!(
        (gpus[1]["arch"].as_str(), gpus[1]["variant"].as_str()),
        (Some("sm_86"), Some("bf16"))
    );
    assert_ne!(gpus[0]["uuid"], gpus[1]["uuid"]);
    let r = &m["rotary"]["gpus"];
    assert_eq!(r[0]["dtype"], "float16");
    assert_eq!(r[1]["dtype"], "bfloat16");

    // A request in the spool (as the hook leaves on a miss) gets built.
    std::fs::write(node.path("spool/saxpy@sm_89"), "").unwrap();
    let t0 = std::time::Instant::now();
    while !published("saxpy", "sm_89") {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "request not built: {}",
            node.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!node.path("spool/saxpy@sm_89").exists());
    node.stop();
}

/// The paths the hook writes or mounts in a rootfs.
const WRITTEN: [&str; 5] = [
    "opt",
    "opt/gpuarch",
    "run",
    "etc/profile.d",
    "etc/ld.so.conf.d",
];

/// A host directory holding one canary file; `check` asserts it holds
/// exactly that, unchanged.
fn host_dir(s: &Scene, name: &str) -> PathBuf {
    let d = s.path().join(format!("host-{}", name.replace('/', "-")));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("canary"), "host\n").unwrap();
    d
}

fn check(d: &Path) {
    let extra = host_extra(d);
    assert!(extra.is_empty(), "written on the host: {extra:?}");
    assert_eq!(std::fs::read_to_string(d.join("canary")).unwrap(), "host\n");
}

/// Each path the hook writes or mounts (/opt, /opt/gpuarch, /run,
/// /etc/profile.d, /etc/ld.so.conf.d) a symlink to a host directory: the
/// container starts, through the shim and with the createContainer hook
/// alone, and the host directory is as it was.
#[test]
fn each_path_the_hook_writes_may_lead_to_the_host() {
    need_containers!("runc", "gcc");
    for p in WRITTEN {
        let (s, _) = kernel_scene();
        let host = host_dir(&s, p);
        let at = s.rootfs().join(p);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&at);
        symlink(&host, &at).unwrap();

        s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]).ok();
        check(&host);
        let hooks = json!({ "createContainer": s.hook_entry("create-container") });
        let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
        s.run_bundle("runc", &b, false).ok();
        check(&host);
    }
}

/// An image that points the loader's configuration at the host through
/// `/proc`: its `/etc/ld.so.conf` names host library directories as
/// `/proc/N/root/...` (N of the processes a hook may see at
/// createContainer), and its `/var/cache/ldconfig` is a link to a host
/// directory the same way. ldconfig follows whatever paths the image
/// names, so it must run where `/proc` leads nowhere: with runc, crun and
/// the shim, the container gets its loader cache (gpuarch's library is in
/// it) and the host directories hold exactly what they held, no soname
/// link, no aux-cache.
#[test]
fn the_images_loader_config_never_leads_ldconfig_to_the_host() {
    need_containers!("runc", "crun", "unshare", "gcc");
    let (s, _) = kernel_scene();
    let libs = host_dir(&s, "lib");
    // A real library whose soname differs from its file name: ldconfig
    // makes the soname link in every directory it scans.
    shared_library(
        s.path(),
        "int hostile(void) { return 1; }\n",
        "libhostile.so.1",
        &libs.join("libhostile.so.1.0"),
    );
    let aux = host_dir(&s, "aux");
    let conf: String = (1..=64)
        .map(|n| {
            format!(
                "/proc/{n}/root{}\n/proc/self/root{}\n",
                libs.display(),
                libs.display()
            )
        })
        .collect();
    std::fs::write(s.rootfs().join("etc/ld.so.conf"), conf).unwrap();
    std::fs::create_dir_all(s.rootfs().join("var/cache")).unwrap();
    symlink(
        format!("/proc/1/root{}", aux.display()),
        s.rootfs().join("var/cache/ldconfig"),
    )
    .unwrap();
    let before = (host_extra(&libs), host_extra(&aux));
    assert_eq!(before.0.len(), 1, "{before:?}");
    let check_libs = |what: &str| {
        let after = (host_extra(&libs), host_extra(&aux));
        assert_eq!(after, before, "{what}: written on the host");
    };
    let in_cache = |seen: &Seen, what: &str| {
        assert!(
            seen.ld_cache
                .contains("/opt/gpuarch/kernels/fa2/lib/libgpuarchdemo.so.1"),
            "{what}: loader cache {:?}\nstderr: {}\nlog: {}",
            seen.ld_cache,
            seen.stderr(),
            s.take_log()
        );
    };
    let seen = s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"]);
    in_cache(seen.ok(), "shim, runc");
    check_libs("shim, runc");
    for runtime in ["runc", "crun"] {
        let _ = std::fs::remove_file(s.rootfs().join("etc/ld.so.cache"));
        let hooks = json!({ "createContainer": s.hook_entry("create-container") });
        let b = s.bundle_with(runtime, &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
        let seen = s.run_bundle(runtime, &b, false);
        in_cache(seen.ok(), runtime);
        check_libs(runtime);
    }
}

/// Entries other than the canary under `d`: (path, is a directory).
fn host_extra(d: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    let mut todo = vec![d.to_owned()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p == d.join("canary") {
                continue;
            }
            let is_dir = e.file_type().unwrap().is_dir();
            if is_dir {
                todo.push(p.clone());
            }
            out.push((p, is_dir));
        }
    }
    out
}

/// runc before 1.1.14 creates a mount's missing destination directories by
/// path after checking them, so a swapped rootfs path makes it create empty
/// directories on the host (CVE-2024-45310).
fn runc_creates_through_swaps() -> Option<String> {
    let o = Command::new("runc").arg("--version").output().ok()?;
    let v = String::from_utf8_lossy(&o.stdout);
    let ver = v.lines().next()?.strip_prefix("runc version ")?.to_owned();
    let nums: Vec<u32> = ver
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    (nums.as_slice() < [1, 1, 14].as_slice()).then_some(ver)
}

/// The same paths (but /run, on which the bundle mounts a tmpfs) swapped
/// between a directory and a symlink to the host, thousands of times a
/// second, while containers start.
///
/// With the createContainer hook alone, gpuarch makes every write and mount
/// itself, through handles resolved in the rootfs: every container starts
/// and no host directory is touched. Through the shim, runc makes the
/// kernel mounts named in the config; it refuses a path that moved, and a
/// runc with CVE-2024-45310 creates the mount's empty directories through
/// the swapped path (the test says so and checks that nothing else, no
/// file of gpuarch's, reaches the host).
#[test]
fn paths_swapped_between_check_and_use_never_reach_the_host() {
    need_containers!("runc", "gcc");
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    let old_runc = runc_creates_through_swaps();
    for shim in [false, true] {
        let (s, _) = kernel_scene();
        let mut pairs = Vec::new();
        for p in ["opt/gpuarch", "etc/profile.d", "etc/ld.so.conf.d"] {
            let host = host_dir(&s, p);
            let at = s.rootfs().join(p);
            std::fs::create_dir_all(&at).unwrap();
            let other = s.rootfs().join(format!("{p}.swap"));
            symlink(&host, &other).unwrap();
            pairs.push((at, other, host));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let pairs: Vec<_> = pairs
                .iter()
                .map(|(a, b, _)| (a.clone(), b.clone()))
                .collect();
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (a, b) in &pairs {
                        renameat2(AT_FDCWD, a, AT_FDCWD, b, RenameFlags::RENAME_EXCHANGE).unwrap();
                        swaps += 1;
                    }
                }
                swaps
            })
        };
        let t0 = std::time::Instant::now();
        let mut started = 0;
        let runs = 8;
        for _ in 0..runs {
            let seen = if shim {
                s.shim("runc", &["NVIDIA_VISIBLE_DEVICES=1"])
            } else {
                let hooks = json!({ "createContainer": s.hook_entry("create-container") });
                let b = s.bundle_with("runc", &["NVIDIA_VISIBLE_DEVICES=1"], Some(hooks));
                s.run_bundle("runc", &b, false)
            };
            if seen.out.status.success() {
                started += 1;
            } else {
                let err = seen.stderr();
                assert!(shim, "the hook alone failed a start: {err}");
                assert!(err.contains("runc run failed"), "{err}");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        let how = if shim {
            "through the shim"
        } else {
            "with the createContainer hook"
        };
        eprintln!(
            "{how}: {started} of {runs} containers started during {swaps} swaps in {:?}",
            t0.elapsed()
        );
        assert!(swaps > 1000, "the paths were hardly swapped: {swaps}");
        for (_, _, host) in &pairs {
            let extra = host_extra(host);
            match (&old_runc, shim) {
                (Some(v), true) if extra.iter().all(|(_, dir)| *dir) => {
                    if !extra.is_empty() {
                        eprintln!("runc {v} (CVE-2024-45310) created on the host: {extra:?}");
                    }
                    assert_eq!(
                        std::fs::read_to_string(host.join("canary")).unwrap(),
                        "host\n"
                    );
                }
                _ => check(host),
            }
        }
        if !shim {
            assert_eq!(started, runs, "{how}");
        }
    }
}

/// What the JIT tests' containers run: their uid and cache variables, the
/// cache's mount (its root on the host filesystem and options), then a
/// "build" into `TORCH_EXTENSIONS_DIR` unless one is there, and symlinks
/// out of the cache for gpuarchd to meet later.
/// Under the createContainer hook alone the process's env is the engine's:
/// the cache's variables are in `/run/gpuarch/env`, read as an entrypoint
/// or exec session would.
const JIT_PROBE: &str = "J=/var/cache/gpuarch/jit; echo uid=$(id -u); \
     [ -z \"$TORCH_EXTENSIONS_DIR\" ] && [ -f /run/gpuarch/env ] && { set -a; . /run/gpuarch/env; set +a; }; \
     echo TEX=$TORCH_EXTENSIONS_DIR; echo CCP=$CUDA_CACHE_PATH; echo TRITON=$TRITON_CACHE_DIR; \
     awk -v j=$J '$5==j{print \"mount=\" $4 \" \" $6}' /proc/self/mountinfo; \
     [ -n \"$TORCH_EXTENSIONS_DIR\" ] || exit 0; \
     mkdir -p $TORCH_EXTENSIONS_DIR/ext || exit 3; \
     if [ -e $TORCH_EXTENSIONS_DIR/ext/ext.so ]; then echo ext=reused:$(cat $TORCH_EXTENSIONS_DIR/ext/ext.so); \
     else echo $MARK > $TORCH_EXTENSIONS_DIR/ext/ext.so && echo ext=built; fi; \
     ln -sfn / $J/escape; ln -sfn /etc/passwd $TORCH_EXTENSIONS_DIR/ext/pw.so; true";

/// A JIT bundle: `uid`, the CRI runtime's image annotation, a marker.
fn jit_bundle(
    s: &Scene,
    runtime: &str,
    uid: u32,
    image: &str,
    env: &[&str],
    hooks: Option<Value>,
) -> PathBuf {
    let b = s.bundle_with(runtime, env, hooks);
    let path = b.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    c["process"]["user"] = json!({"uid": uid, "gid": uid});
    c["annotations"] = json!({"io.kubernetes.cri.image-name": image});
    std::fs::write(&path, c.to_string()).unwrap();
    b
}

/// An image name with a newline in it and a 12 MiB env value full of
/// newlines (before, the first forged a log line, the second
/// became one 12 MiB line past `log.max_bytes`). Through the shim (runc)
/// and with the createContainer hook alone (runc, crun), every record the
/// hook and the shim write is one line of at most 4 KiB, and no line is
/// the one the image forged.
#[test]
fn what_a_container_says_never_forges_nor_floods_a_log_line() {
    need_containers!("runc", "crun", "unshare");
    let mut s = Scene::new();
    let jit = s.path().join("jit");
    s.config_yaml = format!("jit_cache:\n  enable: true\n  dir: {}\n", jit.display());
    let forged = "2026-01-01T00:00:00Z gpuarch-hook[1] info: FORGED";
    let image = format!("torch:2.7\n{forged}");
    let value = format!(
        "TORCH_CUDA_ARCH_LIST={}",
        format!("8.6\n{forged}\n").repeat((12 << 20) / (forged.len() + 5))
    );
    for (runtime, shim) in [("runc", true), ("runc", false), ("crun", false)] {
        let hooks = (!shim).then(|| json!({ "createContainer": s.hook_entry("create-container") }));
        let gpu = ["NVIDIA_VISIBLE_DEVICES=1", value.as_str()];
        let b = jit_bundle(&s, runtime, 0, &image, &gpu, hooks);
        // The 12 MiB variable is past what exec takes: the start may fail,
        // after gpuarch has logged.
        let _ = s.run_bundle(runtime, &b, shim);
        let log = s.take_log();
        assert!(
            log.contains("JIT cache"),
            "{runtime} shim={shim}: {}",
            &log[..log.len().min(2000)]
        );
        for line in log.lines() {
            assert!(
                !line.starts_with(forged),
                "{runtime} shim={shim}: a forged line: {line}"
            );
            assert!(
                line.len() <= 4096 + 128,
                "{runtime} shim={shim}: a line of {} bytes",
                line.len()
            );
        }
    }
}

/// Pods of two Kubernetes namespaces run one image as uid 0 (before,
/// under the default scope they mounted one read-write cache, so
/// one tenant could plant an extension the other loads; and a pod's own
/// `io.kubernetes.pod.namespace` overrode containerd's namespace). With
/// runc through the shim: two namespaces, two caches; a pod of team-b
/// claiming team-a in its own annotation gets team-b's.
#[test]
fn tenants_running_one_image_never_share_a_jit_cache() {
    need_containers!("runc");
    let mut s = Scene::new();
    let jit = s.path().join("jit");
    s.config_yaml = format!("jit_cache:\n  enable: true\n  dir: {}\n", jit.display());
    let start = |engine_ns: &str, claim: Option<&str>| {
        let b = jit_bundle(
            &s,
            "runc",
            0,
            "vllm:0.9",
            &["NVIDIA_VISIBLE_DEVICES=1"],
            None,
        );
        let path = b.join("config.json");
        let mut c: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        c["annotations"]["io.kubernetes.cri.sandbox-namespace"] = json!(engine_ns);
        if let Some(n) = claim {
            c["annotations"]["io.kubernetes.pod.namespace"] = json!(n);
        }
        std::fs::write(&path, c.to_string()).unwrap();
        s.run_bundle("runc", &b, true).ok();
        s.take_log()
    };
    let scopes = || {
        let mut v: Vec<String> = std::fs::read_dir(&jit)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        v.sort();
        v
    };
    start("team-a", None);
    assert_eq!(scopes().len(), 1, "{:?}", scopes());
    start("team-b", None);
    let two = scopes();
    assert_eq!(two.len(), 2, "{two:?}");
    let log = start("team-b", Some("team-a"));
    assert_eq!(scopes(), two, "a pod's claim chose another cache");
    assert!(log.contains("ignored for the JIT cache's scope"), "{log}");
    assert!(log.contains("namespace team-b, image vllm:0.9"), "{log}");
}

/// Per-arch JIT caches: containers on the same GPU with the same
/// uid and image share one, read-write, through runc, crun and the
/// createContainer hook alone; another arch, uid or image gets its own;
/// what a container leaves in its cache (symlinks out of it) neither
/// reaches the host nor misleads the next hook.
#[test]
fn jit_caches_are_shared_per_arch_uid_and_image_and_nothing_leaks() {
    need_containers!("runc", "crun", "unshare");
    let mut s = Scene::new();
    let jit = s.path().join("jit");
    s.config_yaml = format!("jit_cache:\n  enable: true\n  dir: {}\n", jit.display());
    s.probe = JIT_PROBE;
    let run = |s: &Scene, runtime: &str, uid: u32, image: &str, env: &[&str], hook_alone: bool| {
        let hooks =
            hook_alone.then(|| json!({ "createContainer": s.hook_entry("create-container") }));
        let mut e = vec![format!("MARK={runtime}-{uid}-{image}")];
        e.extend(env.iter().map(|s| s.to_string()));
        let e: Vec<&str> = e.iter().map(String::as_str).collect();
        let b = jit_bundle(s, runtime, uid, image, &e, hooks);
        let seen = s.run_bundle(runtime, &b, !hook_alone);
        seen.ok();
        seen
    };
    let gpu1 = ["NVIDIA_VISIBLE_DEVICES=1"];
    let first = run(&s, "runc", 1000, "torch:2.7", &gpu1, false);
    assert_eq!(first.get("uid"), Some("1000"));
    assert_eq!(first.get("ext"), Some("built"), "{first:?}");
    assert_eq!(
        first.get("TEX"),
        Some("/var/cache/gpuarch/jit/torch_extensions")
    );
    assert_eq!(
        first.get("CCP"),
        Some("/var/cache/gpuarch/jit/nv-compute-cache")
    );
    let mount = first.get("mount").expect("the cache is mounted");
    let (root, opts) = mount.split_once(' ').unwrap();
    assert!(root.ends_with("/sm_86"), "{mount}");
    let opts: Vec<&str> = opts.split(',').collect();
    for o in ["rw", "nosuid", "nodev"] {
        assert!(opts.contains(&o), "{o} not in {opts:?}");
    }
    // The same GPU, uid and image: crun and the createContainer hook alone
    // find what runc's container built.
    let again = run(&s, "crun", 1000, "torch:2.7", &gpu1, false);
    assert_eq!(again.get("ext"), Some("reused:runc-1000-torch:2.7"));
    let hooked = run(&s, "runc", 1000, "torch:2.7", &gpu1, true);
    assert_eq!(hooked.get("ext"), Some("reused:runc-1000-torch:2.7"));
    assert_eq!(hooked.get("mount"), Some(mount));
    // Another arch, uid, image or toolkit: a cache of its own.
    for (gpu, uid, image, extra) in [
        ("0", 1000, "torch:2.7", None),
        ("1", 1001, "torch:2.7", None),
        ("1", 1000, "evil:1", None),
        ("1", 1000, "torch:2.7", Some("CUDA_VERSION=12.8.1")),
    ] {
        let mut env = vec![format!("NVIDIA_VISIBLE_DEVICES={gpu}")];
        env.extend(extra.map(str::to_owned));
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let seen = run(&s, "runc", uid, image, &env, false);
        assert_eq!(
            seen.get("ext"),
            Some("built"),
            "{gpu} {uid} {image} {extra:?}: {seen:?}"
        );
        assert_ne!(seen.get("mount"), Some(mount));
    }
    // The container's own cache variable wins; the others still point in.
    let own = run(
        &s,
        "runc",
        1000,
        "torch:2.7",
        &["NVIDIA_VISIBLE_DEVICES=1", "TRITON_CACHE_DIR=/tmp/t"],
        false,
    );
    assert_eq!(own.get("TRITON"), Some("/tmp/t"));
    assert_eq!(own.get("ext"), Some("reused:runc-1000-torch:2.7"));
    // No image named (as under Docker and podman): no cache, and why.
    let b = s.bundle("runc", &gpu1);
    let none = s.run_bundle("runc", &b, true);
    none.ok();
    assert_eq!(none.get("TEX"), Some(""));
    assert!(none.get("mount").is_none());
    assert!(
        s.take_log()
            .contains("no JIT cache: jit_cache.scope is image, and the runtime names no image")
    );

    // The symlinks the containers left stay inside their caches: the host's
    // root is not the cache's, and each later start still got the real
    // directory.
    let mut escapes = 0;
    for scope in std::fs::read_dir(&jit).unwrap().flatten() {
        for c in std::fs::read_dir(scope.path()).unwrap().flatten() {
            if c.file_type().unwrap().is_dir() {
                let l = std::fs::symlink_metadata(c.path().join("escape")).unwrap();
                assert!(l.file_type().is_symlink());
                escapes += 1;
            }
        }
    }
    assert_eq!(escapes, 5, "one per cache");
    assert!(Path::new("/etc/passwd").is_file());
}

/// podman through the precreate hook: every line the hook logs for a GPU
/// container carries its id (read from podman's userdata mounts, since
/// precreate gets no OCI state), and `gpuarchctl why` shows what it got,
/// by the short id `podman ps` shows, after `podman rm` removed it. (Not
/// `--rm`: podman 5 then removes the `--cidfile` too.)
#[test]
fn podman_logs_name_the_container_and_why_shows_what_it_got() {
    need_containers!("podman");
    let s = Scene::new();
    let cidfile = s.path().join("cid");
    let name = format!("gpuarch-why-{}", std::process::id());
    let seen = s.podman(&[
        "--rm=false",
        "--name",
        &name,
        "--cidfile",
        cidfile.to_str().unwrap(),
        "-e",
        "NVIDIA_VISIBLE_DEVICES=1",
    ]);
    assert_eq!(seen.ok().hints().0, Some("8.6"));
    let id = std::fs::read_to_string(&cidfile).unwrap().trim().to_owned();
    assert_eq!(id.len(), 64, "{id}");
    let log = s.take_log();
    // By its name, asked of podman's Docker-compatible API (what
    // podman.socket serves), as gpuarchctl asks Docker's.
    let sock = s.path().join("podman.sock");
    let mut service = s
        .podman_global()
        .args(["system", "service", "--time", "0"])
        .arg(format!("unix://{}", sock.display()))
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !sock.exists() && t0.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = Command::new(&artifacts().gpuarchctl)
        .args(["why", &name])
        .env("GPUARCH_CONFIG", s.config_file(None))
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .output()
        .unwrap();
    let _ = service.kill();
    let _ = service.wait();
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with(&format!("container {id}\n")),
        "{o:?}"
    );
    // A rootful user's container that binds this one's userdata in (the
    // probe's record overwrite): it names two ids, so it gets no record,
    // and this container's stays (its 8.6 below, not the other's 7.5).
    let userdata = s
        .path()
        .join("podman/runroot/vfs-containers")
        .join(&id)
        .join("userdata");
    assert!(userdata.is_dir(), "{}", userdata.display());
    let bind = format!("{}:/mnt/victim:ro", userdata.display());
    let seen = s.podman(&["-e", "NVIDIA_VISIBLE_DEVICES=0", "-v", &bind]);
    assert_eq!(seen.ok().hints().0, Some("7.5"));
    let other_log = s.take_log();
    assert!(
        other_log.contains("assigned from") && !other_log.contains(&id),
        "{other_log}"
    );
    let rm = s.podman_global().args(["rm", &id]).output().unwrap();
    assert!(rm.status.success(), "podman rm: {rm:?}");
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.iter().any(|l| l.contains("assigned from")), "{log}");
    for l in &lines {
        assert!(
            l.contains(&format!("] info: container={id}: ")),
            "a line without the container's id: {l}"
        );
    }
    let why = |q: &str, json: bool| {
        let mut c = Command::new(&artifacts().gpuarchctl);
        if json {
            c.arg("--json");
        }
        c.args(["why", q])
            .env("GPUARCH_CONFIG", s.config_file(None))
            .output()
            .unwrap()
    };
    let o = why(&id[..12], false);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.starts_with(&format!("container {id}\n")), "{out}");
    assert!(out.contains("planned by gpuarch-hook precreate"), "{out}");
    assert!(
        out.contains("GPUs (from NVIDIA_VISIBLE_DEVICES, in CUDA order):"),
        "{out}"
    );
    assert!(out.contains("NVIDIA GeForce RTX 3090"), "{out}");
    assert!(out.contains("  TORCH_CUDA_ARCH_LIST=8.6\n"), "{out}");
    assert!(out.contains("notes:\n  - "), "{out}");
    let o = why(&id, true);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["id"], id.as_str());
    assert_eq!(r["plan"]["env"]["TORCH_CUDA_ARCH_LIST"], "8.6");
    // A container that asked for no GPU has no record; an unknown id neither.
    let cid2 = s.path().join("cid2");
    s.podman(&["--rm=false", "--cidfile", cid2.to_str().unwrap()])
        .ok();
    let other = std::fs::read_to_string(&cid2).unwrap();
    for q in [other.trim(), "0123456789ab"] {
        let o = why(q, false);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("no record of"),
            "{o:?}"
        );
    }
}

/// In the journal, the hook's lines carry the container in fields an admin
/// filters on, and in their text. The hook runs in a mount namespace whose
/// `/run/systemd/journal/socket` is this test's socket, and the test reads
/// the entries as journald would receive them (its native protocol).
#[test]
fn journal_entries_carry_the_container_in_fields() {
    need_containers!("unshare", "mount");
    use std::os::unix::net::UnixDatagram;
    let tmp = tempfile::tempdir().unwrap();
    let sock_dir = tmp.path().join("journal");
    std::fs::create_dir_all(&sock_dir).unwrap();
    let sock = UnixDatagram::bind(sock_dir.join("socket")).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let config = tmp.path().join("config.yaml");
    std::fs::write(
        &config,
        gpuarch_tests::private_hook_paths("strict: false\n", tmp.path()),
    )
    .unwrap();
    let id = "c6bc73e047ca83c62f6b452532e52500e5ca650a065941c61787496d7da994f6";
    let oci = json!({
        "ociVersion": "1.0.2",
        "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
        "annotations": {
            "io.kubernetes.cri.container-name": "trainer",
            "io.kubernetes.cri.sandbox-name": "trainer-0",
            "io.kubernetes.cri.sandbox-namespace": "ml"
        },
        "mounts": [
            {"destination": "/etc/hosts", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/hosts")},
            {"destination": "/run/.containerenv", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/.containerenv")}
        ]
    });
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && mount --bind {} /run/systemd/journal && exec {} precreate",
        sock_dir.display(),
        artifacts().gpuarch_hook.display()
    );
    let o = gpuarch_tests::output_with_stdin(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("GPUARCH_LOG", "journal")
            .env("GPUARCH_CONFIG", &config)
            .env("GPUARCH_INVENTORY", fixture("2080ti-3090")),
        oci.to_string().as_bytes(),
    );
    assert!(o.status.success(), "{o:?}");
    let mut entries = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    sock.set_nonblocking(true).unwrap();
    while let Ok(n) = sock.recv(&mut buf) {
        // tracing-journald first sends an empty datagram, to test the socket.
        if n > 0 {
            entries.push(journal_fields(&buf[..n]));
        }
    }
    let planned: Vec<_> = entries
        .iter()
        .filter(|e| {
            e.get("MESSAGE")
                .is_some_and(|m| m.contains("assigned from"))
        })
        .collect();
    assert_eq!(planned.len(), 1, "{entries:?}");
    let e = planned[0];
    assert_eq!(e["SYSLOG_IDENTIFIER"], "gpuarch-hook");
    assert_eq!(e["CONTAINER_ID"], id[..12]);
    assert_eq!(e["CONTAINER_ID_FULL"], id);
    assert_eq!(e["CONTAINER_NAME"], "trainer");
    assert_eq!(e["POD_NAME"], "trainer-0");
    assert_eq!(e["POD_NAMESPACE"], "ml");
    // Every entry carries the id in its fields, and in its text too (what
    // `journalctl -t gpuarch-hook` shows names the container).
    let head = format!("container={id} name=trainer pod=ml/trainer-0: ");
    for e in &entries {
        assert_eq!(
            e.get("CONTAINER_ID").map(String::as_str),
            Some(&id[..12]),
            "{e:?}"
        );
        assert!(e["MESSAGE"].starts_with(&head), "{e:?}");
    }
}

/// journald's native protocol: `KEY=value\n`, or `KEY\n`, a 64-bit
/// little-endian length, the value and `\n`.
fn journal_fields(mut b: &[u8]) -> std::collections::BTreeMap<String, String> {
    let mut m = std::collections::BTreeMap::new();
    while !b.is_empty() {
        let nl = b.iter().position(|&c| c == b'\n').unwrap_or(b.len());
        let line = &b[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            m.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            b = &b[(nl + 1).min(b.len())..];
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let rest = &b[nl + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            m.insert(key, String::from_utf8_lossy(&rest[8..8 + len]).into_owned());
            b = &rest[(8 + len + 1).min(rest.len())..];
        }
    }
    m
}
