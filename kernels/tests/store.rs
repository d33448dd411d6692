#![allow(clippy::unwrap_used)]
//! The store across processes: one build per key, nothing visible from a
//! killed build, corruption found and quarantined, eviction that spares
//! pinned and mounted entries.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_kernels::store::{BuildError, BuildInfo, Meta, Outcome, Store};

fn meta(arch: &str) -> Meta {
    Meta {
        package: "p".into(),
        version: "1".into(),
        variant: "v".into(),
        dtype: None,
        arch: Target::parse(arch).unwrap(),
        backend: "test".into(),
        exports: Vec::new(),
    }
}

fn key(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

/// A build that writes an sm_86 cubin, logging each run to `log`.
fn build_86(out: &Path, log: &Path, pause: Duration) -> Result<BuildInfo, BuildError> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?
        .write_all(format!("{}\n", std::process::id()).as_bytes())?;
    std::fs::write(out.join("k.cubin"), &common::tiny_cubin(86)[..32])?; // half-written
    std::thread::sleep(pause);
    std::fs::write(out.join("k.cubin"), common::tiny_cubin(86))?;
    Ok(BuildInfo::default())
}

/// The child side, not a test of its own: [`spawn_child`] runs this binary
/// with `--ignored --exact child_builder` and
/// GPUARCH_STORE_CHILD=<root>:<pause_ms>; it builds key 1 there and prints
/// the outcome.
#[test]
#[ignore = "re-exec helper of two_processes_asking_at_once_build_once"]
fn child_builder() {
    let arg = std::env::var("GPUARCH_STORE_CHILD")
        .expect("child_builder is run by spawn_child, with GPUARCH_STORE_CHILD set");
    let (root, pause) = arg.split_once(':').unwrap();
    let root = Path::new(root);
    let store = Store::open(root, 1 << 30).unwrap();
    let pause = Duration::from_millis(pause.parse().unwrap());
    let o = store
        .build(&key(1), &meta("sm_86"), |out| {
            build_86(out, &root.join("builds.log"), pause)
        })
        .unwrap();
    println!(
        "OUTCOME {}",
        if matches!(o, Outcome::Built(_)) {
            "built"
        } else {
            "cached"
        }
    );
}

fn spawn_child(root: &Path, pause_ms: u64) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_builder",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "GPUARCH_STORE_CHILD",
            format!("{}:{pause_ms}", root.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn two_processes_asking_at_once_build_once() {
    let tmp = tempfile::tempdir().unwrap();
    Store::open(tmp.path(), 1 << 30).unwrap();
    let a = spawn_child(tmp.path(), 700);
    let b = spawn_child(tmp.path(), 700);
    let outs: Vec<String> = [a, b]
        .into_iter()
        .map(|c| String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap())
        .collect();
    let log = std::fs::read_to_string(tmp.path().join("builds.log")).unwrap();
    assert_eq!(log.lines().count(), 1, "built more than once: {log}");
    let mut got: Vec<&str> = outs
        .iter()
        .map(|o| {
            o.split("OUTCOME ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .unwrap_or(o)
        })
        .collect();
    got.sort();
    assert_eq!(got, ["built", "cached"], "{outs:?}");
}

#[test]
fn a_build_killed_midway_leaves_nothing_and_the_next_builds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path(), 1 << 30).unwrap();
    let mut child = spawn_child(tmp.path(), 30_000);
    // Wait until the child is inside its build (it has logged and written).
    let t0 = Instant::now();
    while !tmp.path().join("builds.log").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "child never started building"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert_eq!(
        std::fs::read_dir(tmp.path().join("tmp")).unwrap().count(),
        1,
        "the dead build's temp dir"
    );
    assert!(store.lookup(&key(1)).unwrap().is_none());
    assert!(
        store.scan().unwrap().is_empty(),
        "a partial build is visible"
    );
    let o = store
        .build(&key(1), &meta("sm_86"), |out| {
            build_86(out, &tmp.path().join("builds.log"), Duration::ZERO)
        })
        .unwrap();
    assert!(matches!(o, Outcome::Built(_)));
    assert_eq!(
        std::fs::read(o.entry().dir.join("k.cubin")).unwrap(),
        common::tiny_cubin(86)
    );
    assert_eq!(
        std::fs::read_dir(tmp.path().join("tmp")).unwrap().count(),
        0,
        "temp left behind"
    );
    // Reopening (a daemon start) finds it and clears nothing else.
    let again = Store::open(tmp.path(), 1 << 30).unwrap();
    assert_eq!(again.scan().unwrap().len(), 1);
}

#[test]
fn a_flipped_byte_is_found_quarantined_and_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path(), 1 << 30).unwrap();
    let log = tmp.path().join("builds.log");
    let k = key(2);
    let e = store
        .build(&k, &meta("sm_86"), |out| {
            build_86(out, &log, Duration::ZERO)
        })
        .unwrap()
        .entry()
        .clone();
    let f = e.dir.join("k.cubin");
    let mut data = std::fs::read(&f).unwrap();
    data[40] ^= 0x01;
    std::fs::write(&f, &data).unwrap();
    assert!(
        store.lookup(&k).unwrap().is_none(),
        "a corrupt entry was served"
    );
    let q: Vec<_> = std::fs::read_dir(tmp.path().join("quarantine"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(q.len(), 1);
    let reason = std::fs::read_to_string(q[0].path().join("reason.txt")).unwrap();
    assert!(reason.contains("k.cubin: sha256"), "{reason}");
    let o = store
        .build(&k, &meta("sm_86"), |out| {
            build_86(out, &log, Duration::ZERO)
        })
        .unwrap();
    assert!(matches!(o, Outcome::Built(_)));
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 2);
}

#[test]
fn a_build_for_the_wrong_arch_is_refused_and_remembered() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path(), 1 << 30).unwrap();
    let e = store
        .build(&key(3), &meta("sm_80"), |out| {
            std::fs::write(out.join("k.cubin"), common::tiny_cubin(75))?;
            Ok(BuildInfo::default())
        })
        .unwrap_err();
    assert_eq!(
        e,
        BuildError::Rejected("output k.cubin carries sm_75 but the build is for sm_80".into())
    );
    assert!(store.scan().unwrap().is_empty());
    // Remembered: the closure is not run again.
    let again = store
        .build(&key(3), &meta("sm_80"), |_| {
            panic!("retried a refused build")
        })
        .unwrap_err();
    assert_eq!(again, e);
}

#[test]
fn eviction_takes_the_least_recently_used_and_spares_pins_and_mounts() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("builds.log");
    // Each entry is a few hundred bytes; allow three and a half of them.
    let probe = Store::open(&tmp.path().join("probe"), 1 << 30).unwrap();
    let size = probe
        .build(&key(9), &meta("sm_86"), |o| {
            build_86(o, &log, Duration::ZERO)
        })
        .unwrap()
        .entry()
        .bytes;
    let store = Store::open(&tmp.path().join("s"), 3 * size + size / 2).unwrap();
    for n in 1..=5 {
        store
            .build(&key(n), &meta("sm_86"), |o| {
                build_86(o, &log, Duration::ZERO)
            })
            .unwrap();
        // Distinct last-use times, oldest first: 1, 2, 3, 4, 5.
        let used = tmp.path().join("s/used").join(key(n));
        let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + u64::from(n));
        std::fs::File::options()
            .write(true)
            .open(used)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    store.pin(&key(1)).unwrap();
    let mounted: HashSet<String> = [key(2)].into();
    let r = store.gc(&mounted).unwrap();
    // 1 pinned and 2 mounted stay although oldest; 3, 4 go; 5 (newest) stays.
    assert_eq!(r.evicted, [key(3), key(4)]);
    let left: Vec<String> = store
        .scan()
        .unwrap()
        .into_iter()
        .map(|e| e.manifest.key)
        .collect();
    assert_eq!(left, [key(1), key(2), key(5)]);
    assert_eq!(r.freed_bytes, 2 * size);
    // A new build puts it over again: the oldest evictable (5) goes.
    store
        .build(&key(6), &meta("sm_86"), |o| {
            build_86(o, &log, Duration::ZERO)
        })
        .unwrap();
    let r = store.gc(&mounted).unwrap();
    assert_eq!(r.evicted, [key(5)]);
    // With the pin and the mount gone, the oldest goes first.
    store.unpin(&key(1)).unwrap();
    store
        .build(&key(7), &meta("sm_86"), |o| {
            build_86(o, &log, Duration::ZERO)
        })
        .unwrap();
    let r = store.gc(&HashSet::new()).unwrap();
    assert_eq!(r.evicted, [key(1)]);
    assert!(r.used_bytes <= store.max_bytes());
}
