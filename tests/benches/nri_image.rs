//! How long gpuarchd takes to answer NRI's CreateContainer when it reads
//! the container's image, under a real containerd 2.1 (the sid engine
//! root, overlayfs) holding the three-layer Python image of
//! `tests/tests/nri/`. Each container is made with `ctr containers
//! create`, which prepares its snapshot under its id as CRI does; the
//! runtime's side of NRI is `fake_runtime`, naming itself containerd, so
//! gpuarchd asks the real containerd for each snapshot's layers.
//!
//! Interleaved in one run, against a baseline on the same connection (an
//! empty Synchronize):
//! - the image's first container (the layers read);
//! - later containers of the same image (the read kept: one call to
//!   containerd);
//! - a GPU container whose snapshot containerd does not have (the call
//!   alone, answered NotFound, the Plan for an image not read).
//!
//! Run as root: `cargo bench -p gpuarch-tests --bench nri_image`
//! (`RUNS=N` containers, 200 by default).

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

use std::time::{Duration, Instant};

use gpuarch_daemon::nri::{self, fake_runtime};
use gpuarch_tests::stack::{self, Containerd, PY_IMAGE};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let root = match stack::root("sid") {
        Ok(r) => r,
        Err(why) => {
            eprintln!("cannot run: {why}");
            std::process::exit(2);
        }
    };
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let cdir = dir.path().join("containerd");
    std::fs::create_dir_all(&cdir).unwrap();
    let c = Containerd::start_with(&root, &cdir, &[dir.path()], "overlayfs");
    stack::python_image(&c);
    let t = Instant::now();
    let ids: Vec<String> = (0..runs).map(|i| format!("bench-{i}")).collect();
    for id in &ids {
        let o = c.ctr(&[
            "-n",
            "k8s.io",
            "containers",
            "create",
            "--snapshotter",
            "overlayfs",
            PY_IMAGE,
            id,
        ]);
        assert!(o.status.success(), "ctr containers create: {o:?}");
    }
    eprintln!("{runs} containers made in {:?}", t.elapsed());

    let shared = gpuarch_tests::nri::shared(dir.path(), |n| {
        n.containerd = c.sock.clone();
        n.snapshotters = vec!["overlayfs".to_owned()];
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (p, _stop) = gpuarch_tests::nri::start(&shared, "containerd").await;
        let env = gpuarch_tests::nri::PY_ENV;
        let hint = |r: &nri::proto::nri::CreateContainerResponse| {
            gpuarch_tests::nri::var(r, "GPUARCH_ATTN_IMPLEMENTATION").unwrap_or_default()
        };
        let (mut base, mut first, mut kept, mut unknown) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, id) in ids.iter().enumerate() {
            let t = Instant::now();
            p.sync().await.unwrap();
            base.push(t.elapsed());
            let (pod, mut ctr) = fake_runtime::container(&env, &[]);
            ctr.id.clone_from(id);
            let t = Instant::now();
            let r = p.create(&pod, &ctr).await.unwrap();
            let took = t.elapsed();
            // The image was read: flash-attn is whited out in it.
            assert_eq!(hint(&r), "sdpa", "{id}");
            if i == 0 {
                first.push(took);
            } else {
                kept.push(took);
            }
            let (pod, mut ctr) = fake_runtime::container(&env, &[]);
            ctr.id = format!("absent-{i}");
            let t = Instant::now();
            let r = p.create(&pod, &ctr).await.unwrap();
            unknown.push(t.elapsed());
            assert_eq!(hint(&r), "flash_attention_2");
        }
        let (b50, b99) = (pct(&mut base, 0.5), pct(&mut base, 0.99));
        println!("{runs} containers of {PY_IMAGE} under containerd 2.1 (overlayfs), interleaved:");
        println!("  empty Synchronize (baseline): p50 {b50:?}  p99 {b99:?}");
        println!(
            "  CreateContainer, the image's first container (read): {:?}",
            first[0]
        );
        for (name, v) in [
            ("CreateContainer, the image seen (kept)", &mut kept),
            (
                "CreateContainer, no snapshot (call only, image not read)",
                &mut unknown,
            ),
        ] {
            let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
            println!(
                "  {name}: p50 {p50:?} ({:.1}x)  p99 {p99:?} ({:.1}x)",
                p50.as_secs_f64() / b50.as_secs_f64(),
                p99.as_secs_f64() / b99.as_secs_f64()
            );
        }
    });
}
