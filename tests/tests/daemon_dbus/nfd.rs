//! Node Feature Discovery's labels file, as gpuarchd keeps it.

use super::doctor::{doctor_on, doctor_root};
use super::*;

/// `export.nfd`: gpuarchd keeps Node Feature Discovery's feature file with
/// the node's labels, every one valid by Kubernetes' rules, rewrites it only
/// when the GPUs change, removes it when the export is turned off, and
/// `gpuarchctl doctor` tells a current file from a stale one.
#[test]
fn nfd_labels_follow_the_inventory_and_go_when_turned_off() {
    need_bus!();
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    doctor_root(root);
    let dir = root.join("etc/kubernetes/node-feature-discovery/features.d");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gpuarch");
    // The doctor root's config names the default path; gpuarchd's names the
    // same file from outside the root.
    let mut root_cfg = std::fs::read_to_string(root.join("etc/gpuarch/config.yaml")).unwrap();
    root_cfg.push_str("export:\n  nfd: true\n");
    std::fs::write(root.join("etc/gpuarch/config.yaml"), root_cfg).unwrap();
    let base = std::fs::read_to_string(node.path("config.yaml")).unwrap();
    let yaml = |on: bool| {
        format!(
            "{base}export:\n  nfd: {on}\n  nfd_file: {}\n",
            file.display()
        )
    };
    std::fs::write(node.path("config.yaml"), yaml(true)).unwrap();
    node.start(&[]);
    let t0 = Instant::now();
    while !file.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Parsed the way NFD's local source does: trimmed lines, `#` comments,
    // `name=value` split at the first `=`.
    let labels = || -> BTreeMap<String, String> {
        std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap_or((l, "true"));
                gpuarch_core::nfd::check_label(k, v).unwrap();
                (k.to_owned(), v.to_owned())
            })
            .collect()
    };
    let get = |l: &BTreeMap<String, String>, k: &str| l.get(&format!("gpuarch.io/{k}")).cloned();
    let l = labels();
    assert_eq!(get(&l, "gpu.count").as_deref(), Some("2"));
    assert_eq!(get(&l, "sm_75.count").as_deref(), Some("1"));
    assert_eq!(get(&l, "sm_86.count").as_deref(), Some("1"));
    assert_eq!(get(&l, "arch.mixed").as_deref(), Some("true"));
    assert_eq!(get(&l, "bf16.all").as_deref(), Some("false"));
    assert_eq!(get(&l, "compute-capability.min").as_deref(), Some("7.5"));
    let snapshot = node.path("run/inventory.json");
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("ok    NFD labels"), "{out}");
    // gpuarchctl labels prints what gpuarchd keeps.
    let o = node.ctl(None, &["labels"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        std::fs::read_to_string(&file).unwrap()
    );

    // No change: the file is not rewritten.
    let ino = std::fs::metadata(&file).unwrap().ino();
    assert!(node.ctl(None, &["reload"]).status.success());
    assert_eq!(
        std::fs::metadata(&file).unwrap().ino(),
        ino,
        "rewritten without a change"
    );

    // The 2080 Ti is swapped for a second 3090.
    node.rewrite_topology(|s| {
        s.devices[0].name = "NVIDIA GeForce RTX 3090".into();
        s.devices[0].compute_capability = gpuarch_core::arch::ComputeCapability::new(8, 6);
    });
    // Until gpuarchd reads it, the file describes the GPUs that were there.
    std::fs::copy(&file, root.join("before")).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    let l = labels();
    assert_eq!(get(&l, "sm_86.count").as_deref(), Some("2"));
    assert_eq!(get(&l, "sm_75.count"), None);
    assert_eq!(get(&l, "arch.mixed").as_deref(), Some("false"));
    assert_eq!(get(&l, "bf16.all").as_deref(), Some("true"));
    assert_ne!(std::fs::metadata(&file).unwrap().ino(), ino);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["gpuarch"], "a temporary left beside the file");
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("ok    NFD labels"), "{out}");
    std::fs::copy(root.join("before"), &file).unwrap();
    let (code, out) = doctor_on(&node, root, &snapshot);
    assert!(
        code == 1
            && out.contains("FAIL  NFD labels")
            && out.contains("does not match the inventory"),
        "{out}"
    );

    // Turned off: the labels go with it.
    std::fs::write(node.path("config.yaml"), yaml(false)).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    assert!(
        !file.exists(),
        "labels left after export.nfd was turned off"
    );

    // On again, with NFD's directory gone: gpuarchd says which, once, and
    // serves on.
    std::fs::remove_dir(&dir).unwrap();
    std::fs::write(node.path("config.yaml"), yaml(true)).unwrap();
    assert!(node.ctl(None, &["reload"]).status.success());
    assert!(node.ctl(None, &["reload"]).status.success());
    let log = node.log();
    let warned = log
        .lines()
        .filter(|l| l.contains("cannot keep the Node Feature Discovery labels"))
        .count();
    assert_eq!(warned, 1, "{log}");
    assert!(log.contains("features.d does not exist"), "{log}");
    let (_, out) = doctor_on(&node, root, &snapshot);
    assert!(out.contains("FAIL  NFD labels"), "{out}");
    assert!(node.name_owned());
    node.stop();
}
