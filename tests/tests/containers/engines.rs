//! runc, crun and podman: the Plan reaches the process, whichever way the
//! GPUs are named; fail-open and strict; the in-container stages.

use super::*;

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
