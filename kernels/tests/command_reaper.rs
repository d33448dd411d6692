#![allow(clippy::unwrap_used)]
//! A `command` build leaves nothing running: a process it started that
//! left its group and session (`setsid`) dies when the build ends, and
//! when the build overruns its time.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_kernels::command::{self, Vars};

/// Whether process `pid` is running (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// The pids a build wrote to `dir/pids`, once it has written `n`.
fn pids(dir: &Path, n: usize) -> Vec<i32> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let got: Vec<i32> = std::fs::read_to_string(dir.join("pids"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if got.len() >= n || Instant::now() > until {
            return got;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn build(script: &str, timeout: Duration) -> (Result<String, String>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let vars = Vars {
        arch: Target::parse("sm_86").unwrap(),
        out,
        src: dir.path().to_owned(),
        variant: "fp32".into(),
    };
    let argv = vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let env = BTreeMap::from([(
        "PIDS".to_owned(),
        dir.path().join("pids").display().to_string(),
    )]);
    let r = command::run(&argv, &env, &vars, &work, &[], timeout).map_err(|e| e.to_string());
    (r, dir)
}

/// A daemon in a session of its own, and a double fork whose middle
/// process exits: each writes its pid, then sleeps.
const LEAVE: &str = "setsid sh -c 'echo $$ >> \"$PIDS\"; exec sleep 300' </dev/null >/dev/null 2>&1 & \
                     sh -c '(echo $$ >/dev/null; sh -c \"echo \\$\\$ >> \\\"$PIDS\\\"; exec sleep 300\" &) ' ; ";

#[test]
fn a_build_that_ends_leaves_nothing_running() {
    let t = Instant::now();
    let (r, dir) = build(
        // Until both have written: `cat` of a file not there yet counts 0
        // lines, where `wc -l < FILE` would fail, end the loop at once and
        // let the build end before the second wrote its pid.
        &format!(
            "{LEAVE} while [ \"$(cat \"$PIDS\" 2>/dev/null | wc -l)\" -lt 2 ]; do sleep 0.05; done; exit 0"
        ),
        Duration::from_secs(30),
    );
    r.unwrap();
    let left = pids(dir.path(), 2);
    assert_eq!(left.len(), 2, "{left:?}");
    for p in left {
        assert!(!alive(p), "process {p} the build left is still running");
    }
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[test]
fn a_build_past_its_time_dies_with_every_process_it_started() {
    let t = Instant::now();
    let (r, dir) = build(&format!("{LEAVE} sleep 300"), Duration::from_secs(1));
    let e = r.unwrap_err();
    assert!(e.contains("ran past its 1 s limit"), "{e}");
    let left = pids(dir.path(), 2);
    assert_eq!(left.len(), 2, "{left:?}");
    for p in left {
        assert!(!alive(p), "process {p} the build started is still running");
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}
