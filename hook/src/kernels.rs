//! Kernel packages mounted into containers.
//!
//! The daemon prepares each package under `kernels.mount_root` (default
//! `/var/lib/gpuarch/kernels`) as `<package>/manifest.json` plus its files.
//! The hook reads only the manifest's `targets` (`["sm_75", "sm_86"]`): a
//! package is mounted, read-only, at `/opt/gpuarch/kernels/<package>` when
//! every GPU the container was given can run one of them. Which file serves
//! which GPU is the manifest's business, read by the software inside.
//!
//! A manifest may also list `libraries`: directories of the package (such
//! as `lib`) holding shared libraries. Those need the loader cache inside
//! the container updated, which only a hook running at `createContainer`
//! can do, so only then is that entry added (see [`crate::stage`]).

use std::path::{Path, PathBuf};

use gpuarch_core::arch::{CudaVersion, Target};
use gpuarch_core::plan::Plan;
use serde_json::{Value, json};

/// Where packages appear inside a container (`GPUARCH_KERNELS_DIR`).
pub const CONTAINER_DIR: &str = "/opt/gpuarch/kernels";

/// More packages than this under the mount root are not looked at.
pub const MAX_PACKAGES: usize = 256;
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// One read-only bind mount of a package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelMount {
    pub package: String,
    pub source: PathBuf,
    /// Library directories, relative to the package (`lib`).
    pub libraries: Vec<String>,
}

impl KernelMount {
    pub fn destination(&self) -> String {
        format!("{CONTAINER_DIR}/{}", self.package)
    }

    /// The library directories as the container sees them.
    pub fn library_dirs(&self) -> Vec<String> {
        self.libraries
            .iter()
            .map(|l| format!("{}/{l}", self.destination()))
            .collect()
    }

    /// The OCI `mounts` entry.
    pub fn to_oci(&self) -> Value {
        json!({
            "destination": self.destination(),
            "type": "bind",
            "source": self.source,
            "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
        })
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 128
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

/// What the hook reads of a package's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub targets: Vec<Target>,
    pub libraries: Vec<String>,
}

/// A library directory must stay inside its package: relative, plain names.
fn valid_subdir(d: &str) -> bool {
    !d.is_empty() && d.len() <= 256 && d.split('/').all(valid_name)
}

/// Read `manifest.json` (at most 1 MiB).
pub fn read_manifest(manifest: &Path) -> Result<Manifest, String> {
    let f = std::fs::File::open(manifest).map_err(|e| e.to_string())?;
    let bytes = crate::read_at_most(f, MAX_MANIFEST_BYTES)?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let list = v
        .get("targets")
        .and_then(Value::as_array)
        .ok_or("no \"targets\" list")?;
    let targets = list
        .iter()
        .map(|t| {
            let s = t.as_str().ok_or("a target that is not a string")?;
            Target::parse(s).map_err(|e| e.to_string())
        })
        .collect::<Result<_, String>>()?;
    let libraries = match v.get("libraries") {
        None => Vec::new(),
        Some(l) => l
            .as_array()
            .ok_or("\"libraries\" is not a list")?
            .iter()
            .map(|d| match d.as_str() {
                Some(d) if valid_subdir(d) => Ok(d.to_owned()),
                _ => Err(format!(
                    "library directory {d} is not a relative path inside the package"
                )),
            })
            .collect::<Result<_, String>>()?,
    };
    Ok(Manifest { targets, libraries })
}

/// The packages under `root` that serve every GPU of `plan`, and a note for
/// each package skipped and why. A missing `root` is no packages.
pub fn discover(root: &Path, plan: &Plan, driver_cuda: &str) -> (Vec<KernelMount>, Vec<String>) {
    let mut mounts = Vec::new();
    let mut notes = Vec::new();
    if plan.gpus.is_empty() {
        return (mounts, notes);
    }
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (mounts, notes),
        Err(e) => {
            notes.push(format!(
                "no kernel mounts: cannot list {}: {e}",
                root.display()
            ));
            return (mounts, notes);
        }
    };
    let cuda = CudaVersion::parse(driver_cuda).ok();
    let mut names: Vec<String> = Vec::new();
    for entry in entries.flatten().take(MAX_PACKAGES + 1) {
        match entry.file_name().into_string() {
            Ok(n) if valid_name(&n) => names.push(n),
            Ok(n) if n.starts_with('.') => {}
            other => notes.push(format!(
                "kernel package {:?} skipped: not a valid package name",
                other.unwrap_or_else(|os| os.to_string_lossy().into_owned())
            )),
        }
    }
    if names.len() > MAX_PACKAGES {
        notes.push(format!(
            "more than {MAX_PACKAGES} kernel packages under {}: only the first {MAX_PACKAGES} are considered",
            root.display()
        ));
        names.truncate(MAX_PACKAGES);
    }
    names.sort();
    for name in names {
        let dir = root.join(&name);
        let Manifest { targets, libraries } = match read_manifest(&dir.join("manifest.json")) {
            Ok(m) => m,
            Err(e) => {
                notes.push(format!("kernel package {name} skipped: manifest.json: {e}"));
                continue;
            }
        };
        let unserved = plan.gpus.iter().find(|g| {
            !targets
                .iter()
                .any(|t| t.check(g.compute_capability, cuda, None).runs)
        });
        match unserved {
            None => mounts.push(KernelMount {
                package: name,
                source: dir,
                libraries,
            }),
            Some(g) => notes.push(format!(
                "kernel package {name} not mounted: no build in it runs on {}",
                g.label()
            )),
        }
    }
    (mounts, notes)
}
