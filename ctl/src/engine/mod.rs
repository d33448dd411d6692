//! The container engines gpuarch is wired into, behind one interface:
//! whether an engine is installed below a root, and how gpuarch is wired
//! into it there, each finding with the line that fixes it. `gpuarchctl
//! doctor` checks every engine of [`ALL`]; `gpuarchctl engine containerd`
//! writes containerd's wiring ([`containerd`]).
//!
//! A new engine is a file here with a type that implements [`Engine`],
//! added to [`ALL`]; a command that writes its wiring goes under
//! `gpuarchctl engine` (`cmd/engine.rs`).

pub mod containerd;
mod crio;
mod docker;
mod podman;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::check::{Check, skip, under};

/// One container engine.
pub trait Engine: Sync {
    /// Its name in doctor's report.
    fn name(&self) -> &'static str;
    /// The program whose presence in a bin directory says it is installed.
    fn program(&self) -> &'static str;
    /// How gpuarch is wired into it below `root` (where it is installed).
    fn wiring(&self, root: &Path) -> Vec<Check>;
}

/// Every engine doctor checks, in its report's order.
pub const ALL: [&dyn Engine; 4] = [
    &podman::Podman,
    &docker::Docker,
    &containerd::Containerd,
    &crio::Crio,
];

/// `engine`'s wiring below `root`, or one skipped check when it is not
/// installed there.
pub fn check(engine: &dyn Engine, root: &Path) -> Vec<Check> {
    if installed(root, engine.program()).is_none() {
        return vec![skip(engine.name(), "not installed")];
    }
    engine.wiring(root)
}

/// The bytes every gpuarch-runtime build carries (hook/src/bin/
/// gpuarch-runtime.rs), in two pieces here so that gpuarchctl itself does
/// not carry them whole.
const RUNTIME_MARK: [&[u8]; 2] = [b"gpuarch-runtime: ", b"OCI runtime shim"];
/// Most bytes of a program read looking for the mark.
const MOST_SCANNED: u64 = 256 << 20;

/// Does the program at `path` (as an engine's config names it, on the host
/// whose `/` is `root`) run gpuarch-runtime: named so, or, whatever its
/// name, a gpuarch-runtime build (its mark), so a copy or a renamed one
/// counts. A bare name (looked up on the engine's PATH) goes by its name.
pub fn is_gpuarch_runtime(root: &Path, path: &str) -> bool {
    use std::io::Read;
    if path.ends_with("gpuarch-runtime") {
        return true;
    }
    if !path.starts_with('/') {
        return false;
    }
    let Ok(f) = std::fs::File::open(under(root, Path::new(path))) else {
        return false;
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mark = RUNTIME_MARK.concat();
    let mut r = f.take(MOST_SCANNED);
    let mut buf = vec![0u8; 1 << 20];
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => n,
        };
        carry.extend_from_slice(&buf[..n]);
        if carry.windows(mark.len()).any(|w| w == mark) {
            return true;
        }
        let keep = carry.len().min(mark.len() - 1);
        carry.drain(..carry.len() - keep);
    }
}

/// The installed programs and their example configs.
const RUNTIME: &str = "/usr/bin/gpuarch-runtime";
const EXAMPLES: &str = "/usr/share/doc/gpuarch/examples";
/// Where podman (and CRI-O by default) read hooks.d files.
const HOOK_DIRS: [&str; 2] = [
    "/usr/share/containers/oci/hooks.d",
    "/etc/containers/oci/hooks.d",
];
const BIN_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The engine's program below `root`, if installed.
pub fn installed(root: &Path, program: &str) -> Option<PathBuf> {
    BIN_DIRS
        .iter()
        .map(|d| under(root, &Path::new(d).join(program)))
        .find(|p| p.is_file())
}

/// hooks.d files below `root` in `dirs` whose hook runs gpuarch-hook at
/// `stage`: (file, whether the program it names is installed).
fn gpuarch_hooks(root: &Path, dirs: &[&str], stage: &str) -> Vec<(PathBuf, bool)> {
    let mut found = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(under(root, Path::new(d))) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "json"))
        {
            let Some(h) = gpuarch_fs::read_config(&f)
                .ok()
                .flatten()
                .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            else {
                continue;
            };
            let path = h["hook"]["path"].as_str().unwrap_or_default();
            let stages = h["stages"].as_array().cloned().unwrap_or_default();
            if path.ends_with("/gpuarch-hook") && stages.iter().any(|s| s == stage) {
                let exe = under(root, Path::new(path));
                found.push((f, exe.is_file()));
            }
        }
    }
    found
}

/// Tables (dotted paths) of `v` whose `key` is a string ending in `suffix`.
fn toml_find(v: &toml::Value, key: &str, suffix: &str, at: &str, found: &mut Vec<String>) {
    if let toml::Value::Table(t) = v {
        for (k, child) in t {
            if k == key && child.as_str().is_some_and(|s| s.ends_with(suffix)) {
                found.push(at.to_owned());
            }
            let path = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            toml_find(child, key, suffix, &path, found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_find_names_the_table() {
        let doc: toml::Value = toml::from_str(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch.options]\nBinaryName = \"/usr/bin/gpuarch-runtime\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut found = Vec::new();
        toml_find(&doc, "BinaryName", "gpuarch-runtime", "", &mut found);
        assert_eq!(
            found,
            ["plugins.io.containerd.grpc.v1.cri.containerd.runtimes.gpuarch.options"]
        );
    }
}
