//! `io.gpuarch1.JitCache` and `gpuarchctl jit`: sizes, in-use, and gc under
//! the unit's capabilities.

use super::*;

/// A JIT cache as the hook leaves one: `bytes` of "build", `age_s` old.
fn jit_cache(
    dir: &Path,
    scope: &str,
    targets: &str,
    bytes: usize,
    age_s: u64,
) -> std::path::PathBuf {
    let p = dir.join(scope).join(targets);
    std::fs::create_dir_all(p.join("torch_extensions/ext")).unwrap();
    std::fs::write(p.join("torch_extensions/ext/ext.so"), vec![7u8; bytes]).unwrap();
    let label = format!(r#"{{"scope":"image","uid":1000,"gid":1000,"image":"torch:{scope}"}}"#);
    std::fs::write(dir.join(scope).join("scope.json"), label).unwrap();
    let t = std::time::SystemTime::now() - Duration::from_secs(age_s);
    std::fs::File::open(&p).unwrap().set_modified(t).unwrap();
    p
}

/// `gpuarchctl jit ls` and `jit gc`: the caches with their size
/// (never counted through a symlink a container left), whether a container
/// has one mounted (seen from another mount namespace); gc removes the
/// least recently started above the limit, never one mounted or just
/// handed out, and never anything a symlink in a cache points at.
#[test]
fn jit_ls_and_gc_through_gpuarchctl() {
    need_bus!("unshare", "setpriv");
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let jit = node.path("jit");
    let config = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    let with_limit = |max: u64| {
        format!(
            "{config}jit_cache:\n  enable: true\n  dir: {}\n  max_bytes: {max}\n",
            jit.display()
        )
    };
    std::fs::write(node.path("config.yaml"), with_limit(1 << 30)).unwrap();
    node.start(&[]);

    let old = jit_cache(&jit, "uid1000-image-aaaa", "sm_75", 2 << 20, 7200);
    let mounted = jit_cache(&jit, "uid1000-image-aaaa", "sm_86", 2 << 20, 10_800);
    let fresh = jit_cache(&jit, "uid1000-image-bbbb", "sm_90", 2 << 20, 5);
    let host = node.path("host");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("precious"), vec![1u8; 8 << 20]).unwrap();
    std::os::unix::fs::symlink(&host, old.join("escape")).unwrap();
    std::os::unix::fs::symlink(host.join("precious"), old.join("big.so")).unwrap();
    // Planting them made it new again; it was last started two hours ago.
    let two_hours = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::open(&old)
        .unwrap()
        .set_modified(two_hours)
        .unwrap();
    // A container holding sm_86, in its own mount namespace.
    let ready = node.path("ready");
    let target = node.path("in-container");
    std::fs::create_dir_all(&target).unwrap();
    let mut holder = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind {} {} && touch {} && exec sleep 120",
            mounted.display(),
            target.display(),
            ready.display()
        ))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no namespace");
        std::thread::sleep(Duration::from_millis(20));
    }

    let o = node.ctl(None, &["--json", "jit", "ls"]);
    assert!(o.status.success(), "{}", all_text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let caches = doc["caches"].as_array().unwrap();
    assert_eq!(caches.len(), 3, "{doc}");
    let by = |t: &str| caches.iter().find(|c| c["targets"] == t).unwrap();
    assert_eq!(by("sm_86")["in_use"], true, "{doc}");
    assert_eq!(by("sm_75")["in_use"], false, "{doc}");
    let b75 = by("sm_75")["bytes"].as_u64().unwrap();
    assert!(
        (2 << 20..4 << 20).contains(&b75),
        "counted through a link: {b75}"
    );
    assert_eq!(by("sm_75")["image"], "torch:uid1000-image-aaaa");
    assert_eq!(by("sm_75")["kind"], "image");
    assert_eq!(doc["limit_bytes"], 1u64 << 30);
    // Anyone may look; only root and group gpuarch may collect.
    let o = node.ctl(Some(&[]), &["jit", "ls"]);
    assert!(o.status.success(), "{}", all_text(&o));
    assert!(
        all_text(&o)
            .lines()
            .any(|l| l.contains("sm_86") && l.contains("yes")),
        "{}",
        all_text(&o)
    );
    let o = node.ctl(Some(&[]), &["jit", "gc"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("permission denied by the bus policy"),
        "{}",
        all_text(&o)
    );
    // Under the limit: nothing goes.
    let o = node.ctl(None, &["jit", "gc"]);
    assert!(all_text(&o).contains("freed 0 B"), "{}", all_text(&o));

    // Over it: the oldest that may go goes, and only it.
    std::fs::write(node.path("config.yaml"), with_limit(1 << 20)).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    let o = node.ctl(None, &["--json", "jit", "gc"]);
    assert!(o.status.success(), "{}", all_text(&o));
    let freed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(freed["freed_bytes"].as_u64(), Some(b75), "{}", all_text(&o));
    assert!(!old.exists(), "the oldest unmounted cache is still there");
    assert!(mounted.exists(), "a mounted cache was removed");
    assert!(fresh.exists(), "a cache just handed out was removed");
    assert_eq!(std::fs::read(host.join("precious")).unwrap().len(), 8 << 20);

    // The mount gone, it may go too.
    let _ = holder.kill();
    let _ = holder.wait();
    let o = node.ctl(None, &["jit", "gc"]);
    assert!(o.status.success(), "{}", all_text(&o));
    assert!(!mounted.exists() && fresh.exists());

    let o = node.ctl(None, &["--offline", "jit", "ls"]);
    assert_eq!(o.status.code(), Some(2), "{}", all_text(&o));
    assert!(
        all_text(&o).contains("the JIT caches are gpuarchd's"),
        "{}",
        all_text(&o)
    );
    node.stop();
}

/// The caches belong to the containers' uids (mode 0700, and whatever
/// modes the software inside chose): gpuarchd, with the unit's capability
/// bounding set, sizes and removes them. With none at all (the unit before
/// the JIT caches) it could do neither: the control.
#[test]
fn jit_caches_of_other_uids_are_sized_and_removed_under_the_units_capabilities() {
    need_bus!("setpriv");
    use std::os::unix::fs::PermissionsExt;
    let cache_of_1000 = |jit: &Path| {
        let p = jit_cache(jit, "uid1000-image-cccc", "sm_86", 2 << 20, 0);
        let locked = p.join("torch_extensions/ext");
        for d in [&p, &locked] {
            nix::unistd::chown(d.as_path(), Some(1000.into()), Some(1000.into())).unwrap();
        }
        nix::unistd::chown(&locked.join("ext.so"), Some(1000.into()), None).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        let t = std::time::SystemTime::now() - Duration::from_secs(7200);
        std::fs::File::open(&p).unwrap().set_modified(t).unwrap();
        p
    };
    let run = |bounding: String| {
        let mut node = Node::new("2080ti-3090", Policy::Shipped);
        node.bounding_set = Some(bounding);
        let jit = node.path("jit");
        let base = std::fs::read_to_string(node.path("config.yaml")).unwrap();
        let yaml = |max: u64| {
            format!(
                "{base}jit_cache:\n  enable: true\n  dir: {}\n  max_bytes: {max}\n",
                jit.display()
            )
        };
        std::fs::write(node.path("config.yaml"), yaml(1 << 30)).unwrap();
        node.start(&[]);
        let cache = cache_of_1000(&jit);
        let o = node.ctl(None, &["--json", "jit", "ls"]);
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let bytes = doc["caches"][0]["bytes"].as_u64().unwrap();
        std::fs::write(node.path("config.yaml"), yaml(1 << 20)).unwrap();
        assert!(node.ctl(None, &["reload"]).status.success());
        let gc = node.ctl(None, &["jit", "gc"]);
        let log = node.log();
        node.stop();
        (bytes, gc, cache.exists(), log)
    };
    let (bytes, gc, left, _) = run(gpuarch_tests::daemon::unit_bounding_set());
    assert!(
        bytes >= 2 << 20,
        "sized {bytes} under the unit's capabilities"
    );
    assert!(gc.status.success(), "{}", all_text(&gc));
    assert!(!left, "not removed under the unit's capabilities");

    // No capability: the cache cannot be read, so it is never found over
    // the limit. gpuarchd says so rather than report it small and quiet.
    let (bytes, gc, left, log) = run("-all".to_owned());
    assert!(bytes < 2 << 20, "sized {bytes} with no capability at all");
    assert!(all_text(&gc).contains("freed 0 B"), "{}", all_text(&gc));
    assert!(left);
    assert!(log.contains("cannot be read (Permission denied"), "{log}");
}
