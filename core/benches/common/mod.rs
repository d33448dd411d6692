//! What the benchmarks share (the core's, and the container crate's through
//! `#[path]`).

use std::time::{Duration, Instant};

/// The mean time of one call of `f` over `iters` calls, after a tenth as
/// many to warm up.
pub fn time(iters: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..iters / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed() / iters
}
