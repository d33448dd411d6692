//! What gpuarch runs as root must be root's (issue 17, break 4): a kernel
//! package that another user owns is never built, so its `command` never
//! runs; a runtime another user owns is never exec'd by the shim; and a
//! config another user could write is not obeyed. Each case is shown to
//! run as root once the file is root's, so the check is what stops it.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuarch_tests::daemon::{Node, Policy, kernels_yaml};
use gpuarch_tests::{artifacts, cannot_run};

const NOBODY: u32 = 65534;

fn chown_r(p: &Path, uid: u32) {
    let st = Command::new("chown")
        .arg("-R")
        .arg(uid.to_string())
        .arg(p)
        .status()
        .unwrap();
    assert!(st.success());
}

fn wait_for(p: &Path, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if p.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    p.exists()
}

#[test]
fn a_package_another_user_owns_is_never_built() {
    gpuarch_tests::require!(cannot_run(
        ": only root may own io.gpuarch1 and give files away",
        &["dbus-daemon", "chown"],
    ));
    let mut node = Node::new("2080ti-3090", Policy::Shipped);
    let pkgs = node.path("packages");
    let pkg = pkgs.join("evil");
    std::fs::create_dir_all(&pkg).unwrap();
    let marker = node.path("ran-as-root");
    std::fs::write(
        pkg.join("kernel.yaml"),
        format!(
            // Written whole, then renamed: the marker never exists empty.
            "name: evil\nversion: '1'\nsources: [k.cu]\nbuild:\n  backend: command\n  argv: [sh, -c, 'id -u > {m}.tmp && mv {m}.tmp {m}']\nvariants:\n  - name: a\n",
            m = marker.display()
        ),
    )
    .unwrap();
    std::fs::write(pkg.join("k.cu"), "extern \"C\" __global__ void k() {}\n").unwrap();
    std::fs::write(
        node.path("config.yaml"),
        kernels_yaml(&node.path(""), &[&pkgs], None),
    )
    .unwrap();
    chown_r(&pkg, NOBODY);

    node.start(&[]);
    let o = node.ctl(None, &["prewarm", "evil"]);
    assert!(
        !o.status.success(),
        "prewarm of a refused package succeeded"
    );
    assert!(
        !wait_for(&marker, Duration::from_secs(2)),
        "nobody's command ran as root"
    );
    let log = node.log();
    assert!(
        log.contains("is not trusted: owned by uid 65534, not root"),
        "the daemon did not say why: {log}"
    );

    // The same package, root's: it is read and its command runs (as root).
    chown_r(&pkg, 0);
    assert!(node.ctl(None, &["reload"]).status.success());
    let _ = node.ctl(None, &["prewarm", "evil"]);
    assert!(
        wait_for(&marker, Duration::from_secs(10)),
        "root's package did not build"
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "0");
}

#[test]
fn the_shim_never_runs_another_users_runtime_nor_obeys_a_writable_config() {
    gpuarch_tests::require!(cannot_run(": to give files away", &["chown", "runc"]));
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("MARKER");
    let script = dir.path().join("runtime.sh");
    std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, format!("runtime:\n  path: {}\n", script.display())).unwrap();
    let shim = |args: &[&str]| {
        Command::new(&artifacts().gpuarch_runtime)
            .args(args)
            .env("GPUARCH_CONFIG", &config)
            .output()
            .unwrap()
    };

    // Root's runtime, root's config: it runs (the test can see a run).
    assert!(shim(&["--version"]).status.success());
    assert!(marker.exists(), "root's runtime did not run");
    std::fs::remove_file(&marker).unwrap();

    // nobody's runtime: refused, with the fix.
    chown_r(&script, NOBODY);
    let o = shim(&["--version"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("is not trusted: owned by uid 65534, not root")
            && err.contains(&format!("chown root {}", script.display())),
        "{err}"
    );
    assert!(!marker.exists(), "nobody's runtime ran as root");

    // A config anyone may write: not obeyed, so its runtime.path is not
    // used either (the defaults find runc).
    chown_r(&script, 0);
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = shim(&["--version"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("runc version"));
    assert!(
        !marker.exists(),
        "a world-writable config chose the runtime"
    );
}
