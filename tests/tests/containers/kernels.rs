//! Kernel packages and libraries mounted read-only, reaching the
//! container's loader; the daemon's pre-warmed builds per GPU.

use super::*;

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
