//! `io.gpuarch1.KernelCache` and its jobs: pre-warm, verify and gc through
//! gpuarchctl, a daemon killed mid-build, a full disk, builds shared
//! through a registry, and imported libraries served to containers.

use super::*;

/// gpuarchctl prewarm, kernels, verify, gc and inspect against gpuarchd
/// building the sample packages with real NVRTC; the privileged ones are
/// refused to nobody by the shipped bus policy.
#[test]
fn prewarm_verify_and_gc_through_gpuarchctl() {
    need_bus!();
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut node = Node::with_kernels(&cuda, "  prewarm: false\n");
    node.start(&[]);

    let o = node.ctl(Some(&[]), &["prewarm", "saxpy", "--arch", "8.6"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );

    let o = node.ctl(None, &["prewarm", "nosuch"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no kernel package named \"nosuch\""),
        "{}",
        all_text(&o)
    );

    let o = node.ctl(
        None,
        &["prewarm", "saxpy", "rmsnorm", "--arch", "7.5,sm_86"],
    );
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    for line in [
        "saxpy sm_75: built fp32",
        "saxpy sm_86: built fp32",
        "rmsnorm sm_75: built fp16",
        "rmsnorm sm_86: built bf16",
        "done: 4 of 4 served",
    ] {
        assert!(out.contains(line), "{line:?} not in {out}");
    }
    let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "8.6"]);
    assert!(
        all_text(&o).contains("saxpy sm_86: cached fp32"),
        "{}",
        all_text(&o)
    );

    let o = node.ctl(None, &["--json", "kernels"]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = doc["kernels"].as_array().unwrap();
    assert_eq!(list.len(), 4, "{doc}");
    assert!(
        list.iter()
            .all(|k| k["pinned"] == true && k["in_use"] == false)
    );
    let sm75 = list
        .iter()
        .find(|k| k["package"] == "saxpy" && k["arch"] == "sm_75")
        .unwrap();
    let cubin = Path::new(sm75["path"].as_str().unwrap()).join("saxpy.cubin");

    // inspect judges the stored cubin from its ELF header.
    let o = node.ctl(None, &["inspect", cubin.to_str().unwrap(), "--cap", "8.6"]);
    assert_eq!(o.status.code(), Some(1), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("sm_75 SASS (cubin): saxpy"),
        "{}",
        all_text(&o)
    );
    assert!(
        all_text(&o).contains("capability 8.6: will not run"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(
        None,
        &[
            "--offline",
            "--inventory",
            node.path("run/inventory.json").to_str().unwrap(),
            "inspect",
            cubin.to_str().unwrap(),
        ],
    );
    assert!(
        all_text(&o).contains("GPU 0 NVIDIA GeForce RTX 2080 Ti (7.5): runs from SASS sm_75"),
        "{}",
        all_text(&o)
    );

    // A flipped byte: verify finds it, quarantines it, and it is rebuilt.
    assert_eq!(node.ctl(Some(&[]), &["verify"]).status.code(), Some(2));
    let mut data = std::fs::read(&cubin).unwrap();
    data[100] ^= 0xff;
    std::fs::write(&cubin, &data).unwrap();
    let o = node.ctl(None, &["verify"]);
    if o.status.code() == Some(1) {
        assert!(
            all_text(&o).contains("4 builds checked, 1 corrupt"),
            "{}",
            all_text(&o)
        );
        assert!(
            all_text(&o).contains("saxpy.cubin: sha256"),
            "{}",
            all_text(&o)
        );
    } else {
        // gpuarchd re-publishes on any event of its package and spool
        // watchers, checking every entry it serves: that check may have
        // quarantined the entry before Verify came (seen once in CI, "3
        // builds checked, 0 corrupt"). Then the quarantine says why.
        assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
        let reasons: Vec<String> = std::fs::read_dir(node.path("cache/quarantine"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("reason.txt")).ok())
            .collect();
        assert!(
            reasons.iter().any(|r| r.contains("saxpy.cubin: sha256")),
            "verify said {} and the quarantine {reasons:?}",
            all_text(&o)
        );
        // Publishing does not rebuild what it quarantines; asking does.
        let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "7.5"]);
        assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    }
    let t0 = Instant::now();
    loop {
        let o = node.ctl(None, &["verify"]);
        if o.status.success() && all_text(&o).contains("4 builds checked, 0 corrupt") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not rebuilt: {}",
            all_text(&o)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read_dir(node.path("cache/quarantine"))
            .unwrap()
            .count(),
        1
    );

    let o = node.ctl(None, &["gc"]);
    assert!(all_text(&o).contains("freed 0 B"), "{}", all_text(&o));
    assert_eq!(node.ctl(Some(&[]), &["gc"]).status.code(), Some(2));

    // A store that cannot be read is an error, not an empty cache: a shard
    // that is a file breaks the scan.
    let shard = node.path("cache/objects/zz");
    std::fs::write(&shard, b"").unwrap();
    for args in [&["kernels"][..], &["verify"], &["--json", "kernels"]] {
        let o = node.ctl(None, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", all_text(&o));
        assert!(
            all_text(&o).contains("reading the kernel cache: Not a directory"),
            "{args:?}: {}",
            all_text(&o)
        );
        assert!(o.stdout.is_empty(), "{args:?}: {}", all_text(&o));
    }
    std::fs::remove_file(&shard).unwrap();
    let o = node.ctl(None, &["kernels"]);
    assert!(all_text(&o).contains("4 builds"), "{}", all_text(&o));
    // The compiler the builds came from, as gpuarchd loaded it.
    assert!(
        all_text(&o).contains(&format!("compiler: NVRTC 12.9 ({}", cuda.display())),
        "{}",
        all_text(&o)
    );

    // The cache's commands are gpuarchd's: --offline is refused, not
    // quietly sent to the daemon.
    for cmd in ["kernels", "verify", "gc", "prewarm"] {
        let o = node.ctl(None, &["--offline", cmd]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", all_text(&o));
        assert!(
            all_text(&o).contains("the kernel cache is gpuarchd's"),
            "{cmd}: {}",
            all_text(&o)
        );
    }
    node.stop();
}

/// The complete entries of the store under `cache`: `objects/xx/<key>`
/// directories that hold a manifest.
fn store_entries(cache: &Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    for shard in std::fs::read_dir(cache.join("objects"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for e in std::fs::read_dir(shard.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            v.push(e.path());
        }
    }
    v.sort();
    v
}

/// gpuarchd killed with SIGKILL in the middle of its start-up pre-warm: no
/// partial build is ever in the store, and the restarted daemon finishes the
/// job, with its index (ListKernels) matching the disk and every file
/// verifying.
#[test]
fn a_daemon_killed_during_prewarm_leaves_no_partial_build_and_finishes_on_restart() {
    need_bus!();
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut node = Node::with_kernels(&cuda, "  workers: 1\n");
    let cache = node.path("cache");
    node.start(&[]);
    // Kill as soon as the first build is in: the job is under way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while store_entries(&cache).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no build in 60 s:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut child = node.daemon.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let at_kill = store_entries(&cache);
    assert!(
        at_kill.len() < 6,
        "the pre-warm had already finished: {at_kill:?}"
    );
    for e in &at_kill {
        assert!(
            e.join("manifest.json").is_file(),
            "{} is in the store without its manifest",
            e.display()
        );
    }

    node.start(&[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let listed = loop {
        let o = node.ctl(None, &["--json", "kernels"]);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let n = doc["kernels"].as_array().map_or(0, Vec::len);
        if n == 6 {
            break doc;
        }
        assert!(
            Instant::now() < deadline,
            "{n} of 6 after restart:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut paths: Vec<std::path::PathBuf> = listed["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| std::path::PathBuf::from(k["path"].as_str().unwrap()))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        store_entries(&cache),
        "the index differs from the disk"
    );
    for e in &at_kill {
        assert!(
            paths.contains(e),
            "{} built before the kill was lost",
            e.display()
        );
    }
    let o = node.ctl(None, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "temp builds left: {leftovers:?}");
}

/// The cache on a filesystem too small for a build: the build fails with the
/// reason, nothing half-written is stored, the daemon goes on serving, and
/// once there is room the same request builds (a full disk is not recorded
/// as the compiler's refusal).
#[test]
fn a_full_cache_disk_fails_the_build_clearly_and_stores_nothing_corrupt() {
    need_bus!("mount");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut node = Node::with_kernels(&cuda, "  prewarm: false\n");
    let cache = node.path("cache");
    // Two pages: saxpy's cubin, PTX and manifest need three.
    let _unmount = gpuarch_tests::Tmpfs::mount(&cache, "size=8k,mode=0755");
    node.start(&[]);

    let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "8.6"]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("saxpy sm_86"), "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    // Which filesystem is full: the path is named (it was not).
    assert!(out.contains("/cache/tmp/"), "{out}");
    assert!(
        store_entries(&cache).is_empty(),
        "{:?}",
        store_entries(&cache)
    );
    // Still serving.
    let o = node.ctl(None, &["devices"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    assert!(all_text(&o).contains("RTX 3090"));

    let st = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&cache)
        .status()
        .unwrap();
    assert!(st.success(), "remount");
    let o = node.ctl(None, &["prewarm", "saxpy", "--arch", "8.6"]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("saxpy sm_86: built fp32"), "{out}");
    let o = node.ctl(None, &["verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    node.stop();
}

/// `kernels.remote` through gpuarchd: one node's daemon pre-warms and
/// pushes to a real registry (docker-registry on 127.0.0.1); a second
/// node's daemon, with its own store, pre-warms the same set and builds
/// nothing: every build is pulled, and says where from.
#[test]
fn a_second_node_prewarms_from_the_registry_with_no_build() {
    need_bus!("docker-registry");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let mut reg = gpuarch_tests::registry::Registry::start();
    let repo = format!("{}/gpuarch/kernels", reg.host());
    let remote = |push: bool, extra: &str| {
        format!(
            "  prewarm: false\n{extra}  remote:\n    repository: {repo}\n    plain_http: true\n    push: {push}\n    pull_timeout_ms: 2000\n"
        )
    };
    let count = |out: &str, what: &str| out.matches(what).count();
    let ctl = |node: &Node, args: &[&str]| {
        let o = node.ctl(None, args);
        (o.status.code(), all_text(&o))
    };

    // Node A pushes as it builds: 4 builds, 4 artifacts.
    let set = ["saxpy", "rmsnorm", "--arch", "7.5,8.6"];
    let mut a = Node::with_kernels(&cuda, &remote(true, ""));
    a.start(&[]);
    let (code, out) = ctl(&a, &[&["prewarm"][..], &set].concat());
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count(&out, ": built "), 4, "{out}");
    assert!(count(&a.log(), "pushed ") >= 4, "{}", a.log());
    // rotary for three archs, built without pushing, then pushed by hand.
    a.stop();
    std::fs::write(a.path("config.yaml"), {
        let mut y = std::fs::read_to_string(a.path("config.yaml")).unwrap();
        y = y.replace("    push: true\n", "    push: false\n");
        y
    })
    .unwrap();
    a.start(&[]);
    let (code, out) = ctl(&a, &["prewarm", "rotary", "--arch", "7.5,8.6,9.0"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count(&a.log(), "pushed "), 0, "{}", a.log());
    let (code, out) = ctl(&a, &["kernels", "push", "rotary"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        count(&out, &format!(": pushed to {repo}@sha256:")),
        3,
        "{out}"
    );
    assert!(out.contains("3 of 3 pushed"), "{out}");
    a.stop();

    // Node B fetches one without pinning it, then pre-warms from the
    // registry only: everything pulled or cached, nothing built.
    let mut b = Node::with_kernels(&cuda, &remote(false, ""));
    b.start(&[]);
    let (code, out) = ctl(&b, &["kernels", "pull", "saxpy", "--arch", "7.5"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("saxpy sm_75: pulled "), "{out}");
    let (_, list) = ctl(&b, &["--json", "kernels"]);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["kernels"][0]["pinned"], false, "{list}");
    let (code, out) = ctl(&b, &[&["prewarm", "--from-registry"][..], &set].concat());
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(count(&out, ": built "), 0, "node B built: {out}");
    assert_eq!(count(&out, ": pulled "), 3, "{out}");
    assert_eq!(count(&out, ": cached "), 1, "{out}");
    assert!(out.contains(&format!("from {repo}@sha256:")), "{out}");
    // What the registry lacks is not built by a pull: it fails and says so.
    let (code, out) = ctl(
        &b,
        &["prewarm", "--from-registry", "rotary", "--arch", "8.0"],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("not in the registry"), "{out}");
    assert_eq!(count(&out, ": built "), 0, "{out}");
    b.stop();

    // Node C pre-warms all nine while the registry goes away: what it
    // pulled before is kept, the rest is built here, and all is served.
    let mut c = Node::with_kernels(&cuda, &remote(false, "  workers: 1\n"));
    c.start(&[]);
    let job = c
        .ctl_cmd(
            None,
            &[
                "prewarm",
                "saxpy",
                "rmsnorm",
                "rotary",
                "--arch",
                "7.5,8.6,9.0",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !c.log().contains("pulled ") {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", c.log());
        std::thread::sleep(Duration::from_millis(2));
    }
    reg.stop();
    let o = job.wait_with_output().unwrap();
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let (pulled, built) = (count(&out, ": pulled "), count(&out, ": built "));
    assert!(
        pulled >= 1 && built >= 1,
        "pulled {pulled}, built {built}: {out}"
    );
    assert_eq!(pulled + built, 9, "{out}");
    eprintln!("registry stopped mid pre-warm: {pulled} pulled, {built} built here");
    assert!(c.log().contains("building here"), "{}", c.log());
    c.stop();
}

/// The view manifest of `package` a precreate config mounts, if it does.
fn view_manifest(config: &serde_json::Value, package: &str) -> Option<serde_json::Value> {
    let view = config["mounts"]
        .as_array()?
        .iter()
        .find(|m| m["destination"] == "/opt/gpuarch/kernels")?["source"]
        .as_str()?
        .to_owned();
    let text = std::fs::read(Path::new(&view).join(package).join("manifest.json")).ok()?;
    Some(serde_json::from_slice(&text).unwrap())
}

/// What serves each GPU of a view manifest: (arch, file) or the reason.
fn served(view: &serde_json::Value) -> Vec<String> {
    view["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| match g["files"].as_array() {
            Some(f) => format!("{} {}", g["arch"].as_str().unwrap(), f[0].as_str().unwrap()),
            None => g["missing"].as_str().unwrap().to_owned(),
        })
        .collect()
}

#[test]
fn imported_libraries_serve_each_container_by_the_code_they_carry() {
    need_bus!("gcc", "objcopy");
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    let nvrtc = gpuarch_kernels::toolchain::Nvrtc::load(std::slice::from_ref(&cuda)).unwrap();
    let src = std::fs::read(workspace_root().join("kernels/packages/saxpy/saxpy.cu")).unwrap();
    let code = |t: &str| {
        let t = gpuarch_core::arch::Target::parse(t).unwrap();
        nvrtc.compile(("saxpy.cu", &src), &[], t, &[]).unwrap().code
    };
    let (sm75, sm86, sm80, sm90) = (code("sm_75"), code("sm_86"), code("sm_80"), code("sm_90"));
    let fatbin = gpuarch_kernels::inspect::write_fatbin;
    let libs = tempfile::tempdir().unwrap();
    // nobody opens them too (and is refused by the bus, not the file).
    std::fs::set_permissions(
        libs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let lib = |name: &str, entries: &[(u16, u32, &[u8])]| {
        gpuarch_tests::fatlib::shared_library_with(libs.path(), name, &fatbin(entries))
    };
    let both = lib("libsaxpy.so", &[(2, 75, &sm75), (2, 86, &sm86)]);
    let only80 = lib("libsaxpy80.so", &[(2, 80, &sm80)]);
    let only90 = lib("libsaxpy90.so", &[(2, 90, &sm90)]);
    let plain = gpuarch_tests::fatlib::shared_library_with(libs.path(), "libplain.so", &[]);

    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let import = |args: &[&str]| {
        let mut a = vec!["kernels", "import"];
        a.extend_from_slice(args);
        let o = node.ctl(None, &a);
        (o.status.code(), all_text(&o))
    };
    let s = |p: &Path| p.to_str().unwrap().to_owned();

    // One library with sm_75 and sm_86 SASS: each GPU gets its own code.
    let (code, out) = import(&["saxpy", &s(&both)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("libsaxpy.so: carries sm_75, sm_86"), "{out}");
    assert!(out.contains("GPU 0 (7.5): runs from SASS sm_75"), "{out}");
    assert!(out.contains("GPU 1 (8.6): runs from SASS sm_86"), "{out}");
    let (cfg, log) = precreate(&node, "0,1");
    let view = view_manifest(&cfg, "saxpy").unwrap_or_else(|| panic!("not mounted: {log}"));
    assert_eq!(
        served(&view),
        [
            "sm_75 libsaxpy.so/libsaxpy.so",
            "sm_86 libsaxpy.so/libsaxpy.so"
        ]
    );
    // The file in the container is the imported one, byte for byte.
    let source = cfg["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/opt/gpuarch/kernels")
        .unwrap()["source"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        std::fs::read(Path::new(&source).join("saxpy/libsaxpy.so/libsaxpy.so")).unwrap(),
        std::fs::read(&both).unwrap()
    );
    // Nothing is asked of gpuarchd's builder for an import.
    assert!(
        std::fs::read_dir(node.path("spool")).map_or(true, |mut d| d.next().is_none()),
        "an import was requested as a build"
    );

    // sm_80 only, for the loader: the 3090 runs it, the 2080 Ti does not.
    let (code, out) = import(&["saxpy80", &s(&only80), "--ldconfig"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("GPU 0 (7.5): will not run"), "{out}");
    assert!(out.contains("GPU 1 (8.6): runs from SASS sm_80"), "{out}");
    assert!(!out.contains("warning"), "{out}");
    let (cfg, log) = precreate(&node, "1");
    let view = view_manifest(&cfg, "saxpy80").unwrap_or_else(|| panic!("not mounted: {log}"));
    assert_eq!(served(&view), ["sm_80 libsaxpy80.so/libsaxpy80.so"]);
    assert_eq!(view["libraries"], serde_json::json!(["libsaxpy80.so"]));
    // The loader cache needs the createContainer stage: it is added.
    let hooks = cfg["hooks"]["createContainer"].to_string();
    assert!(hooks.contains("gpuarch-hook"), "{hooks}");
    for visible in ["0", "0,1"] {
        let (cfg, log) = precreate(&node, visible);
        assert!(view_manifest(&cfg, "saxpy80").is_none(), "{visible}: {cfg}");
        assert!(
            log.contains("kernel package saxpy80 not mounted: no imported file runs on all of"),
            "{visible}: {log}"
        );
    }

    // Code for no GPU of this host: accepted, with a warning.
    let (code, out) = import(&["saxpy90", &s(&only90)]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("warning: it runs on none of this host's GPUs"),
        "{out}"
    );
    assert!(node.log().contains("runs on none of this host's GPUs"));

    // A failed import changes nothing: the earlier one is still served.
    let before = std::fs::read(node.path("kernels/saxpy/manifest.json")).unwrap();
    let (code, out) = import(&["saxpy", &s(&plain), &s(&both)]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("saxpy not imported, nothing changed: libplain.so: it carries no GPU code"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(node.path("kernels/saxpy/manifest.json")).unwrap(),
        before
    );
    let (cfg, _) = precreate(&node, "0");
    assert_eq!(
        served(&view_manifest(&cfg, "saxpy").unwrap()),
        ["sm_75 libsaxpy.so/libsaxpy.so"]
    );

    // Without kernels.remote there is nothing to push to or pull from.
    for args in [&["kernels", "push"][..], &["kernels", "pull"]] {
        let o = node.ctl(None, args);
        assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
        assert!(
            all_text(&o).contains("no registry: kernels.remote is not set"),
            "{}",
            all_text(&o)
        );
    }

    // Only root and group gpuarch import; a file name can't be passed twice.
    let o = node.ctl(Some(&[]), &["kernels", "import", "x", &s(&both)]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    let (code, out) = import(&["x", &s(&both), &s(&both)]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("given twice"), "{out}");

    // Unimport: new containers no longer get it, its file is unpinned and
    // stays in the cache for the LRU; the other imports are untouched.
    let o = node.ctl(Some(&[]), &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(None, &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("removed import saxpy80: 1 file(s) unpinned"),
        "{}",
        all_text(&o)
    );
    assert!(!node.path("kernels/saxpy80").exists());
    let (cfg, log) = precreate(&node, "1");
    assert!(view_manifest(&cfg, "saxpy80").is_none(), "{log}");
    assert!(view_manifest(&cfg, "saxpy").is_some(), "{log}");
    let listed: serde_json::Value =
        serde_json::from_slice(&node.ctl(None, &["--json", "kernels"]).stdout).unwrap();
    let pinned = |pkg: &str| -> Vec<bool> {
        listed["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["package"] == pkg)
            .map(|k| k["pinned"].as_bool().unwrap())
            .collect()
    };
    assert_eq!(pinned("saxpy80"), [false], "{listed}");
    assert_eq!(pinned("saxpy"), [true], "{listed}");
    let o = node.ctl(None, &["kernels", "unimport", "saxpy80"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no import named saxpy80 (imports: saxpy, saxpy90)"),
        "{}",
        all_text(&o)
    );
    node.stop();
}

/// `ImportLibrary` through the bus, as `gpuarchctl kernels import-wheel`:
/// the real flashinfer-cubin wheel imported, and a tree laid out for every
/// set of the host's GPUs a container could be given; refused to nobody,
/// and for what is not a wheel, changing nothing.
#[test]
fn a_consumers_wheel_is_imported_through_the_bus_and_laid_out_for_every_set_of_gpus() {
    need_bus!();
    let Some(wheel) = std::env::var_os("GPUARCH_FLASHINFER_CUBIN_WHEEL") else {
        gpuarch_tests::skip(
            "GPUARCH_FLASHINFER_CUBIN_WHEEL names no wheel (scripts/test downloads it)",
        );
        return;
    };
    let wheel = std::path::PathBuf::from(wheel);
    let mut node = Node::new("blackwell-mix", Policy::Shipped);
    node.start(&[]);
    let libs = node.path("cache/libraries/flashinfer-cubin");

    // Nobody: refused by the bus policy, before gpuarchd reads anything.
    let o = node.ctl(
        Some(&[]),
        &["kernels", "import-wheel", wheel.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );

    // Not a wheel, and not a file: refused, nothing made.
    let junk = node.path("junk.whl");
    std::fs::write(&junk, b"not a zip").unwrap();
    let o = node.ctl(None, &["kernels", "import-wheel", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("junk.whl not imported, nothing changed: junk.whl: not a wheel"),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(None, &["kernels", "import-wheel", "/dev/null"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("null: neither a wheel nor a directory"),
        "{}",
        all_text(&o)
    );
    // A directory that holds no installed copy.
    let o = node.ctl(
        None,
        &["kernels", "import-wheel", node.path("").to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("no .dist-info of a library gpuarch imports"),
        "{}",
        all_text(&o)
    );
    assert!(!libs.exists());

    // The wheel: 7.0, 10.3, 11.0 and 12.1 on this host, 15 sets.
    let o = node.ctl(None, &["kernels", "import-wheel", wheel.to_str().unwrap()]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("imported flashinfer-cubin 0.6.13: 16011 files"),
        "{out}"
    );
    assert!(out.contains("10.3: 15658 kernels"), "{out}");
    assert!(out.contains("12.1: no kernels for it"), "{out}");
    assert!(out.contains("7.0+10.3+11.0+12.1: "), "{out}");
    let serve = libs.join("0.6.13/serve");
    let trees = std::fs::read_dir(&serve)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
        .count();
    assert_eq!(trees, 15, "{out}");
    let served: gpuarch_wire::library::Served =
        serde_json::from_slice(&std::fs::read(serve.join("10.3.json")).unwrap()).unwrap();
    assert!(
        served.complete() && served.code_files == 15658,
        "{served:?}"
    );

    // Each tree is exactly the code that runs on its set, by the targets
    // the inspector read from every file, with the library's metadata.
    let index: gpuarch_kernels::library::Index =
        serde_json::from_slice(&std::fs::read(libs.join("0.6.13/index.json")).unwrap()).unwrap();
    assert!(index.files.len() > 16_000, "{}", index.files.len());
    assert!(
        index
            .files
            .iter()
            .filter(|(k, _)| k.ends_with(".cubin"))
            .all(|(_, f)| !f.targets.is_empty()),
        "every cubin is read by the inspector"
    );
    let runs = |t: &str, c: gpuarch_core::arch::ComputeCapability| {
        gpuarch_core::arch::Target::parse(t)
            .unwrap()
            .check(c, None, None)
            .runs
    };
    for e in std::fs::read_dir(&serve).unwrap().flatten() {
        if !e.file_type().unwrap().is_dir() {
            continue;
        }
        let set = e.file_name().to_string_lossy().into_owned();
        let caps: Vec<_> = set
            .split('+')
            .map(|c| gpuarch_core::arch::ComputeCapability::parse_known(c).unwrap())
            .collect();
        let served: gpuarch_wire::library::Served =
            serde_json::from_slice(&std::fs::read(serve.join(format!("{set}.json"))).unwrap())
                .unwrap();
        let mut held = 0;
        for (k, f) in &index.files {
            let wanted =
                f.targets.is_empty() || f.targets.iter().any(|t| caps.iter().any(|c| runs(t, *c)));
            assert_eq!(e.path().join(k).is_file(), wanted, "{set}: {k}");
            held += usize::from(wanted);
        }
        assert_eq!(served.files as usize, held, "{set}");
        assert!(served.complete(), "{set}: {:?}", served.missing);
        // 0.6.13's lists name CuTe DSL modules the wheel lacks, each in a
        // directory of its own arch with no code: fetched into a tmpfs.
        // (Blackwell's 10.x and Thor's 11.0 have such modules listed.)
        let fetch: Vec<String> = caps
            .iter()
            .filter(|c| matches!(c.major, 10 | 11))
            .map(|c| {
                format!(
                    "801e770219613fbf088bc074c414732b26cc550d/fmha/cute-dsl/x86_64/sm_{}a",
                    c.digits()
                )
            })
            .collect();
        assert_eq!(served.fetch_dirs, fetch, "{set}");
        let named = |tag: &str| {
            index
                .files
                .keys()
                .filter(|k| k.contains(tag) && e.path().join(k).is_file())
                .count()
        };
        // No 10.0 here: a B300 set has its own Sm103a cubins and no B200's.
        if set.contains("10.3") {
            assert!(named("Sm103a") > 0 && named("Sm100a") == 0, "{set}");
        } else {
            assert_eq!(served.code_files, 0, "{set}");
        }
    }
}

/// Every file below `dir` with its bytes, by relative path: a tree as a
/// container would read it.
fn tree_contents(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(
        base: &std::path::Path,
        dir: &std::path::Path,
        out: &mut std::collections::BTreeMap<String, Vec<u8>>,
    ) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// A consumer's library through `kernels.remote`: node A imports a
/// FlashInfer cubin wheel and, with push on, pushes the wheel; node B
/// pre-warms `flashinfer-cubin==0.6.13` and gets the same trees, pulled,
/// not handed over. What the registry says is only checked against the
/// wheel: a wheel of another version under a tag, a tampered blob and a
/// stopped registry are refused and leave nothing.
#[test]
fn a_wheel_imported_on_one_node_is_pulled_and_served_on_every_other() {
    use gpuarch_kernels::library::testwheel::{Wheel, sha};
    use gpuarch_kernels::remote::{Remote as _, SHARED_WHEEL_SCHEMA, SharedWheel};
    need_bus!("docker-registry");
    let mut reg = gpuarch_tests::registry::Registry::start();
    let repo = format!("{}/gpuarch/kernels", reg.host());
    let node = |push: bool| {
        let n = Node::new("blackwell-mix", Policy::Shipped);
        let mut y = std::fs::read_to_string(n.path("config.yaml")).unwrap();
        y.push_str(&format!(
            "  prewarm: false\n  remote:\n    repository: {repo}\n    plain_http: true\n    push: {push}\n    pull_timeout_ms: 2000\n"
        ));
        std::fs::write(n.path("config.yaml"), y).unwrap();
        n
    };
    let ctl = |node: &Node, args: &[&str]| {
        let o = node.ctl(None, args);
        (o.status.code(), all_text(&o))
    };
    let wheels = tempfile::tempdir().unwrap();
    let wheel = wheels
        .path()
        .join("flashinfer_cubin-0.6.13-py3-none-any.whl");
    Wheel::flashinfer("0.6.13").write(&wheel);
    let version_dir = |n: &Node, v: &str| n.path(&format!("cache/libraries/flashinfer-cubin/{v}"));
    // What the pulls left in the staging dir: nothing. A CI run once found
    // an entry there just after a prewarm returned, and the check did not
    // say which; what is still there 10 s on is a leak, and is named.
    let tmp_left = |n: &Node| {
        let tmp = n.path("cache/libraries/tmp");
        let left = || -> Vec<String> {
            std::fs::read_dir(&tmp).map_or_else(
                |_| Vec::new(),
                |rd| {
                    rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .collect()
                },
            )
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut now = left();
        while !now.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            now = left();
        }
        now
    };

    // Node A: an installed copy is imported, but there is no wheel to
    // push, and the job says so; the wheel is pushed as it was.
    let mut a = node(true);
    a.start(&[]);
    let site = wheels.path().join("site-packages");
    Wheel::flashinfer("0.6.13").install(&wheels.path().join("copy.whl"), &site);
    let (code, out) = ctl(&a, &["kernels", "import-wheel", site.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("kept, but not pushed: site-packages is an installed copy, not a wheel"),
        "{out}"
    );
    assert!(version_dir(&a, "0.6.13").join("index.json").exists());
    let (code, out) = ctl(&a, &["kernels", "import-wheel", wheel.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("pushed to {repo}@sha256:")), "{out}");
    let wheel_bytes = std::fs::read(&wheel).unwrap();
    let blob = reg.blob_path(&format!("sha256:{}", sha(&wheel_bytes)));
    assert_eq!(std::fs::read(&blob).unwrap(), wheel_bytes);
    a.stop();

    // Node B pulls it by name and version, and serves what A serves.
    let mut b = node(false);
    b.start(&[]);
    // Nobody: refused by the bus policy.
    let o = b.ctl(Some(&[]), &["prewarm", "flashinfer-cubin==0.6.13"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(all_text(&o).contains("permission denied by the bus policy"));
    let (code, out) = ctl(&b, &["prewarm", "flashinfer-cubin==0.6.13"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!(
            "flashinfer-cubin 0.6.13: pulled from {repo}@sha256:"
        )),
        "{out}"
    );
    assert!(out.contains("imported flashinfer-cubin 0.6.13: "), "{out}");
    // Only the library: no pre-warm of every kernel package came with it.
    assert!(!out.contains("pre-warm"), "{out}");
    assert_eq!(
        tree_contents(&version_dir(&b, "0.6.13").join("serve")),
        tree_contents(&version_dir(&a, "0.6.13").join("serve")),
    );
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(version_dir(&b, "0.6.13").join("index.json")).unwrap(),
    )
    .unwrap();
    assert!(
        index["origin"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{repo}@sha256:")),
        "{index}"
    );
    assert_eq!(tmp_left(&b), Vec::<String>::new());
    // Again: nothing pulled, the trees made where missing.
    let (code, out) = ctl(&b, &["kernels", "pull", "flashinfer-cubin==0.6.13"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("0.6.13: imported already, from "), "{out}");
    // What no node pushed, and what is not a library.
    let (code, out) = ctl(&b, &["prewarm", "flashinfer-cubin==0.6.12"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("flashinfer-cubin 0.6.12: not in the registry"),
        "{out}"
    );
    let (code, out) = ctl(&b, &["prewarm", "numpy==2.0"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("numpy is not a distribution gpuarch imports"),
        "{out}"
    );
    let (code, out) = ctl(&b, &["kernels", "push", "flashinfer-cubin==0.6.13"]);
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("pushed as it is imported"), "{out}");

    // A wheel of 0.7.0 pushed as 0.6.14 (its config lies with the tag):
    // the import reads the wheel's own METADATA and refuses it.
    let forger = gpuarch_registry::OciRemote::new(&gpuarch_core::config::RemoteConfig {
        repository: repo.clone(),
        push: true,
        credentials: None,
        plain_http: true,
        ca_file: None,
        pull_timeout_ms: 2000,
    })
    .unwrap();
    let other = wheels
        .path()
        .join("flashinfer_cubin-0.7.0-py3-none-any.whl");
    Wheel::flashinfer("0.7.0").write(&other);
    let other_bytes = std::fs::read(&other).unwrap();
    forger
        .push_wheel(
            &std::fs::File::open(&other).unwrap(),
            &SharedWheel {
                schema: SHARED_WHEEL_SCHEMA,
                dist: "flashinfer-cubin".into(),
                version: "0.6.14".into(),
                wheel: "flashinfer_cubin-0.6.14-py3-none-any.whl".into(),
                sha256: sha(&other_bytes),
                bytes: other_bytes.len() as u64,
            },
        )
        .unwrap();
    let (code, out) = ctl(&b, &["prewarm", "flashinfer-cubin==0.6.14"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "the wheel is flashinfer-cubin 0.7.0, not the flashinfer-cubin 0.6.14 asked for"
        ),
        "{out}"
    );
    assert!(!version_dir(&b, "0.6.14").exists() && !version_dir(&b, "0.7.0").exists());
    assert_eq!(tmp_left(&b), Vec::<String>::new());
    b.stop();

    // Node C, after the registry's copy of 0.6.13 was changed: refused as
    // it arrives, nothing imported.
    let mut tampered = wheel_bytes.clone();
    let mid = tampered.len() / 2;
    tampered[mid] ^= 0xff;
    std::fs::write(&blob, &tampered).unwrap();
    let mut c = node(false);
    c.start(&[]);
    let (code, out) = ctl(&c, &["prewarm", "flashinfer-cubin==0.6.13"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("do not match its digest"), "{out}");
    assert!(!version_dir(&c, "0.6.13").exists());
    assert_eq!(tmp_left(&c), Vec::<String>::new());
    // And with the registry gone: a clear failure, soon.
    reg.stop();
    let t0 = Instant::now();
    let (code, out) = ctl(&c, &["prewarm", "flashinfer-cubin==0.6.13"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("flashinfer-cubin 0.6.13: not pulled: registry"),
        "{out}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_eq!(tmp_left(&c), Vec::<String>::new());
    c.stop();
}

/// `VmRSS` of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The build workers alive under `pid`.
fn workers_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .and_then(|v| v.parse::<u32>().ok());
            ppid == Some(pid)
                && std::fs::read(format!("/proc/{p}/cmdline"))
                    .unwrap_or_default()
                    .windows(14)
                    .any(|w| w == b"--build-worker")
        })
        .collect()
}

/// NVRTC runs in a worker per build, never in gpuarchd: a build whose
/// compiler runs past `build_timeout_s` fails with that reason, its worker
/// killed and reaped, while gpuarchd answers and goes on building; NVRTC is
/// never mapped into gpuarchd, and its memory after the builds is printed.
#[test]
fn a_runaway_build_is_killed_and_gpuarchd_never_loads_nvrtc() {
    need_bus!();
    let Some(cuda) = gpuarch_tests::cuda_dir() else {
        return;
    };
    // A kernel NVRTC takes minutes over: 20,000 dependent statements.
    let pkgs = tempfile::tempdir().unwrap();
    let slow = pkgs.path().join("slow");
    std::fs::create_dir(&slow).unwrap();
    std::fs::write(
        slow.join("kernel.yaml"),
        "name: slow\nversion: \"1.0.0\"\nsources: [slow.cu]\nexports: [slow]\nbuild:\n  backend: nvrtc\nvariants:\n  - name: fp32\n    dtype: float32\n",
    )
    .unwrap();
    let body: String = (0..20_000)
        .map(|i| format!("  a = a * 1.0001f + sinf(a * {i}.0f);\n"))
        .collect();
    std::fs::write(
        slow.join("slow.cu"),
        format!("extern \"C\" __global__ void slow(float* x) {{\n  float a = x[threadIdx.x];\n{body}  x[threadIdx.x] = a;\n}}\n"),
    )
    .unwrap();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let samples = workspace_root().join("kernels/packages");
    let mut yaml =
        gpuarch_tests::daemon::kernels_yaml(&node.path(""), &[&samples, pkgs.path()], Some(&cuda));
    yaml.push_str("  prewarm: false\n  build_timeout_s: 3\n");
    std::fs::write(node.path("config.yaml"), yaml).unwrap();
    node.start(&[]);
    let pid = node.daemon.as_ref().unwrap().id();
    let before = rss_kib(pid);

    let job = node
        .ctl_cmd(None, &["prewarm", "slow", "--arch", "8.6"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // While NVRTC runs in its worker, gpuarchd answers at once.
    let t0 = Instant::now();
    while workers_of(pid).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no worker started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t1 = Instant::now();
    let o = node.ctl(None, &["kernels"]);
    assert_eq!(o.status.code(), Some(0), "{}", all_text(&o));
    assert!(t1.elapsed() < Duration::from_secs(2), "{:?}", t1.elapsed());
    let o = job.wait_with_output().unwrap();
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("ran past its limit of 3 s (kernels.build_timeout_s); its worker was killed"),
        "{out}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    assert_eq!(workers_of(pid), Vec::<u32>::new(), "a worker was left");

    // gpuarchd goes on: the sample kernels build, each in its worker.
    let o = node.ctl(None, &["prewarm", "saxpy", "rmsnorm", "--arch", "7.5,8.6"]);
    let out = all_text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(out.matches(": built ").count(), 4, "{out}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(!maps.contains("libnvrtc"), "gpuarchd mapped NVRTC");
    let after = rss_kib(pid);
    eprintln!(
        "gpuarchd VmRSS: {} KiB at start, {} KiB after 4 builds and a killed one",
        before, after
    );
    node.stop();
}

/// With no NVRTC, a container's request is answered once: gpuarchd says
/// beside the spool that it cannot build it and why, and later containers
/// say so in their notes instead of asking again (each start said "no
/// sm_86 build yet; requested it", and gpuarchd answered each request with
/// "NVRTC not found"). A restart of gpuarchd lets them ask again.
#[test]
fn what_cannot_be_built_is_asked_once_and_said() {
    need_bus!();
    let none = tempfile::tempdir().unwrap();
    let mut node = Node::with_kernels(none.path(), "");
    // Only containers ask: no pre-warm.
    let yaml = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    std::fs::write(
        node.path("config.yaml"),
        yaml.replace("kernels:\n", "kernels:\n  prewarm: false\n"),
    )
    .unwrap();
    node.start(&[]);
    let unbuildable = gpuarch_wire::spool::unbuildable_path(&node.path("spool"));
    // Once gpuarchd has published its packages.
    let t0 = Instant::now();
    let log = loop {
        let (_, log) = precreate(&node, "1");
        if log.contains("kernel package") || t0.elapsed() > Duration::from_secs(30) {
            break log;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        log.contains("no sm_86 build yet; requested it from gpuarchd"),
        "{log}"
    );
    let t0 = Instant::now();
    while !std::fs::read_to_string(&unbuildable).is_ok_and(|t| t.contains("@sm_86")) {
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, log) = precreate(&node, "1");
    assert!(
        log.contains("no sm_86 build, and gpuarchd could not build one")
            && log.contains("NVRTC")
            && !log.contains("requested it"),
        "{log}"
    );
    let left: Vec<_> = std::fs::read_dir(node.path("spool")).unwrap().collect();
    assert!(left.is_empty(), "a request was left: {left:?}");
    // A restart (what applies a newly installed NVRTC) forgets it.
    node.stop();
    node.start(&[]);
    let t0 = Instant::now();
    while unbuildable.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not forgotten at restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, log) = precreate(&node, "1");
    assert!(log.contains("requested it from gpuarchd"), "{log}");
}
