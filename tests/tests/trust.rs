//! What gpuarch runs as root must be root's, or anyone who can write it
//! runs code as root: a kernel
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
    gpuarch_tests::skip_unless!(cannot_run(
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
    gpuarch_tests::skip_unless!(cannot_run(": to give files away", &["chown", "runc"]));
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
            // A refused config's lines go to the default log, which on a
            // host without a journal is the host's /run/gpuarch: stderr.
            .env("GPUARCH_LOG", "stderr")
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

/// nobody owns a symlink in a sticky directory and flips it, as fast as it
/// can, between root's file and another. Before, a
/// symlink's owner was never looked at and the path was checked, then
/// opened or exec'd again: nobody's script ran as uid 0 through
/// `runtime.path` in 15 of 300 starts, and nobody's config was obeyed in 14
/// of 300. Now a link on a trusted path must be root's, and the shim reads
/// its config and execs its runtime through the descriptor it checked: in
/// 300 starts each, nobody's file never counts.
#[test]
fn a_symlink_nobody_flips_never_chooses_what_root_runs() {
    gpuarch_tests::skip_unless!(cannot_run(
        ": to give files away",
        &["chown", "runc", "setpriv", "/usr/bin/python3"]
    ));
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sticky = dir.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (root_ran, nobody_ran) = (dir.path().join("ROOT_RAN"), dir.path().join("NOBODY_RAN"));
    let script = |name: &str, marker: &Path| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("#!/bin/sh\necho x >> {}\n", marker.display())).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    // Root's runtime, and one nobody may not have run as root: its own
    // script (nobody's), or a root's runtime that only nobody's config
    // names (so a run of it means nobody's config was obeyed).
    let good = script("good.sh", &root_ran);
    let theirs = script("theirs.sh", &nobody_ran);
    chown_r(&theirs, NOBODY);
    let other = script("other.sh", &nobody_ran);
    let cfg = |name: &str, runtime: &Path| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("runtime:\n  path: {}\n", runtime.display())).unwrap();
        p
    };
    let flip = |link: &Path, a: &Path, b: &Path| {
        let py = format!(
            "import os\nl={l:?}\nt=l+'.t'\nwhile True:\n  for x in ({a:?},{b:?}):\n    \
             try: os.unlink(t)\n    except OSError: pass\n    os.symlink(x,t); os.rename(t,l)\n",
            l = link.display().to_string(),
            a = a.display().to_string(),
            b = b.display().to_string()
        );
        let c = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(["/usr/bin/python3", "-c", &py])
            .spawn()
            .unwrap();
        let t = Instant::now();
        while std::fs::symlink_metadata(link).is_err() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            std::fs::symlink_metadata(link).is_ok(),
            "nobody's flipper made no link"
        );
        c
    };
    let runs = 300;
    let start = |config: &Path| {
        Command::new(&artifacts().gpuarch_runtime)
            .arg("--version")
            .env("GPUARCH_CONFIG", config)
            // A refused config's lines go to the default log, which on a
            // host without a journal is the host's /run/gpuarch: stderr.
            .env("GPUARCH_LOG", "stderr")
            .output()
            .unwrap()
    };

    // runtime.path through nobody's link, flipping between root's runtime
    // and nobody's script.
    let link = sticky.join("runtime");
    let config = cfg("root.yaml", &link);
    let mut flipper = flip(&link, &good, &theirs);
    let mut refused = 0;
    for _ in 0..runs {
        let o = start(&config);
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() && err.contains("a symlink owned by uid 65534") {
            refused += 1;
        }
    }
    let _ = flipper.kill();
    let _ = flipper.wait();
    let count = |p: &Path| std::fs::read_to_string(p).map_or(0, |s| s.lines().count());
    assert!(
        !nobody_ran.exists(),
        "nobody's runtime ran as root in {} of {runs} starts",
        count(&nobody_ran)
    );
    assert_eq!(refused, runs, "nobody's link was not refused by its owner");

    // The config through nobody's link, flipping between root's config
    // and one of nobody's naming other.sh: never obeyed, so the defaults
    // find runc.
    let _ = std::fs::remove_file(&link);
    let link = sticky.join("config.yaml");
    let (rootcfg, theircfg) = (cfg("a.yaml", &good), cfg("b.yaml", &other));
    chown_r(&theircfg, NOBODY);
    let mut flipper = flip(&link, &rootcfg, &theircfg);
    let mut defaults = 0;
    for _ in 0..runs {
        let o = start(&link);
        if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("runc version") {
            defaults += 1;
        }
    }
    let _ = flipper.kill();
    let _ = flipper.wait();
    assert!(
        !nobody_ran.exists(),
        "nobody's config was obeyed in {} of {runs} starts",
        count(&nobody_ran)
    );
    assert_eq!(defaults, runs, "a config behind nobody's link was obeyed");
    assert!(
        !root_ran.exists(),
        "a config behind nobody's link was obeyed"
    );
}
