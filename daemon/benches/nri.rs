//! How long gpuarchd takes to answer NRI's CreateContainer, against a
//! baseline measured on the same connection in the same process: an empty
//! Synchronize, the round trip through the socket, NRI's multiplexer and
//! ttrpc that plans nothing. The runtime is played by
//! `gpuarch_daemon::nri::fake_runtime` on a real Unix socket; gpuarchd's
//! side is the plugin it runs, on the 2080 Ti + 3090 fixture. Calls
//! alternate between the three kinds, so that noise falls on all alike.
//! Prints p50 and p99 of each, and the ratios. NRI's own timeout is 2 s.
//!
//! cargo bench -p gpuarch-daemon --bench nri

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuarch_core::config::Config;
use gpuarch_core::snapshot::Snapshot;
use gpuarch_daemon::nri::{self, fake_runtime};
use gpuarch_daemon::state::Shared;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::default();
    cfg.nri.enable = true;
    cfg.nri.socket = dir.path().join("nri.sock");
    cfg.hook.record_dir = dir.path().join("records");
    cfg.hook.image_cache = dir.path().join("images");
    cfg.kernels.mount_root = dir.path().join("kernels");
    std::fs::create_dir(&cfg.hook.record_dir).expect("records");
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/2080ti-3090.json"
    );
    let shared = Shared::new(
        cfg,
        dir.path().join("inventory.json"),
        dir.path().join("config.yaml"),
        false,
    );
    shared.refreshed(
        Snapshot::from_json(&std::fs::read(fixture).expect("fixture")).expect("snapshot"),
    );
    let shared = Arc::new(shared);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let runtime = fake_runtime::FakeRuntime::bind(&shared.config().nri.socket).expect("bind");
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(nri::run(shared.clone(), stop));
        let p = runtime.accept().await.expect("registration");
        let gpu = fake_runtime::container(
            &["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=0,1", "HOME=/root"],
            &[],
        );
        let plain = fake_runtime::container(&["PATH=/usr/bin", "HOME=/root"], &[]);
        let rounds = 3000;
        let (mut base, mut with_gpu, mut without) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rounds + 300 {
            let t = Instant::now();
            p.sync().await.expect("sync");
            let b = t.elapsed();
            let t = Instant::now();
            let r = p.create(&gpu.0, &gpu.1).await.expect("create");
            let g = t.elapsed();
            assert!(r.adjust.is_some());
            let t = Instant::now();
            p.create(&plain.0, &plain.1).await.expect("create");
            let n = t.elapsed();
            if i >= 300 {
                base.push(b);
                with_gpu.push(g);
                without.push(n);
            }
        }
        let (b50, b99) = (pct(&mut base, 0.5), pct(&mut base, 0.99));
        println!("{rounds} calls each (after 300 to warm up), alternating:");
        println!("  empty Synchronize (baseline): p50 {b50:?}  p99 {b99:?}");
        for (name, v) in [
            ("CreateContainer, 2 GPUs", &mut with_gpu),
            ("CreateContainer, no GPU", &mut without),
        ] {
            let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
            println!(
                "  {name}: p50 {p50:?} ({:.2}x)  p99 {p99:?} ({:.2}x)",
                p50.as_secs_f64() / b50.as_secs_f64(),
                p99.as_secs_f64() / b99.as_secs_f64()
            );
        }
    });
}
