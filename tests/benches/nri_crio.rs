//! How long gpuarchd takes to answer NRI's CreateContainer under CRI-O,
//! which it answers from containers/storage: the container looked up in
//! the store's list, the image's layers from the overlay driver's
//! records, the read kept per image. The store is real: host podman 4.3
//! (containers/storage, as CRI-O uses it) pulls the three-layer Python
//! image of `tests/tests/nri/` and makes the containers. The runtime's
//! side of NRI is `fake_runtime`, naming itself cri-o.
//!
//! A node's list grows with its containers, and each answer searches it,
//! so the list is padded to each size with copies of podman's own entries
//! (new ids, the text as containers/storage wrote it), ahead of the real
//! ones. Interleaved in one run, against a
//! baseline on the same connection (an empty Synchronize): a container of
//! the image, seen (the read kept), at each size of list.
//!
//! Under the vfs driver each container has its own copy of the image;
//! gpuarchd reads the image's top layer's copy instead, one for all its
//! containers. Measured: new containers of a seen image, each answered
//! once, against reading a container's own copy, as each such start did
//! before (a read not kept, in the same process).
//!
//! Run as root: `cargo bench -p gpuarch-tests --bench nri_crio`
//! (`RUNS=N` answers per size, 200 by default).

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

use std::process::Command;
use std::time::{Duration, Instant};

use gpuarch_daemon::nri::{self, fake_runtime};
use gpuarch_tests::stack::python_image_archive;

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The list sizes measured: podman's own containers, then padded.
const SIZES: [usize; 4] = [4, 100, 1000, 5000];

fn main() {
    if let Some(why) = gpuarch_tests::cannot_run("to make containers/storage", &["podman"]) {
        eprintln!("cannot run: {why}");
        std::process::exit(2);
    }
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let vfs_dir = tempfile::tempdir().unwrap();
    let podman_of = |dir: &std::path::Path, driver: &str, args: &[&str]| {
        let o = Command::new("podman")
            .arg("--root")
            .arg(dir.join("storage"))
            .arg("--runroot")
            .arg(dir.join("run"))
            .args([
                "--storage-driver",
                driver,
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "podman {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let podman = |args: &[&str]| podman_of(dir.path(), "overlay", args);
    let archive = python_image_archive(&dir.path().join("python-image"));
    let pull = format!("oci-archive:{}", archive.display());
    let image = podman(&["pull", "-q", &pull]);
    let image = image.lines().last().unwrap().to_owned();
    let ids: Vec<String> = (0..SIZES[0])
        .map(|_| podman(&["create", "--network", "none", &image, "/bin/sh"]))
        .collect();
    let list = dir
        .path()
        .join("storage/overlay-containers/containers.json");
    // podman's own list, as containers/storage wrote it (each entry's id
    // first): the padding is copies of its text with new ids.
    let real = std::fs::read_to_string(&list).unwrap();
    let entries = real.trim().trim_start_matches('[').trim_end_matches(']');
    assert!(entries.starts_with(r#"{"id":""#), "{real}");

    let shared = gpuarch_tests::nri::shared(dir.path(), |n| {
        n.storage_root = Some(dir.path().join("storage"));
        n.storage_runroot = Some(dir.path().join("run"));
    });
    let rt = runtime();
    rt.block_on(async {
        let (p, _stop) = gpuarch_tests::nri::start(&shared, "cri-o").await;
        let env = gpuarch_tests::nri::PY_ENV;
        let hint = |r: &nri::proto::nri::CreateContainerResponse| {
            gpuarch_tests::nri::var(r, "GPUARCH_ATTN_IMPLEMENTATION").unwrap_or_default()
        };
        println!(
            "{runs} answers per size, a container of the Python image (read kept) in podman 4.3's overlay store, interleaved:"
        );
        let mut first = None;
        for size in SIZES {
            let copies: Vec<String> = (1..size / ids.len())
                .map(|n| {
                    ids.iter().enumerate().fold(entries.to_owned(), |text, (k, id)| {
                        text.replace(id.as_str(), &format!("{:064x}", n * ids.len() + k))
                    })
                })
                .chain([entries.to_owned()])
                .collect();
            let bytes = format!("[{}]", copies.join(","));
            std::fs::write(&list, &bytes).unwrap();
            let storage = nri::storage::Storage::new(
                &dir.path().join("storage"),
                &dir.path().join("run"),
                &[],
            );
            let mut lookup = Vec::new();
            for i in 0..runs {
                let t = Instant::now();
                storage.layers(&ids[i % ids.len()]).unwrap();
                lookup.push(t.elapsed());
            }
            let (mut base, mut seen) = (Vec::new(), Vec::new());
            for i in 0..runs {
                let t = Instant::now();
                p.sync().await.unwrap();
                base.push(t.elapsed());
                let (pod, mut ctr) = fake_runtime::container(&env, &[]);
                ctr.id.clone_from(&ids[i % ids.len()]);
                let t = Instant::now();
                let r = p.create(&pod, &ctr).await.unwrap();
                let took = t.elapsed();
                // The image was read: flash-attn is whited out in it.
                assert_eq!(hint(&r), "sdpa", "{size}");
                if first.is_none() {
                    first = Some(took);
                } else {
                    seen.push(took);
                }
            }
            let (b50, b99) = (pct(&mut base, 0.5), pct(&mut base, 0.99));
            let (p50, p99) = (pct(&mut seen, 0.5), pct(&mut seen, 0.99));
            println!(
                "  {size} containers ({} KiB list): baseline p50 {b50:?} p99 {b99:?}; CreateContainer p50 {p50:?} ({:.1}x) p99 {p99:?} ({:.1}x); the lookup alone p50 {:?}",
                bytes.len() / 1024,
                p50.as_secs_f64() / b50.as_secs_f64(),
                p99.as_secs_f64() / b99.as_secs_f64(),
                pct(&mut lookup, 0.5)
            );
        }
        println!(
            "  the image's first container (its layers read): {:?}",
            first.unwrap()
        );
    });
    vfs(
        runs.min(VFS),
        &pull,
        |args| podman_of(vfs_dir.path(), "vfs", args),
        vfs_dir.path(),
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Most containers the vfs case makes (each a copy of the image).
const VFS: usize = 50;

/// The vfs case: `n` new containers of the image, each answered once,
/// interleaved with a read of a container's own copy.
fn vfs(n: usize, pull: &str, podman: impl Fn(&[&str]) -> String, dir: &std::path::Path) {
    let image = podman(&["pull", "-q", pull]);
    let image = image.lines().last().unwrap().to_owned();
    // One more, whose answer reads the image (not measured).
    let ids: Vec<String> = (0..=n)
        .map(|_| podman(&["create", "--network", "none", &image, "/bin/sh"]))
        .collect();
    let list = std::fs::read(dir.join("storage/vfs-containers/containers.json")).unwrap();
    let list: serde_json::Value = serde_json::from_slice(&list).unwrap();
    let own = |id: &str| {
        let e = list
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .unwrap();
        dir.join("storage/vfs/dir")
            .join(e["layer"].as_str().unwrap())
    };
    let shared = gpuarch_tests::nri::shared(dir, |c| {
        c.storage_root = Some(dir.join("storage"));
        c.storage_runroot = Some(dir.join("run"));
    });
    let env = gpuarch_tests::nri::PY_ENV;
    let view =
        gpuarch_core::oci::ContainerView::with_env(env.iter().filter_map(|kv| kv.split_once('=')));
    let rt = runtime();
    rt.block_on(async {
        let (p, _stop) = gpuarch_tests::nri::start(&shared, "cri-o").await;
        let (pod, mut ctr) = fake_runtime::container(&env, &[]);
        ctr.id.clone_from(&ids[n]);
        p.create(&pod, &ctr).await.unwrap();
        let (mut copy, mut seen) = (Vec::new(), Vec::new());
        for id in &ids[..n] {
            // What each start cost before: the container's own copy read.
            let images = nri::image::Images::new(&shared.config().nri);
            let t = Instant::now();
            let (sw, _) = images.read(&Ok(vec![own(id)]), &view, None);
            copy.push(t.elapsed());
            assert!(sw.was_read());
            let (pod, mut ctr) = fake_runtime::container(&env, &[]);
            ctr.id.clone_from(id);
            let t = Instant::now();
            let r = p.create(&pod, &ctr).await.unwrap();
            seen.push(t.elapsed());
            assert_eq!(
                gpuarch_tests::nri::var(&r, "GPUARCH_ATTN_IMPLEMENTATION").as_deref(),
                Some("sdpa")
            );
        }
        let (c50, s50) = (pct(&mut copy, 0.5), pct(&mut seen, 0.5));
        println!(
            "{n} new containers of the image in podman 4.3's vfs store, interleaved: CreateContainer p50 {s50:?}, against reading the container's own copy p50 {c50:?} ({:.2}x)",
            s50.as_secs_f64() / c50.as_secs_f64()
        );
    });
}
