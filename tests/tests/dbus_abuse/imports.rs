//! Imports too big for the disk, the limit or memory: streamed to disk,
//! refused whole, nothing left behind.

use super::*;

/// A PTX file of `len` bytes: its text, then a hole. Read, it is a PTX
/// file padded with NULs; on the test's disk it takes one block.
fn big_ptx(path: &std::path::Path, len: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(b".version 8.0\n.target sm_80\n.visible .entry big(\n")
        .unwrap();
    f.set_len(len).unwrap();
}

/// The most memory of its own (RssAnon) process `pid` held while `f` ran,
/// sampled every 5 ms, in KiB.
fn peak_anon<T>(pid: u32, f: impl FnOnce() -> T) -> (u64, T) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let sampler = std::thread::spawn(move || {
        let mut peak = 0;
        while !s.load(Ordering::Relaxed) {
            peak = peak.max(proc_status_kib(pid, "RssAnon"));
            std::thread::sleep(Duration::from_millis(5));
        }
        peak
    });
    let r = f();
    stop.store(true, Ordering::Relaxed);
    (sampler.join().unwrap(), r)
}

/// `gpuarchctl kernels import NAME FILE...` for each import at once, as
/// root: each one's exit code and output.
fn imports_at_once(node: &Node, imports: &[(&str, &[&std::path::Path])]) -> Vec<(i32, String)> {
    let children: Vec<Child> = imports
        .iter()
        .map(|(name, files)| {
            let mut args = vec!["kernels", "import", name];
            args.extend(files.iter().map(|p| p.to_str().unwrap()));
            node.ctl_cmd(None, &args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            (o.status.code().unwrap_or(-1), text)
        })
        .collect()
}

fn tmp_entries(node: &Node) -> Vec<String> {
    std::fs::read_dir(node.path("cache/tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Before, each import was read whole into gpuarchd's memory: two
/// imports of 3 GiB at once took it to 6.1 GiB. Now each is copied to the
/// store's disk as it is read, one import at a time, and gpuarchd holds a
/// piece of it at a time.
#[test]
fn two_big_imports_at_once_are_streamed_to_disk_not_held() {
    alone_on_the_bus!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    node.start(&[]);
    let pid = node.daemon.as_ref().unwrap().id();
    let files = tempfile::tempdir().unwrap();
    let size: u64 = 768 << 20;
    let (a, b) = (
        files.path().join("big-a.ptx"),
        files.path().join("big-b.ptx"),
    );
    big_ptx(&a, size);
    big_ptx(&b, size);
    let anon0 = proc_status_kib(pid, "RssAnon");
    let t0 = Instant::now();
    let (peak, outs) = peak_anon(pid, || {
        imports_at_once(&node, &[("big-a", &[&a]), ("big-b", &[&b])])
    });
    eprintln!(
        "two imports of {} MiB at once: {:?}; gpuarchd RssAnon {anon0} KiB before, {peak} KiB at most",
        size >> 20,
        t0.elapsed()
    );
    for (code, out) in &outs {
        assert_eq!(*code, 0, "{out}");
        assert!(out.contains("carries compute_80"), "{out}");
    }
    assert!(
        peak < anon0 + 64 * 1024,
        "gpuarchd held {} MiB more while importing",
        (peak - anon0) >> 10
    );
    // Stored whole, and the staged copies are gone.
    for name in ["big-a", "big-b"] {
        let view = node.path(&format!("kernels/{name}"));
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(view.join("manifest.json")).unwrap()).unwrap();
        assert!(
            manifest.to_string().contains(&format!("{name}.ptx")),
            "{manifest}"
        );
    }
    assert_eq!(tmp_entries(&node), Vec::<String>::new());
    // Verifying reads every stored file again, a piece at a time too.
    let (peak, o) = peak_anon(pid, || node.ctl(None, &["verify"]));
    assert!(o.status.success(), "{o:?}");
    assert!(
        peak < anon0 + 64 * 1024,
        "gpuarchd held {} MiB more while verifying",
        (peak - anon0) >> 10
    );
}

/// An import the store's filesystem cannot hold is refused before it fills
/// it, one past kernels.max_bytes when the copy passes it; either way
/// nothing is left behind, and the next import that fits goes in.
#[test]
fn an_import_the_disk_or_the_limit_cannot_hold_is_refused_and_leaves_nothing() {
    alone_on_the_bus!();
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let cache = node.path("cache");
    let _unmount = gpuarch_tests::Tmpfs::mount(&cache, "size=512m");
    let mut yaml = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    yaml.push_str("  max_bytes: 402653184\n");
    std::fs::write(node.path("config.yaml"), yaml).unwrap();
    node.start(&[]);
    let files = tempfile::tempdir().unwrap();
    let p = |n: &str| files.path().join(n);
    big_ptx(&p("huge.ptx"), 300 << 20);
    big_ptx(&p("half-1.ptx"), 200 << 20);
    big_ptx(&p("half-2.ptx"), 200 << 20);
    big_ptx(&p("small.ptx"), 8 << 20);

    let out = imports_at_once(&node, &[("huge", &[&p("huge.ptx")])]);
    assert_eq!(out[0].0, 1, "{}", out[0].1);
    assert!(
        out[0].1.contains("huge.ptx: 314572800 bytes, and"),
        "{}",
        out[0].1
    );
    assert!(out[0].1.contains("bytes free"), "{}", out[0].1);

    let out = imports_at_once(&node, &[("halves", &[&p("half-1.ptx"), &p("half-2.ptx")])]);
    assert_eq!(out[0].0, 1, "{}", out[0].1);
    assert!(
        out[0].1.contains(
            "halves not imported, nothing changed: half-2.ptx: the import is larger than \
             kernels.max_bytes (402653184)"
        ),
        "{}",
        out[0].1
    );
    assert_eq!(tmp_entries(&node), Vec::<String>::new());
    let used = nix::sys::statvfs::statvfs(&cache).unwrap();
    let used = (used.blocks() - used.blocks_free()) * used.fragment_size();
    // half-1 is stored (content-addressed, unpinned) but nothing staged stays.
    assert!(
        used < (200 << 20) + (8 << 20),
        "{used} bytes used on the store"
    );

    let out = imports_at_once(&node, &[("small", &[&p("small.ptx")])]);
    assert_eq!(out[0].0, 0, "{}", out[0].1);
    assert!(node.path("kernels/small/manifest.json").exists());
    assert!(!node.path("kernels/halves").exists());
}
