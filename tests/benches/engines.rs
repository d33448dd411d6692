//! What gpuarch adds to a container start under the real engines, as
//! ratios against the same engine without it, taken in one run with the
//! two interleaved (these machines are noisy):
//!
//! - `docker run --rm IMAGE true` with `--runtime runc` against
//!   `--runtime gpuarch`;
//! - `ctr run --rm IMAGE ID true` with containerd's runc against
//!   `--runc-binary gpuarch-runtime`, and against `--runc-binary runc`
//!   (the same runtime options, so the same path through containerd: what
//!   is left is gpuarch's own cost).
//!
//! Each container asks for GPU 1 (`NVIDIA_VISIBLE_DEVICES=1`), so the shim
//! plans and rewrites the bundle every time. The engines are the tests'
//! (gpuarch_tests::engines: containerd 1.6 and dockerd 20.10 on private
//! sockets; containerd's state, gpuarch's snapshot and log on a tmpfs, as
//! /run is on a host). Run as root: `cargo bench -p gpuarch-tests --bench engines`
//! (`RUNS=N` for more than 30 pairs; `ENV_FILES=1` turns
//! `runtime.env_files` on).

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

use std::time::{Duration, Instant};

use gpuarch_tests::engines::{IMAGE, engines, missing};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed(f: impl FnOnce() -> std::process::Output) -> Duration {
    let t = Instant::now();
    let o = f();
    let took = t.elapsed();
    assert!(o.status.success(), "{o:?}");
    took
}

fn main() {
    let Some(e) = engines() else {
        eprintln!("cannot run: {}", missing().unwrap_or_default());
        std::process::exit(2);
    };
    let _turn = e.lock();
    // ENV_FILES=1: with runtime.env_files, to see what those cost.
    if std::env::var("ENV_FILES").is_ok_and(|v| v == "1") {
        e.set_gpuarch_config("runtime:\n  env_files: true\n");
        println!("runtime.env_files: true");
    } else {
        e.set_gpuarch_config("");
    }
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let shim = gpuarch_tests::artifacts()
        .gpuarch_runtime
        .display()
        .to_string();
    let docker = |runtime: &str| {
        e.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--runtime",
            runtime,
            "-e",
            "NVIDIA_VISIBLE_DEVICES=1",
            IMAGE,
            "true",
        ])
    };
    let mut n = 0;
    let runc = gpuarch_tests::which("runc").unwrap().display().to_string();
    let mut ctr = |binary: Option<&str>| {
        n += 1;
        let id = format!("bench-{}-{n}", std::process::id());
        let mut args = vec!["run", "--rm", "--snapshotter", "native"];
        if let Some(b) = binary {
            args.extend(["--runc-binary", b]);
        }
        args.extend(["--env", "NVIDIA_VISIBLE_DEVICES=1", IMAGE, &id, "true"]);
        e.ctr(&args)
    };
    // Warm both paths (image layers, page cache) before timing.
    for _ in 0..2 {
        timed(|| docker("runc"));
        timed(|| docker("gpuarch"));
        timed(|| ctr(None));
        timed(|| ctr(Some(&runc)));
        timed(|| ctr(Some(&shim)));
    }
    let (mut dr, mut dg) = (vec![], vec![]);
    let (mut cr, mut cb, mut cg) = (vec![], vec![], vec![]);
    for i in 0..runs {
        // Alternate which goes first, so none always follows another.
        if i % 2 == 0 {
            dr.push(timed(|| docker("runc")));
            dg.push(timed(|| docker("gpuarch")));
            cr.push(timed(|| ctr(None)));
            cb.push(timed(|| ctr(Some(&runc))));
            cg.push(timed(|| ctr(Some(&shim))));
        } else {
            dg.push(timed(|| docker("gpuarch")));
            dr.push(timed(|| docker("runc")));
            cg.push(timed(|| ctr(Some(&shim))));
            cb.push(timed(|| ctr(Some(&runc))));
            cr.push(timed(|| ctr(None)));
        }
    }
    let log = e.take_log();
    assert!(log.contains("RTX 3090"), "the shim did not plan: {log}");
    let report = |what: &str, base: &[Duration], ours: &[Duration]| {
        let (b, o) = (median(base.to_vec()), median(ours.to_vec()));
        println!(
            "{what:<46} {:7.1} ms against {:7.1} ms   ratio {:.3}",
            b.as_secs_f64() * 1e3,
            o.as_secs_f64() * 1e3,
            o.as_secs_f64() / b.as_secs_f64()
        );
    };
    println!("{runs} interleaved pairs each, medians (target: ratio < 1.05)");
    report("docker run: --runtime gpuarch / runc", &dr, &dg);
    report("ctr run: --runc-binary gpuarch-runtime / none", &cr, &cg);
    report("ctr run: --runc-binary gpuarch-runtime / runc", &cb, &cg);
    report("ctr run: --runc-binary runc / none", &cr, &cb);
}
