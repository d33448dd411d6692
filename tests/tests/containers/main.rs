//! Real containers: runc and crun behind `gpuarch-runtime`, podman with the
//! shipped hooks.d file. Each test builds a busybox-static rootfs, starts a
//! container on the 2080 Ti + 3090 topology and reads what the process
//! inside sees: its env, `/run/gpuarch/env`, mounted kernel packages.
//!
//! Needs root and runc, crun, podman and a static busybox (`.ci/run`
//! installs them); a test whose tool is missing says so and skips.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuarch_tests::containers::{Scene, Seen, nvidia_nodes};
use gpuarch_tests::{artifacts, fixture, image_fixture, need_containers, workspace_root};
use serde_json::{Value, json};

mod engines;
mod hostile;
mod image;
mod jit;
mod kernels;
mod logs;

/// A container started through real runc.
type Start = fn(&Scene, &[&str]) -> Seen;

/// The two ways a container meets gpuarch under plain runc: behind the
/// shim, and with the createContainer hook alone.
fn runc_starts() -> [(&'static str, Start); 2] {
    [
        ("the shim", |s, env| s.shim("runc", env)),
        ("the createContainer hook", |s, env| {
            let hooks = json!({ "createContainer": s.hook_entry("create-container") });
            s.run_bundle("runc", &s.bundle_with("runc", env, Some(hooks)), false)
        }),
    ]
}

/// A real shared library at `out` with `soname`, built by gcc from `code`
/// (its source written in `scratch`).
fn shared_library(scratch: &Path, code: &str, soname: &str, out: &Path) {
    let src = scratch.join(format!("{soname}.c"));
    std::fs::write(&src, code).unwrap();
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(out)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
}

/// A scene whose kernel mount root (returned) holds two packages: `demo`
/// (sm_75 and sm_86, one cubin) and `fa2` (a library for ldconfig).
fn kernel_scene() -> (Scene, PathBuf) {
    let mut s = Scene::new();
    let root = s.path().join("kernels");
    std::fs::create_dir_all(root.join("demo/sm_86")).unwrap();
    std::fs::write(
        root.join("demo/manifest.json"),
        r#"{"package": "demo", "targets": ["sm_75", "sm_86"]}"#,
    )
    .unwrap();
    std::fs::write(root.join("demo/sm_86/demo.cubin"), b"cubin").unwrap();
    library_package(&root, s.path());
    s.config_yaml = format!("kernels:\n  mount_root: {}\n", root.display());
    (s, root)
}

/// Every file under `dir` and its contents, to compare before and after.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let data = std::fs::read(&p).unwrap_or_default();
                out.push((p, data));
            }
        }
    }
    out.sort();
    out
}

/// Add to [`kernel_scene`] a package as gpuarchd publishes it: `saxpy`,
/// its one build (sm_86) an entry of the store at `cache/` in the scene,
/// and the config that serves it (views in `cache/views`).
fn with_published(s: &mut Scene, root: &Path) {
    let key = "ab".repeat(32);
    let build = s.path().join("cache/objects/ab").join(&key);
    std::fs::create_dir_all(&build).unwrap();
    std::fs::write(build.join("saxpy.cubin"), b"cubin 86").unwrap();
    std::fs::create_dir_all(root.join("saxpy")).unwrap();
    std::fs::write(
        root.join("saxpy/manifest.json"),
        json!({
            "schema": 2, "package": "saxpy", "version": "1", "description": "",
            "targets": ["sm_86"],
            "builds": [{"arch": "sm_86", "variant": "fp32", "dtype": "float32", "key": key,
                        "dir": build, "files": ["saxpy.cubin"], "toolkit": "nvrtc 13.0"}],
            "unavailable": [], "pending": []
        })
        .to_string(),
    )
    .unwrap();
    // The 3090 (8.6) runs sm_80 SASS: fa2 serves it too.
    s.config_yaml = format!(
        "kernels:\n  mount_root: {}\n  cache_dir: {}\n  spool_dir: {}\n",
        root.display(),
        s.path().join("cache").display(),
        s.path().join("spool").display()
    );
}

/// A JIT bundle: `uid`, the CRI runtime's image annotation, a marker.
fn jit_bundle(
    s: &Scene,
    runtime: &str,
    uid: u32,
    image: &str,
    env: &[&str],
    hooks: Option<Value>,
) -> PathBuf {
    let b = s.bundle_with(runtime, env, hooks);
    let path = b.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    c["process"]["user"] = json!({"uid": uid, "gid": uid});
    c["annotations"] = json!({"io.kubernetes.cri.image-name": image});
    std::fs::write(&path, c.to_string()).unwrap();
    b
}

/// Package `fa2` under `root`, for sm_80 and up, holding one shared library
/// (`lib/libgpuarchdemo.so.1`, built with gcc in `scratch`).
fn library_package(root: &Path, scratch: &Path) {
    let lib = root.join("fa2/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(
        root.join("fa2/manifest.json"),
        r#"{"targets": ["sm_80"], "libraries": ["lib"]}"#,
    )
    .unwrap();
    shared_library(
        scratch,
        "int gpuarch_demo(void) { return 86; }\n",
        "libgpuarchdemo.so.1",
        &lib.join("libgpuarchdemo.so.1"),
    );
}
