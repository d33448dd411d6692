//! The Debian roots `scripts/lib/setup.sh` (`ensure_engine_roots`) builds
//! under `.local/engines`, and how a command runs inside one: in a mount
//! namespace of its own, the root bind-mounted on itself and entered with
//! `pivot_root`, `/proc`, `/sys` and `/dev` from the host, a tmpfs on
//! `/run`, and the test's directories and gpuarch's binaries mounted at
//! the paths they have outside. The stack, engines, containers and Slurm
//! helpers all run their engines through here.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{artifacts, workspace_root};

/// The Debian root whose engines run (`GPUARCH_ENGINES=SUITE`), or `None`
/// for the host's own; `Err`: why the root asked for is not there.
pub fn engine_root() -> Result<Option<PathBuf>, String> {
    match std::env::var("GPUARCH_ENGINES").as_deref() {
        Err(_) | Ok("" | "host") => Ok(None),
        Ok(suite) => root(suite).map(Some),
    }
}

/// The root of Debian `suite`'s engines, or why it is not there.
pub fn root(suite: &str) -> Result<PathBuf, String> {
    let root = workspace_root().join(".local/engines").join(suite);
    if root.join("usr/bin/containerd").is_file() {
        Ok(root)
    } else {
        Err(format!(
            "no {suite} engine root at {} (scripts/test builds it: ensure_engine_roots in scripts/lib/setup.sh)",
            root.display()
        ))
    }
}

/// What the root's package manager says it holds of `package`.
pub fn version(root: &Path, package: &str) -> String {
    let o = Command::new("chroot")
        .arg(root)
        .args(["dpkg-query", "-W", "-f", "${Version}", package])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// Where gpuarch's binaries are, mounted into every engine root.
fn binaries() -> PathBuf {
    artifacts().gpuarch_runtime.parent().unwrap().to_owned()
}

/// The script that enters `root`: the mounts, then `pivot_root` and exec.
const ENTER: &str = r#"set -e
R=$1; shift
mount --rbind "$R" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=0755 tmpfs "$R/run"
while [ "$1" != -- ]; do
    mkdir -p "$R$1"
    mount --rbind "$1" "$R$1"
    shift
done
shift
# pivot_root, as a node's engines have it, not chroot: in a chroot,
# runc 1.3's `exec` put the process in the host's root, not the container's.
cd "$R"
mkdir -p .gpuarch-old-root
pivot_root . .gpuarch-old-root
umount -l /.gpuarch-old-root
exec "$@"
"#;

/// `argv` run inside `root` (in a new mount namespace, so nothing it
/// mounts is seen outside), with `shared` directories at their own paths.
pub fn command_in(root: &Path, shared: &[&Path], argv: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        ENTER,
        "enter",
    ])
    .arg(root);
    for d in shared {
        c.arg(d);
    }
    c.arg(binaries()).arg("--").args(argv);
    c
}

/// `program` run inside `root` as [`command_in`] runs it, but started in
/// `cwd` (a path inside the root, or a shared one): the root is entered
/// at its `/`. Arguments added to the command go to `program`.
pub fn command_in_dir(root: &Path, shared: &[&Path], cwd: &Path, program: &OsStr) -> Command {
    let mut c = command_in(root, shared, &["sh", "-c", "cd \"$0\" && exec \"$@\""]);
    c.arg(cwd).arg(program);
    c
}
