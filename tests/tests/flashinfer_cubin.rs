//! FlashInfer's own cubins served to real containers, offline.
//!
//! The node imports the real `flashinfer-cubin` 0.6.13 wheel and lays out
//! the tree for each GPU's capability (`gpuarch_kernels::library`); the
//! image holds the real `flashinfer-python` 0.6.13 and Debian's Python. In
//! each container (runc, no network) FlashInfer's own loader
//! (tests/fixtures/flashinfer/probe.py) looks up every trtllm-gen FMHA cubin
//! it would load on that GPU, each checked against FlashInfer's own
//! checksums, links its GEMM export headers, and fetches into a directory
//! of a module the wheel leaves out.
//!
//! Needs root, runc, /usr/bin/python3.11 with filelock and requests
//! (python3-filelock, python3-requests), and the two wheels, which
//! scripts/test downloads (GPUARCH_FLASHINFER_CUBIN_WHEEL,
//! GPUARCH_FLASHINFER_PYTHON_WHEEL).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuarch_core::arch::ComputeCapability;
use gpuarch_kernels::library::{self, Limits};
use gpuarch_tests::containers::{Scene, missing};
use gpuarch_tests::{fixture, skip, workspace_root};
use serde_json::{Value, json};

const PYTHON: &str = "/usr/bin/python3.11";
const SITE: &str = "usr/local/lib/python3.11/dist-packages";
const MOUNT: &str = "/opt/gpuarch/libraries/flashinfer-cubin";

fn wheels() -> Result<(PathBuf, PathBuf), String> {
    let get = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_file())
            .ok_or_else(|| {
                format!("{var} names no wheel (scripts/test downloads FlashInfer 0.6.13's)")
            })
    };
    Ok((
        get("GPUARCH_FLASHINFER_CUBIN_WHEEL")?,
        get("GPUARCH_FLASHINFER_PYTHON_WHEEL")?,
    ))
}

fn python_ready() -> Option<String> {
    let ok = Command::new(PYTHON)
        .args(["-c", "import filelock, requests"])
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| {
        format!(
            "{PYTHON} with filelock and requests (apt install python3-filelock python3-requests)"
        )
    })
}

/// An image of Debian's Python (the host's /usr, bound read-only) with
/// flashinfer-python unpacked into /usr/local, as `pip install` puts it.
fn image(dir: &Path, flashinfer_python: &Path) -> PathBuf {
    let root = dir.join("image");
    for d in [
        "etc",
        "run",
        "proc",
        "sys",
        "dev",
        "tmp",
        "opt",
        "root",
        "usr/bin",
        "usr/lib",
        "usr/lib64",
        SITE,
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for l in ["bin", "lib", "lib64", "sbin"] {
        let target = if l == "sbin" {
            "usr/bin".to_owned()
        } else {
            format!("usr/{l}")
        };
        symlink(target, root.join(l)).unwrap();
    }
    std::fs::write(root.join("etc/hostname"), "probe\n").unwrap();
    std::fs::copy(
        workspace_root().join("tests/fixtures/flashinfer/probe.py"),
        root.join("probe.py"),
    )
    .unwrap();
    let o = Command::new(PYTHON)
        .args(["-m", "zipfile", "-e"])
        .arg(flashinfer_python)
        .arg(root.join(SITE))
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    root
}

/// One container on `image` with GPU `gpu` of the fixture: through
/// gpuarch-runtime or straight to runc. The probe's JSON and the hook's
/// log.
fn run(scene: &Scene, image: &Path, gpu: &str, cap: &str, shim: bool) -> (Value, String) {
    let env = format!("NVIDIA_VISIBLE_DEVICES={gpu}");
    let bundle = scene.bundle_on(image, "runc", &[&env], None);
    let cfg_path = bundle.join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    c["process"]["args"] = json!([PYTHON, "/probe.py", cap]);
    // /etc/ssl: with its CA bundle, FlashInfer's download gets as far as
    // the network, which the container does not have.
    for d in ["/usr/bin", "/usr/lib", "/usr/lib64", "/etc/ssl"] {
        c["mounts"].as_array_mut().unwrap().push(json!({
            "destination": d, "type": "bind", "source": d,
            "options": ["rbind", "ro", "nosuid", "nodev"],
        }));
    }
    std::fs::write(&cfg_path, c.to_string()).unwrap();
    let config = scene.config_file(Some(&gpuarch_tests::which("runc").unwrap()));
    let o = scene
        .bundle_cmd("runc", &bundle, shim, &config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().last().unwrap_or("");
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {stdout}\nstderr {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (v, scene.take_log())
}

#[test]
fn flashinfers_own_loader_finds_every_cubin_for_its_gpu_offline_and_no_other() {
    gpuarch_tests::skip_unless!(missing(&["runc"]));
    let (cubin_wheel, python_wheel) = match wheels() {
        Ok(w) => w,
        Err(why) => return skip(&why),
    };
    gpuarch_tests::skip_unless!(python_ready());

    let mut scene = Scene::new();
    scene.inventory = Some(fixture("blackwell-mix"));
    let cache = scene.path().join("cache");
    let libraries = cache.join("libraries");
    let f = std::fs::File::open(&cubin_wheel).unwrap();
    let index = library::import_wheel(
        &libraries,
        &f,
        &library::Source::file("flashinfer_cubin-0.6.13-py3-none-any.whl"),
        &Limits::for_store(8 << 30),
    )
    .unwrap();
    for cap in ["10.3", "12.1"] {
        let c = ComputeCapability::parse_known(cap).unwrap();
        library::serve(&libraries, &index.dist, &index.version, &[c]).unwrap();
    }
    scene.config_yaml = format!(
        "kernels:\n  cache_dir: {}\n  mount_root: {}\n  spool_dir: {}\n",
        cache.display(),
        scene.path().join("packages").display(),
        scene.path().join("spool").display(),
    );
    let image = image(scene.path(), &python_wheel);

    // A B300 (10.3) through gpuarch: FlashInfer finds every FMHA cubin it
    // would load there, each matching its own checksum list, none of
    // another arch's is there, its GEMM headers link and verify, and a
    // module the wheel lacks can be fetched into its directory.
    let (seen, log) = run(&scene, &image, "1", "10.3", true);
    assert_eq!(seen["env"], MOUNT, "{seen}\n{log}");
    assert_eq!(seen["cubin_dir"], MOUNT);
    assert_eq!(seen["checksums"], true, "{seen}");
    let found = seen["found"].as_u64().unwrap();
    assert!(found > 10_000, "{seen}");
    assert_eq!(
        (
            seen["missing"].as_u64(),
            seen["other_arch_present"].as_u64()
        ),
        (Some(0), Some(0)),
        "{seen}"
    );
    assert!(
        seen["gemm_headers"].as_u64().is_some_and(|n| n > 0),
        "{seen}"
    );
    assert_eq!(seen["fetch_into_missing_dir"], true, "{seen}");
    eprintln!(
        "B300: FlashInfer found {found} FMHA cubins ({} bytes) in place, offline",
        seen["found_bytes"]
    );

    // Control: the same container without gpuarch. FlashInfer looks in its
    // own cache, tries to download its checksum list, and fails.
    let (seen, _) = run(&scene, &image, "1", "10.3", false);
    assert_eq!(seen["env"], Value::Null);
    assert!(
        seen["cubin_dir"]
            .as_str()
            .unwrap()
            .ends_with(".cache/flashinfer/cubins"),
        "{seen}"
    );
    assert_eq!(seen["checksums"], false, "{seen}");
    assert_eq!(
        seen["error"],
        Value::Null,
        "its download failed otherwise: {seen}"
    );

    // A GB10 (12.1): flashinfer-cubin holds nothing for it.
    let (seen, log) = run(&scene, &image, "0", "12.1", true);
    assert_eq!(seen["env"], Value::Null, "{seen}");
    assert!(log.contains("has no kernels for 12.1"), "{log}");

    // Another FlashInfer in the image than the node imported.
    let site = image.join(SITE);
    std::fs::rename(
        site.join("flashinfer_python-0.6.13.dist-info"),
        site.join("flashinfer_python-0.6.12.dist-info"),
    )
    .unwrap();
    let (seen, log) = run(&scene, &image, "1", "10.3", true);
    assert_eq!(seen["env"], Value::Null, "{seen}");
    assert!(
        log.contains("the node has no flashinfer-cubin 0.6.12"),
        "{log}"
    );
}
