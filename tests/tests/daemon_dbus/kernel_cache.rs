//! `io.gpuarch1.KernelCache` and its jobs: pre-warm, verify and gc through
//! gpuarchctl, a daemon killed mid-build, a full disk, builds shared
//! through a registry, and imported libraries served to containers.

use super::*;

mod libraries;
mod registry;

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
