//! Kernel packages mounted into containers.
//!
//! The daemon prepares each package under `kernels.mount_root` (default
//! `/var/lib/gpuarch/kernels`) as `<package>/manifest.json` plus its files.
//! The hook reads only the manifest's `targets` (`["sm_75", "sm_86"]`): a
//! package is mounted, read-only, at `/opt/gpuarch/kernels/<package>` when
//! every GPU the container was given can run one of them. Which file serves
//! which GPU is the manifest's business, read by the software inside.
//!
//! A manifest gpuarchd publishes also lists `builds`: one per arch, each a
//! directory of the kernel store. Then the container gets exactly the
//! builds that serve its GPUs, through one directory made here for it: the
//! container's view (under `kernels.view_dir`, named by the sha256 of what
//! it holds, so containers given the same GPUs share one). The view holds,
//! per published package, a `manifest.json` that maps each GPU, by
//! container index and UUID, to its file and variant, and per build a
//! directory named by its arch holding hard links of the build's files.
//! The whole view is one read-only mount at `/opt/gpuarch/kernels`; a
//! hand-made package is bound on its own on an empty directory of the view.
//! A view directory off the store's filesystem cannot link: each build is
//! then bound read-only on its directory instead. A container that mounts
//! something of its own under `/opt/gpuarch/kernels` gets each package
//! bound on its own (its own mounts win). A GPU with no build of its own
//! arch is a miss: a request file `<package>@<arch>` goes into
//! `kernels.spool_dir` for gpuarchd to build, and the container starts now
//! with what there is.
//!
//! A manifest may also list `libraries`: directories of the package (such
//! as `lib`) holding shared libraries. Those need the loader cache inside
//! the container updated, which only a hook running at `createContainer`
//! can do, so only then is that entry added (see [`crate::stage`]).
//!
//! Here: what a container gets ([`Kernels`]) and the binds that show it.
//! Beside it: `manifest` (reading a package's manifest), `discover` (which
//! packages serve the container's GPUs, and build requests for those that
//! do not yet) and `view` (the container's view of the store's builds).

mod discover;
mod manifest;
mod view;

use std::path::PathBuf;

use serde_json::{Value, json};

pub use discover::discover;
pub use manifest::{PackageManifest, PackageManifestError, PublishedBuild, read_manifest};
pub use view::{ViewError, view_libraries};

/// Where packages appear inside a container (`GPUARCH_KERNELS_DIR`).
pub const CONTAINER_DIR: &str = "/opt/gpuarch/kernels";

/// More packages than this under the mount root are not looked at.
pub const MAX_PACKAGES: usize = 256;

/// One package as a container gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelMount {
    pub package: String,
    /// Its directory: the package under the mount root (hand-made), or
    /// its directory in the container's view (published).
    pub source: PathBuf,
    /// Library directories, relative to the package (`lib`).
    pub libraries: Vec<String>,
    /// Store builds bound inside it: (subdirectory, source). Empty when the
    /// view holds hard links of their files.
    pub builds: Vec<(String, PathBuf)>,
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
}

/// The kernel packages for one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kernels {
    /// The container's view: every published package that serves it, and
    /// an empty directory for each hand-made one. None when no published
    /// package serves it.
    pub view: Option<PathBuf>,
    /// Sorted by name.
    pub packages: Vec<KernelMount>,
}

/// One read-only bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    pub destination: String,
}

impl Bind {
    /// The OCI `mounts` entry.
    pub fn to_oci(&self) -> Value {
        json!({
            "destination": self.destination,
            "type": "bind",
            "source": self.source,
            "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
        })
    }
}

impl Kernels {
    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    /// The binds, in mount order, that show these packages in a container
    /// whose own mounts have `existing` destinations, and the packages they
    /// show; a note for each package left out and each shown.
    ///
    /// The view is one bind at [`CONTAINER_DIR`], then each hand-made
    /// package and each bound build on its directory in it. A container
    /// that mounts anything under [`CONTAINER_DIR`] itself gets each
    /// package on its own instead, and none whose directory it mounts; one
    /// that mounts [`CONTAINER_DIR`] gets none.
    pub fn binds(
        &self,
        existing: &[&str],
        notes: &mut Vec<String>,
    ) -> (Vec<Bind>, Vec<&KernelMount>) {
        let mut binds = Vec::new();
        let mut shown = Vec::new();
        if self.packages.is_empty() {
            return (binds, shown);
        }
        let norm = |d: &str| d.trim_end_matches('/').to_owned();
        let existing: Vec<String> = existing.iter().map(|d| norm(d)).collect();
        if existing.iter().any(|d| d == CONTAINER_DIR) {
            notes.push(format!(
                "{CONTAINER_DIR} is already mounted by the container: no kernel packages mounted"
            ));
            return (binds, shown);
        }
        let prefix = format!("{CONTAINER_DIR}/");
        let whole = match &self.view {
            Some(v) if !existing.iter().any(|d| d.starts_with(&prefix)) => Some(v),
            _ => None,
        };
        if let Some(view) = whole {
            binds.push(Bind {
                source: view.clone(),
                destination: CONTAINER_DIR.to_owned(),
            });
        }
        for p in &self.packages {
            let dest = p.destination();
            if existing.contains(&dest) {
                notes.push(format!(
                    "{dest} is already mounted by the container: kernel package {} not mounted",
                    p.package
                ));
                continue;
            }
            // A published package is in the view, which shows it.
            if !whole.is_some_and(|v| p.source.starts_with(v)) {
                binds.push(Bind {
                    source: p.source.clone(),
                    destination: dest.clone(),
                });
            }
            for (sub, src) in &p.builds {
                binds.push(Bind {
                    source: src.clone(),
                    destination: format!("{dest}/{sub}"),
                });
            }
            shown.push(p);
        }
        if !shown.is_empty() {
            let names: Vec<&str> = shown.iter().map(|p| p.package.as_str()).collect();
            notes.push(format!(
                "kernel packages mounted read-only in {CONTAINER_DIR} ({} mount{}): {}",
                binds.len(),
                if binds.len() == 1 { "" } else { "s" },
                names.join(", ")
            ));
        }
        (binds, shown)
    }
}
