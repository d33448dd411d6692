#![allow(clippy::unwrap_used)]
//! Pre-warming the sample packages for five archs with 1 and 2 workers
//! (real NVRTC), a cache-hit lookup, and reopening a full store.
//!
//! `cargo bench -p gpuarch-kernels --bench prewarm` (needs the NVIDIA wheels
//! that scripts/test unpacks into .local/cuda). Ratios are taken within one
//! run, since these machines are noisy.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;
use gpuarch_kernels::build::{Builder, Fetch, Task, run_tasks};
use gpuarch_kernels::spec;
use gpuarch_kernels::store::Store;

const ARCHS: [&str; 5] = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"];

fn cuda() -> Option<PathBuf> {
    gpuarch_kernels::toolchain::local_wheels(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

fn prewarm(cuda: &Path, root: &Path, workers: usize) -> (Duration, usize) {
    let b = Builder::new(
        Store::open(root, 1 << 30).unwrap(),
        vec![cuda.to_owned()],
        Duration::from_secs(600),
    );
    b.nvrtc().unwrap(); // loading NVRTC is not part of the build time
    let (pkgs, _) = spec::discover(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("packages")]);
    let tasks: Vec<Task> = pkgs
        .keys()
        .flat_map(|p| {
            ARCHS.iter().map(|a| Task {
                package: p.clone(),
                arch: Target::parse(a).unwrap(),
            })
        })
        .collect();
    let t = Instant::now();
    let res = run_tasks(&b, &pkgs, &tasks, workers, &|_| {});
    let built = res
        .iter()
        .filter(|r| r.served.as_ref().is_some_and(|s| s.1))
        .count();
    assert!(res.iter().all(|r| r.served.is_some()));
    (t.elapsed(), built)
}

fn main() {
    let Some(cuda) = cuda() else {
        gpuarch_testkit::skip("no NVRTC wheel (run scripts/test once to unpack it)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let rounds = 3;
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (t1, n1) = prewarm(&cuda, &tmp.path().join(format!("w1-{r}")), 1);
        let (t2, n2) = prewarm(&cuda, &tmp.path().join(format!("w2-{r}")), 2);
        assert_eq!((n1, n2), (15, 15));
        one.push(t1);
        two.push(t2);
    }
    one.sort();
    two.sort();
    let (m1, m2) = (one[rounds / 2], two[rounds / 2]);
    println!(
        "prewarm 3 packages x 5 archs (15 builds): 1 worker {:.2} s, 2 workers {:.2} s (medians of {rounds}); speed-up {:.2}x (target >= 1.7x)",
        m1.as_secs_f64(),
        m2.as_secs_f64(),
        m1.as_secs_f64() / m2.as_secs_f64()
    );

    // A full store: reopening it and loading the index; nothing rebuilt.
    let full = tmp.path().join("w1-0");
    let mut loads = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let s = Store::open(&full, 1 << 30).unwrap();
        let n = s.scan().unwrap().len();
        loads.push(t.elapsed());
        assert_eq!(n, 15);
    }
    loads.sort();
    let (_, rebuilt) = prewarm(&cuda, &full, 2);
    println!(
        "restart with a full cache: store opened and index of 15 entries loaded in {:.2} ms (median of 20; target < 100 ms); builds redone: {rebuilt}",
        loads[10].as_secs_f64() * 1e3
    );

    // Cache-hit lookup: key, failure record, manifest, sha256 of every file.
    let b = Builder::new(
        Store::open(&full, 1 << 30).unwrap(),
        vec![cuda.clone()],
        Duration::from_secs(600),
    );
    let (pkgs, _) = spec::discover(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("packages")]);
    let p = &pkgs["rmsnorm"];
    let t86 = Target::parse("sm_86").unwrap();
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        assert!(b.resolve(p, t86, Fetch::Stored).served.is_some());
    }
    let hit = t.elapsed() / n;
    let key = b.key(p, 0, t86).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        assert!(b.store.lookup(&key).unwrap().is_some());
    }
    let raw = t.elapsed() / n;
    println!(
        "cache hit: resolve(rmsnorm, sm_86) {:.1} us, of which the verified store lookup {:.1} us (target < 1 ms)",
        hit.as_secs_f64() * 1e6,
        raw.as_secs_f64() * 1e6
    );
}
