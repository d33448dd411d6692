//! What reading an image's consumers adds to a container start, against a
//! baseline measured in the same process: parsing a 3 KB OCI config into a
//! `serde_json::Value`, which every start does anyway.
//!
//! The image is NGC-sized: 400 distributions in
//! `/usr/local/lib/python3.12/dist-packages` (a `*.dist-info` and a package
//! directory each, torch among them), 30 in Debian's `dist-packages`, 150
//! entries in `/usr/lib`. Hit: the cache answers (the same image again);
//! miss: its entry is removed before each read, so the environments are
//! read and the entry written (to tmpfs, as `/run/gpuarch/images` is).
//!
//! cargo bench -p gpuarch-hook --bench image

#![allow(clippy::unwrap_used)] // a benchmark: a failed unwrap is a failed run

// The core's benchmarks' timing helper, one copy for both crates.
#[path = "../../core/benches/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use common::time;

use gpuarch_container::image;
use gpuarch_container::rootfs::Root;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn image(root: &Path) {
    let site = "usr/local/lib/python3.12/dist-packages";
    for i in 0..400 {
        let name = if i == 200 {
            "torch".to_owned()
        } else {
            format!("pkg{i}")
        };
        let version = if i == 200 { "2.9.1+cu128" } else { "1.0.0" };
        write(
            root,
            &format!("{site}/{name}-{version}.dist-info/METADATA"),
            &format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n"),
        );
        std::fs::create_dir_all(root.join(site).join(&name)).unwrap();
    }
    for i in 0..30 {
        std::fs::create_dir_all(root.join(format!("usr/lib/python3/dist-packages/deb{i}")))
            .unwrap();
    }
    for i in 0..150 {
        std::fs::create_dir_all(root.join(format!("usr/lib/lib{i}"))).unwrap();
    }
    std::fs::create_dir_all(root.join("usr/lib/python3.12")).unwrap();
}

fn main() {
    // tmpfs where there is one, as /run is on a node.
    let base = ["/dev/shm", "/run", "/tmp"]
        .into_iter()
        .find(|d| Path::new(d).is_dir())
        .unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let rootfs = dir.path().join("rootfs");
    let cache = dir.path().join("images");
    std::fs::create_dir_all(&cache).unwrap();
    image(&rootfs);
    let config = serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {"args": ["python"], "env": (0..40).map(|i| format!("VAR_{i}=value-{i}")).collect::<Vec<_>>()},
        "root": {"path": "rootfs"},
        "mounts": (0..20).map(|i| serde_json::json!({"destination": format!("/mnt/{i}"), "type": "bind", "source": format!("/srv/{i}"), "options": ["rbind", "ro"]})).collect::<Vec<_>>(),
    })
    .to_string();
    let view = gpuarch_core::oci::ContainerView::from_json(config.as_bytes()).unwrap();
    let (sw, notes) = image::read(&Root::open(&rootfs).unwrap(), &view, Some(&cache));
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(sw.dists.len(), 1, "{sw:?}");
    let rounds = 5;
    for round in 0..rounds {
        let baseline = time(2000, || {
            black_box(serde_json::from_str::<serde_json::Value>(black_box(&config)).unwrap());
        });
        let hit = time(2000, || {
            let root = Root::open(&rootfs).unwrap();
            black_box(image::read(&root, &view, Some(&cache)));
        });
        let miss = time(300, || {
            for e in std::fs::read_dir(&cache).unwrap() {
                std::fs::remove_file(e.unwrap().path()).unwrap();
            }
            let root = Root::open(&rootfs).unwrap();
            black_box(image::read(&root, &view, Some(&cache)));
        });
        let r = |d: Duration| d.as_secs_f64() / baseline.as_secs_f64();
        println!(
            "round {round}: baseline (parse a 3 KB config) {baseline:.1?}; cache hit {hit:.1?} ({:.1}x); miss {miss:.1?} ({:.1}x)",
            r(hit),
            r(miss)
        );
    }
}
