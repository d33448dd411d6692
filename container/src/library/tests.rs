//! Unit tests of `container/src/library.rs`: when a container gets a library.

use super::*;
use gpuarch_core::config::EnvConfig;
use serde_json::json;

const MOUNT: &str = "/opt/gpuarch/libraries/flashinfer-cubin";

/// A container given the 3090 (8.6) of the test host, whose image holds
/// `dists` (PEP 503 name, version), with `env`.
fn container(dists: &[(&str, &str)], env: &[&str]) -> (Plan, ContainerView) {
    let mut all = vec!["NVIDIA_VISIBLE_DEVICES=1"];
    all.extend_from_slice(env);
    let config = json!({
        "process": {"args": ["sh"], "env": all},
        "root": {"path": "rootfs"},
    });
    let mut view = ContainerView::from_value(&config).unwrap();
    for (d, v) in dists {
        view.software.exact.insert((*d).to_owned(), (*v).to_owned());
    }
    let plan = gpuarch_core::plan::plan(&view, &crate::edit::tests::host(), &EnvConfig::default());
    assert_eq!(plan.gpus.len(), 1);
    (plan, view)
}

fn served(code_files: u64, missing: &[&str]) -> Served {
    Served {
        schema: SCHEMA,
        caps: vec!["8.6".into()],
        files: code_files + 2,
        bytes: 1000,
        code_files,
        fetch_dirs: vec!["801e/fmha/cute-dsl/x86_64/sm_86".into()],
        scratch_dirs: vec!["flashinfer".into()],
        missing: missing.iter().map(|m| (*m).to_owned()).collect(),
        missing_count: missing.len() as u64,
    }
}

/// A node holding flashinfer-cubin `version`, its tree for 8.6 `s`.
fn node(version: &str, s: &Served) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let (tree, side) = tree_paths(t.path(), "flashinfer-cubin", version, "8.6");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(side, serde_json::to_vec(s).unwrap()).unwrap();
    t
}

fn run(root: &Path, plan: &mut Plan, view: &ContainerView, existing: &[&str]) -> Vec<LibraryMount> {
    let existing: Vec<String> = existing.iter().map(|s| (*s).to_owned()).collect();
    super::plan(root, plan, view, &existing, &EnvConfig::default())
}

fn cubin_dir(plan: &Plan) -> Option<&str> {
    plan.env
        .iter()
        .find(|(k, _)| k == "FLASHINFER_CUBIN_DIR")
        .map(|(_, v)| v.as_str())
}

fn noted(plan: &Plan, what: &str) -> bool {
    plan.notes
        .iter()
        .any(|n| n.contains("FLASHINFER_CUBIN_DIR") && n.contains(what))
}

#[test]
fn the_images_flashinfer_version_gets_its_tree_and_its_writable_places() {
    let node = node("0.6.13", &served(10, &[]));
    let (mut plan, view) = container(&[("flashinfer-python", "0.6.13")], &[]);
    let libs = run(node.path(), &mut plan, &view, &["/proc"]);
    assert_eq!(libs.len(), 1, "{:?}", plan.notes);
    assert_eq!(cubin_dir(&plan), Some(MOUNT));
    let mounts = libs[0].oci_mounts();
    let dest: Vec<&str> = mounts
        .iter()
        .map(|m| m["destination"].as_str().unwrap())
        .collect();
    assert_eq!(
        dest,
        [
            MOUNT.to_owned(),
            format!("{MOUNT}/flashinfer"),
            format!("{MOUNT}/801e/fmha/cute-dsl/x86_64/sm_86"),
        ]
    );
    assert_eq!(mounts[0]["type"], "bind");
    assert!(
        mounts[0]["options"]
            .as_array()
            .unwrap()
            .contains(&json!("ro"))
    );
    assert!(mounts[1..].iter().all(|m| m["type"] == "tmpfs"));
}

/// What, the tree, the image's dists, the env, the container's mounts,
/// and the note expected.
type Case<'a> = (
    &'a str,
    Served,
    Vec<(&'a str, &'a str)>,
    Vec<&'a str>,
    Vec<&'a str>,
    &'a str,
);

#[test]
fn anything_else_leaves_the_variable_unset_and_says_why() {
    let complete = served(10, &[]);
    let cases: Vec<Case> = vec![
        // The image's own flashinfer-cubin wins in FlashInfer.
        (
            "own copy",
            complete.clone(),
            vec![
                ("flashinfer-python", "0.6.13"),
                ("flashinfer-cubin", "0.6.13"),
            ],
            vec![],
            vec![],
            "its own flashinfer-cubin",
        ),
        // Another FlashInfer than the node imported.
        (
            "version",
            complete.clone(),
            vec![("flashinfer-python", "0.6.12")],
            vec![],
            vec![],
            "no flashinfer-cubin 0.6.12",
        ),
        // A missing file among the kernels: FlashInfer could not fetch it.
        (
            "incomplete",
            served(10, &["158f/fmha/trtllm-gen/fmhaSm86Kernel.cubin"]),
            vec![("flashinfer-python", "0.6.13")],
            vec![],
            vec![],
            "lacks 1 file",
        ),
        // Nothing in the library runs on these GPUs.
        (
            "no code",
            served(0, &[]),
            vec![("flashinfer-python", "0.6.13")],
            vec![],
            vec![],
            "no kernels for 8.6",
        ),
        // The container's own mount there.
        (
            "own mount",
            complete.clone(),
            vec![("flashinfer-python", "0.6.13")],
            vec![],
            vec!["/opt/gpuarch"],
            "mounts /opt/gpuarch itself",
        ),
        // A tree whose writable places would leave the mount.
        (
            "hostile tree",
            Served {
                fetch_dirs: vec!["../../../etc".into()],
                ..complete.clone()
            },
            vec![("flashinfer-python", "0.6.13")],
            vec![],
            vec![],
            "not a plain relative directory",
        ),
        // A tree with more writable places than an import lets through
        // (a store written before the bound): no mount bomb.
        (
            "many places",
            Served {
                fetch_dirs: (0..40_000).map(|i| format!("d{i}")).collect(),
                ..complete.clone()
            },
            vec![("flashinfer-python", "0.6.13")],
            vec![],
            vec![],
            "40001 writable places: a container is given at most 72",
        ),
    ];
    for (what, s, dists, env, existing, why) in cases {
        let node = node("0.6.13", &s);
        let (mut plan, view) = container(&dists, &env);
        let libs = run(node.path(), &mut plan, &view, &existing);
        assert!(libs.is_empty(), "{what}");
        assert_eq!(cubin_dir(&plan), None, "{what}");
        assert!(noted(&plan, why), "{what}: {:?}", plan.notes);
    }

    // An environment not read may hold another FlashInfer, or its own
    // flashinfer-cubin: the version found is not known to be imported.
    let partly = node("0.6.13", &complete);
    let (mut plan, mut view) = container(&[("flashinfer-python", "0.6.13")], &[]);
    view.software.unread = vec!["\"/opt/x/bin/python3\": no lib/python3.* under \"/opt/x\"".into()];
    assert!(run(partly.path(), &mut plan, &view, &[]).is_empty());
    assert_eq!(cubin_dir(&plan), None);
    assert!(
        noted(&plan, "not every environment of the image was read"),
        "{:?}",
        plan.notes
    );

    // The container's own value is left alone (the Plan's usual rule).
    let node = node("0.6.13", &complete);
    let (mut plan, view) = container(
        &[("flashinfer-python", "0.6.13")],
        &["FLASHINFER_CUBIN_DIR=/mine"],
    );
    assert!(run(node.path(), &mut plan, &view, &[]).is_empty());
    assert_eq!(cubin_dir(&plan), None);

    // No FlashInfer in the image: nothing, and no note about it.
    let (mut plan, view) = container(&[], &[]);
    assert!(run(node.path(), &mut plan, &view, &[]).is_empty());
    assert!(
        !plan
            .notes
            .iter()
            .any(|n| n.contains("FLASHINFER_CUBIN_DIR"))
    );
}
