//! JIT caches per arch, uid and image: shared where they may be, never
//! between tenants.

use super::*;

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
