//! Unit tests of `container/src/edit.rs`.

use super::*;
use crate::context::SAFE_PATH;
use gpuarch_core::config::{Config, EnvConfig};
use gpuarch_core::snapshot::Snapshot;
use std::path::Path;
use std::path::PathBuf;

pub(crate) fn host() -> Snapshot {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/2080ti-3090.json"
    );
    Snapshot::from_json(&std::fs::read(path).unwrap()).unwrap()
}

pub(crate) fn ctx(config: Config) -> Context {
    Context {
        inventory: host(),
        config,
        hook_path: Some(PathBuf::from("/usr/bin/gpuarch-hook")),
        hook_env: vec![format!("PATH={SAFE_PATH}")],
        env_files: false,
    }
}

fn config(env: &[&str]) -> Value {
    json!({
        "ociVersion": "1.2.0",
        "process": {"args": ["sh"], "env": env, "user": {"uid": 0, "gid": 0}},
        "root": {"path": "rootfs", "readonly": true},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": {"org.example/x": "y"},
        "linux": {"namespaces": [{"type": "pid"}], "resources": {"devices": [{"allow": false, "access": "rwm"}]}},
        "vendor.example/unknown": {"nested": [1, 2.5, null, "s"], "big": 18446744073709551615u64}
    })
}

fn env_of(v: &Value) -> Vec<String> {
    v["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn precreate_adds_env_and_preserves_every_other_field() {
    let input = config(&["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0,1"]);
    let (out, plan) = precreate(input.to_string().as_bytes(), &ctx(Config::default())).unwrap();
    let out: Value = serde_json::from_slice(&out).unwrap();
    let env = env_of(&out);
    assert!(
        env.contains(&"TORCH_CUDA_ARCH_LIST=7.5;8.6".to_owned()),
        "{env:?}"
    );
    assert!(env.contains(&"GPUARCH_DTYPE=float16".to_owned()));
    assert_eq!(&env[..2], ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0,1"]);
    assert_eq!(env.len(), 2 + plan.env.len());
    // Nothing to do inside the container: no hook entry.
    assert!(out.get("hooks").is_none(), "{out}");
    // Everything but what gpuarch owns is exactly as it came in.
    let mut a = out.clone();
    let mut b = input.clone();
    a["process"]["env"] = Value::Null;
    b["process"]["env"] = Value::Null;
    assert_eq!(a, b);
}

#[test]
fn numbers_come_out_with_the_digits_they_came_in_with() {
    let input = br#"{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
        "x-vendor": {"a": 1.10, "b": -99999999999999999999999, "c": 0.1000000000000000055511151231257827, "d": 1e400}}"#;
    let (out, plan) = precreate(input, &ctx(Config::default())).unwrap();
    assert!(!plan.is_noop());
    let out = String::from_utf8(out).unwrap();
    for digits in [
        "\"a\":1.10",
        "\"b\":-99999999999999999999999",
        "\"c\":0.1000000000000000055511151231257827",
    ] {
        assert!(out.contains(digits), "{digits} lost: {out}");
    }
    assert!(
        out.contains("\"d\":1e+400") || out.contains("\"d\":1e400"),
        "{out}"
    );
}

#[test]
fn mounted_libraries_add_our_hook_once_beside_existing_ones() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("pkg/lib")).unwrap();
    std::fs::write(
        tmp.path().join("pkg/manifest.json"),
        r#"{"targets": ["sm_86"], "libraries": ["lib"]}"#,
    )
    .unwrap();
    let mut cfg = Config::default();
    cfg.kernels.mount_root = tmp.path().to_owned();
    let cx = ctx(cfg);
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=1"]);
    c["hooks"] = json!({"prestart": [{"path": "/x"}], "createContainer": [{"path": "/y"}]});
    edit(&mut c, &cx).unwrap();
    edit(&mut c, &cx).unwrap();
    assert_eq!(c["hooks"]["prestart"], json!([{"path": "/x"}]));
    let cc = c["hooks"]["createContainer"].as_array().unwrap();
    assert_eq!(cc.len(), 2, "{cc:?}");
    assert_eq!(cc[0], json!({"path": "/y"}));
    assert_eq!(cc[1]["path"], "/usr/bin/gpuarch-hook");
    assert_eq!(cc[1]["args"], json!(["gpuarch-hook", "create-container"]));
    assert_eq!(cc[1]["timeout"], 6);
    assert_eq!(cc[1]["env"], json!([format!("PATH={SAFE_PATH}")]));
}

#[test]
fn no_gpu_or_opt_out_passes_the_bytes_through_untouched() {
    for env in [
        &["PATH=/bin"][..],
        &["NVIDIA_VISIBLE_DEVICES=all", "GPUARCH_DISABLE=1"],
    ] {
        let input = format!("{}\n", config(env));
        let (out, plan) = precreate(input.as_bytes(), &ctx(Config::default())).unwrap();
        assert!(plan.is_noop());
        assert_eq!(out, input.as_bytes());
    }
}

#[test]
fn container_values_are_kept_unless_override() {
    let input = config(&["NVIDIA_VISIBLE_DEVICES=1", "TORCH_CUDA_ARCH_LIST=8.0"]).to_string();
    let (out, _) = precreate(input.as_bytes(), &ctx(Config::default())).unwrap();
    let env = env_of(&serde_json::from_slice(&out).unwrap());
    let torch: Vec<_> = env
        .iter()
        .filter(|e| e.starts_with("TORCH_CUDA_ARCH_LIST="))
        .collect();
    assert_eq!(torch, ["TORCH_CUDA_ARCH_LIST=8.0"]);

    let cfg = Config {
        env: EnvConfig {
            override_existing: true,
            ..EnvConfig::default()
        },
        ..Config::default()
    };
    let (out, _) = precreate(input.as_bytes(), &ctx(cfg)).unwrap();
    let env = env_of(&serde_json::from_slice(&out).unwrap());
    let torch: Vec<_> = env
        .iter()
        .filter(|e| e.starts_with("TORCH_CUDA_ARCH_LIST="))
        .collect();
    assert_eq!(torch, ["TORCH_CUDA_ARCH_LIST=8.6"]);
}

#[test]
fn kernel_packages_are_mounted_only_when_they_serve_every_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = |name: &str, manifest: &str| {
        std::fs::create_dir_all(tmp.path().join(name)).unwrap();
        std::fs::write(tmp.path().join(name).join("manifest.json"), manifest).unwrap();
    };
    pkg("both", r#"{"targets": ["sm_75", "sm_86"]}"#);
    pkg("ampere-only", r#"{"targets": ["sm_80"]}"#);
    pkg("broken", "{");
    let mut cfg = Config::default();
    cfg.kernels.mount_root = tmp.path().to_owned();
    let cx = ctx(cfg);

    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=0,1"]);
    let plan = edit(&mut c, &cx).unwrap();
    let mounts = c["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    assert_eq!(mounts[1]["destination"], "/opt/gpuarch/kernels/both");
    assert_eq!(mounts[1]["options"][1], "ro");
    // The Plan names the mount it added, and only that one.
    assert_eq!(plan.mounts.len(), 1, "{:?}", plan.mounts);
    assert_eq!(plan.mounts[0].destination, "/opt/gpuarch/kernels/both");
    assert_eq!(plan.mounts[0].source, mounts[1]["source"]);
    assert_eq!(
        plan.env_get("GPUARCH_KERNELS_DIR"),
        Some("/opt/gpuarch/kernels")
    );
    let notes = plan.notes.join("\n");
    assert!(
        notes.contains("ampere-only not mounted: no build in it runs on GPU 0"),
        "{notes}"
    );
    assert!(notes.contains("broken skipped: manifest.json"), "{notes}");

    // GPU 1 alone (8.6) is served by sm_80 SASS too.
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=1"]);
    edit(&mut c, &cx).unwrap();
    assert_eq!(c["mounts"].as_array().unwrap().len(), 3);
}

/// `root/saxpy/manifest.json` as gpuarchd publishes it, its one build
/// (sm_75) in `build75`.
fn published(root: &Path, build75: &Path) {
    std::fs::create_dir_all(root.join("saxpy")).unwrap();
    std::fs::write(
        root.join("saxpy/manifest.json"),
        // As gpuarchd publishes it.
        serde_json::to_string(&gpuarch_wire::manifest::Published {
            schema: gpuarch_wire::manifest::SCHEMA,
            package: "saxpy".into(),
            version: "1".into(),
            description: String::new(),
            targets: vec!["sm_75".into()],
            builds: vec![gpuarch_wire::manifest::Build {
                arch: "sm_75".into(),
                variant: "fp32".into(),
                dtype: Some("float32".into()),
                key: "sm75".into(),
                dir: build75.to_owned(),
                files: vec!["saxpy.cubin".into()],
                toolkit: "nvrtc 13.0".into(),
            }],
            unavailable: vec![],
            pending: vec![],
            imported: false,
            ldconfig: false,
        })
        .unwrap(),
    )
    .unwrap();
}

#[test]
fn published_builds_are_mounted_per_gpu_and_a_miss_is_requested() {
    let tmp = tempfile::tempdir().unwrap();
    let build75 = tmp.path().join("cache/objects/ab/sm75");
    std::fs::create_dir_all(&build75).unwrap();
    let root = tmp.path().join("mount");
    std::fs::write(build75.join("saxpy.cubin"), b"cubin").unwrap();
    published(&root, &build75);
    let mut cfg = Config::default();
    cfg.kernels.mount_root = root;
    cfg.kernels.spool_dir = tmp.path().join("spool");
    cfg.kernels.view_dir = Some(tmp.path().join("views"));
    cfg.kernels.cache_dir = tmp.path().join("cache");
    let cx = ctx(cfg);

    // GPU 1 (8.6): nothing runs there yet; asked for, not mounted.
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=1"]);
    let plan = edit(&mut c, &cx).unwrap();
    assert!(tmp.path().join("spool/saxpy@sm_86").is_file());
    assert!(
        c["mounts"].as_array().unwrap().len() == 1,
        "{}",
        c["mounts"]
    );
    let notes = plan.notes.join("\n");
    assert!(
        notes.contains("no sm_86 build yet; requested it from gpuarchd"),
        "{notes}"
    );

    // Both GPUs: the sm_75 build serves GPU 0; GPU 1 is missing. The
    // container's view holds hard links of the build's files: one
    // mount in all, of the whole kernels directory.
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=0,1"]);
    let plan = edit(&mut c, &cx).unwrap();
    let mounts = c["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 2, "{mounts:?}");
    assert_eq!(mounts[1]["destination"], "/opt/gpuarch/kernels");
    assert_eq!(mounts[1]["options"][1], "ro");
    let view = std::path::PathBuf::from(mounts[1]["source"].as_str().unwrap());
    assert!(view.starts_with(tmp.path().join("views")));
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    assert_eq!(
        ino(&view.join("saxpy/sm_75/saxpy.cubin")),
        ino(&build75.join("saxpy.cubin")),
        "a hard link of the store's file"
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(view.join("saxpy/manifest.json")).unwrap()).unwrap();
    assert_eq!(m["gpus"][0]["files"][0], "sm_75/saxpy.cubin");
    assert_eq!(m["builds"][0]["key"], "sm75");
    assert!(
        m["gpus"][1]["missing"]
            .as_str()
            .unwrap()
            .contains("no build runs on GPU 1")
    );
    assert!(
        plan.notes.join("\n").contains("already requested"),
        "{:?}",
        plan.notes
    );
    // The same GPUs again share the view, and renew its time (gpuarchd
    // sweeps views no one mounts once that is 10 minutes old).
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::open(&view)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let mut c2 = config(&["NVIDIA_VISIBLE_DEVICES=0,1"]);
    edit(&mut c2, &cx).unwrap();
    assert_eq!(c2["mounts"][1]["source"], mounts[1]["source"]);
    let age = std::fs::metadata(&view)
        .unwrap()
        .modified()
        .unwrap()
        .elapsed()
        .unwrap();
    assert!(age < std::time::Duration::from_secs(60), "{age:?}");
    assert_eq!(
        std::fs::read_dir(tmp.path().join("views")).unwrap().count(),
        1
    );
    // A build rebuilt under the same key (new files, new inodes) gets a
    // new view, never the old one's files.
    std::fs::remove_file(build75.join("saxpy.cubin")).unwrap();
    std::fs::write(build75.join("saxpy.cubin"), b"rebuilt").unwrap();
    let mut c3 = config(&["NVIDIA_VISIBLE_DEVICES=0,1"]);
    edit(&mut c3, &cx).unwrap();
    let view3 = std::path::PathBuf::from(c3["mounts"][1]["source"].as_str().unwrap());
    assert_ne!(view3, view);
    assert_eq!(
        std::fs::read(view3.join("saxpy/sm_75/saxpy.cubin")).unwrap(),
        b"rebuilt"
    );
}

/// Views off the store's filesystem cannot hold hard links of its
/// files: each build is then bound on its own, and a note says why.
#[test]
fn views_off_the_stores_filesystem_bind_each_build() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir_in("/dev/shm").unwrap();
    assert_ne!(
        std::fs::metadata(tmp.path()).unwrap().dev(),
        std::fs::metadata(elsewhere.path()).unwrap().dev(),
        "this test needs /dev/shm on another filesystem than the temp dir"
    );
    let build75 = tmp.path().join("cache/objects/ab/sm75");
    std::fs::create_dir_all(&build75).unwrap();
    std::fs::write(build75.join("saxpy.cubin"), b"cubin").unwrap();
    let root = tmp.path().join("mount");
    published(&root, &build75);
    let mut cfg = Config::default();
    cfg.kernels.mount_root = root;
    cfg.kernels.spool_dir = tmp.path().join("spool");
    cfg.kernels.view_dir = Some(elsewhere.path().join("views"));
    cfg.kernels.cache_dir = tmp.path().join("cache");
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let plan = edit(&mut c, &ctx(cfg)).unwrap();
    let mounts = c["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 3, "{mounts:?}");
    assert_eq!(mounts[1]["destination"], "/opt/gpuarch/kernels");
    let view = Path::new(mounts[1]["source"].as_str().unwrap());
    assert!(view.join("saxpy/manifest.json").is_file());
    assert_eq!(
        std::fs::read_dir(view.join("saxpy/sm_75")).unwrap().count(),
        0,
        "an empty mount point"
    );
    assert_eq!(mounts[2]["destination"], "/opt/gpuarch/kernels/saxpy/sm_75");
    assert_eq!(mounts[2]["source"], build75.to_str().unwrap());
    let notes = plan.notes.join("\n");
    assert!(
        notes.contains("is not on the kernel store's filesystem, so each build is one more mount"),
        "{notes}"
    );
}

/// One view holds the published packages and a mount point for each
/// hand-made one; a container that mounts its own things under the
/// kernels' directory keeps them, and gets each package on its own.
#[test]
fn one_view_for_every_package_and_the_containers_own_mounts_win() {
    let tmp = tempfile::tempdir().unwrap();
    let build75 = tmp.path().join("cache/objects/ab/sm75");
    std::fs::create_dir_all(&build75).unwrap();
    std::fs::write(build75.join("saxpy.cubin"), b"cubin").unwrap();
    let root = tmp.path().join("mount");
    published(&root, &build75);
    std::fs::create_dir_all(root.join("both")).unwrap();
    std::fs::write(
        root.join("both/manifest.json"),
        r#"{"targets": ["sm_75", "sm_86"]}"#,
    )
    .unwrap();
    let mut cfg = Config::default();
    cfg.kernels.mount_root = root.clone();
    cfg.kernels.spool_dir = tmp.path().join("spool");
    cfg.kernels.view_dir = Some(tmp.path().join("views"));
    cfg.kernels.cache_dir = tmp.path().join("cache");
    let cx = ctx(cfg);
    let dests = |c: &Value| -> Vec<(String, String)> {
        c["mounts"].as_array().unwrap()[1..]
            .iter()
            .map(|m| {
                (
                    m["destination"].as_str().unwrap().to_owned(),
                    m["source"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };

    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=0"]);
    let plan = edit(&mut c, &cx).unwrap();
    let got = dests(&c);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, "/opt/gpuarch/kernels");
    let view = Path::new(&got[0].1);
    assert!(view.join("saxpy/sm_75/saxpy.cubin").is_file());
    assert_eq!(std::fs::read_dir(view.join("both")).unwrap().count(), 0);
    assert_eq!(
        got[1],
        (
            "/opt/gpuarch/kernels/both".to_owned(),
            root.join("both").display().to_string()
        )
    );
    let notes = plan.notes.join("\n");
    assert!(
        notes.contains(
            "kernel packages mounted read-only in /opt/gpuarch/kernels (2 mounts): both, saxpy"
        ),
        "{notes}"
    );

    // The container mounts its own `both`: kept; saxpy comes on its own.
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=0"]);
    c["mounts"].as_array_mut().unwrap().push(
        json!({"destination": "/opt/gpuarch/kernels/both/", "type": "bind", "source": "/srv/both"}),
    );
    let plan = edit(&mut c, &cx).unwrap();
    let got = dests(&c);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].0, "/opt/gpuarch/kernels/both/");
    assert_eq!(got[1].0, "/opt/gpuarch/kernels/saxpy");
    assert_eq!(Path::new(&got[1].1), view.join("saxpy"));
    assert!(
        plan.notes.join("\n").contains(
            "/opt/gpuarch/kernels/both is already mounted by the container: kernel package both not mounted"
        ),
        "{:?}",
        plan.notes
    );
    assert_eq!(
        plan.env_get("GPUARCH_KERNELS_DIR"),
        Some("/opt/gpuarch/kernels")
    );

    // It mounts the directory itself: none of ours.
    let mut c = config(&["NVIDIA_VISIBLE_DEVICES=0"]);
    c["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/opt/gpuarch/kernels", "type": "bind", "source": "/srv/k"}));
    let plan = edit(&mut c, &cx).unwrap();
    assert_eq!(dests(&c).len(), 1);
    assert!(
        plan.notes.join("\n").contains(
            "/opt/gpuarch/kernels is already mounted by the container: no kernel packages mounted"
        ),
        "{:?}",
        plan.notes
    );
    assert_eq!(plan.env_get("GPUARCH_KERNELS_DIR"), None);
}

#[test]
fn bad_configs_are_errors_not_panics() {
    let c = ctx(Config::default());
    assert!(matches!(
        precreate(b"{\"process\":", &c),
        Err(HookError::Oci(oci::OciError::Syntax { .. }))
    ));
    assert!(matches!(precreate(b"[1]", &c), Err(HookError::Oci(_))));
    let no_process = json!({"annotations": {"cdi.k8s.io/g": "nvidia.com/gpu=0"}}).to_string();
    let e = precreate(no_process.as_bytes(), &c).unwrap_err();
    assert!(e.to_string().contains("no \"process\" object"), "{e}");
    let mut bad_env = config(&[]);
    bad_env["process"]["env"] = json!("NVIDIA_VISIBLE_DEVICES=0");
    let e = edit(&mut bad_env, &c).unwrap_err();
    assert!(e.to_string().contains("expected a sequence"), "{e}");
    // From bytes, the same mistake comes with its line and column.
    let e = precreate(bad_env.to_string().as_bytes(), &c).unwrap_err();
    assert!(e.to_string().contains("at line 1, column"), "{e}");
}

#[test]
fn a_hundred_thousand_env_entries_are_handled() {
    let mut env: Vec<String> = (0..100_000).map(|i| format!("V{i}=x")).collect();
    env.push("NVIDIA_VISIBLE_DEVICES=1".into());
    let refs: Vec<&str> = env.iter().map(String::as_str).collect();
    let input = config(&refs).to_string();
    let t = std::time::Instant::now();
    let (out, plan) = precreate(input.as_bytes(), &ctx(Config::default())).unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        env_of(&serde_json::from_slice(&out).unwrap()).len(),
        100_001 + plan.env.len()
    );
}
