//! What gpuarchd as an NRI plugin adds to a pod's CreateContainer, as
//! kubelet sees it: real containerd 2.1 (the sid engine root) with its CRI,
//! a pod on GPU 1 of the 2080 Ti + 3090 fixture whose container prints its
//! env, one after another. Blocks of pods with gpuarchd registered and
//! with gpuarchd running without NRI alternate (which goes first turns
//! each block); a block's first pod is not counted (the restart between
//! blocks). Prints each mode's median and p90 and their ratio.
//!
//! Run as root, on a quiet machine: `cargo bench -p gpuarch-tests --bench
//! nri_create` (`BLOCKS=N` of each mode, 4 by default; `PER=N` pods a
//! block, 10 by default).

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

#[path = "../tests/common/cri.rs"]
mod cri;
#[path = "../tests/nri/stack.rs"]
mod stack;

use std::time::Duration;

use stack::{REGISTERED, Stack};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // SAFETY: set before any thread starts; the Stack then refuses to run
    // without its engine root instead of skipping.
    unsafe { std::env::set_var("GPUARCH_TEST_REQUIRE_ALL", "1") };
    let blocks = env("BLOCKS", 4);
    let per = env("PER", 10);
    let mut s = Stack::new("sid").unwrap();
    s.wait_log(REGISTERED, 1);
    let mut on = true;
    let mut took: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for b in 0..blocks * 2 {
        // on, off, off, on, on, off, ...: each mode as often first.
        let want = matches!(b % 4, 0 | 3);
        if want != on {
            s.node.stop();
            s.start_gpuarchd(want);
            if want {
                s.wait_log(REGISTERED, 1);
            }
            on = want;
        }
        s.pod_timed();
        for _ in 0..per {
            let (name, t) = s.pod_timed();
            // Planned with gpuarchd registered, untouched without.
            let env = s.out(&name, "env");
            let arch = cri::var(&env, "TORCH_CUDA_ARCH_LIST");
            assert_eq!(arch.as_deref(), on.then_some("8.6"), "{name}: {env}");
            took[usize::from(on)].push(t);
        }
    }
    let [mut off, mut with] = took;
    let (off50, with50) = (pct(&mut off, 0.5), pct(&mut with, 0.5));
    let (off90, with90) = (pct(&mut off, 0.9), pct(&mut with, 0.9));
    println!(
        "CreateContainer, {} pods each: without gpuarchd's NRI plugin median {off50:.1?}, p90 {off90:.1?}; \
         with it median {with50:.1?}, p90 {with90:.1?}; ratio of medians {:.3}, of p90s {:.3}",
        off.len(),
        with50.as_secs_f64() / off50.as_secs_f64(),
        with90.as_secs_f64() / off90.as_secs_f64(),
    );
}
