//! Consumers' own prebuilt kernel libraries (FlashInfer's cubins), served
//! from the trees gpuarchd lays out under `<kernels.cache_dir>/libraries`
//! (`gpuarch_kernels::library`; the tree's [`Served`] is the format).
//!
//! A container gets a library only when everything says it is the one its
//! software would use, and complete for its GPUs:
//! - its image holds the library's reader (`flashinfer-python`) at a
//!   version the node has imported, read from the `.dist-info` name;
//! - its image holds no copy of the library of its own (that one wins in
//!   the consumer, and its version check is the consumer's business);
//! - the tree for its GPUs' capabilities is there, complete, and holds code
//!   for them (an H100 gets nothing from `flashinfer-cubin`: it has no
//!   Hopper kernels);
//! - the variable is its to set (not disabled, not the container's own).
//!
//! Then: the tree, read-only, at the kind's mount; a small tmpfs over each
//! place the consumer writes into (`Served::writable_dirs`); and the
//! variable. Otherwise a note says why, and nothing changes.

use std::path::{Path, PathBuf};

use gpuarch_core::config::EnvConfig;
use gpuarch_core::library::{self, LibraryKind};
use gpuarch_core::oci::ContainerView;
use gpuarch_core::plan::Plan;
use gpuarch_wire::library::{SCHEMA, Served, set_name, tree_paths};
use serde_json::{Value, json};

/// A tree's `Served` is small; more is not read.
const MAX_SERVED: u64 = 1 << 20;
/// Each tmpfs: a fetched CuTe DSL module is a few MiB; include links and
/// their locks far less.
const FETCH_TMPFS: &str = "size=1g";
const SCRATCH_TMPFS: &str = "size=16m";

/// One library as a container gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryMount {
    pub kind: &'static LibraryKind,
    pub version: String,
    pub tree: PathBuf,
    pub served: Served,
}

impl LibraryMount {
    /// The OCI `mounts` entries, in order: the tree, then a tmpfs over
    /// each writable place in it.
    pub fn oci_mounts(&self) -> Vec<Value> {
        // Not noexec: a module the consumer fetches (a CuTe DSL `.so`) is
        // loaded with dlopen.
        let mut out = vec![json!({
            "destination": self.kind.mount,
            "type": "bind",
            "source": self.tree,
            "options": ["rbind", "ro", "nosuid", "nodev"],
        })];
        for d in &self.served.scratch_dirs {
            out.push(tmpfs(&format!("{}/{d}", self.kind.mount), SCRATCH_TMPFS));
        }
        for d in &self.served.fetch_dirs {
            out.push(tmpfs(&format!("{}/{d}", self.kind.mount), FETCH_TMPFS));
        }
        out
    }
}

fn tmpfs(destination: &str, size: &str) -> Value {
    json!({
        "destination": destination,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", "mode=1777", size],
    })
}

/// The libraries for the container of `view` under `plan`, their variables
/// added to the Plan; notes say why any was not given.
pub fn plan(
    root: &Path,
    plan: &mut Plan,
    view: &ContainerView,
    existing_mounts: &[String],
    env: &EnvConfig,
) -> Vec<LibraryMount> {
    let mut out = Vec::new();
    if plan.gpus.is_empty() {
        return out;
    }
    let caps: Vec<_> = plan.gpus.iter().map(|g| g.compute_capability).collect();
    let set = set_name(&caps);
    for kind in &library::ALL {
        let exact = &view.software.exact;
        let Some(version) = exact.get(kind.reader.name()) else {
            continue;
        };
        let mut note = |why: String| {
            plan.notes.push(format!(
                "{} not set for {} {version}: {why}",
                kind.env, kind.reader
            ))
        };
        if let Some(own) = exact.get(kind.dist) {
            note(format!("the image has its own {} {own}", kind.dist));
            continue;
        }
        if !view.software.unread.is_empty() {
            note(format!(
                "not every environment of the image was read, and one not read may hold another {} or its own {}",
                kind.reader, kind.dist
            ));
            continue;
        }
        let clash = existing_mounts.iter().find(|d| {
            let d = d.trim_end_matches('/');
            d == kind.mount
                || d.starts_with(&format!("{}/", kind.mount))
                || kind.mount.starts_with(&format!("{d}/"))
        });
        if let Some(d) = clash {
            note(format!("the container mounts {d} itself"));
            continue;
        }
        let (tree, side) = tree_paths(root, kind.dist, version, &set);
        let served = match read_served(&side) {
            Ok(s) if tree.is_dir() => s,
            Ok(_) => {
                note(format!("no tree for {set} at {}", tree.display()));
                continue;
            }
            Err(None) => {
                let imported = root.join(kind.dist).join(version).is_dir();
                note(if imported {
                    format!("the node has no tree for {set} yet")
                } else {
                    format!("the node has no {} {version}", kind.dist)
                });
                continue;
            }
            Err(Some(e)) => {
                note(format!("{}: {e}", side.display()));
                continue;
            }
        };
        if !served.complete() {
            note(format!(
                "its tree for {set} lacks {} file(s) among its kernels ({}); the consumer could not fetch them into it",
                served.missing_count,
                served.missing.first().map_or("", String::as_str)
            ));
            continue;
        }
        if served.code_files == 0 {
            note(format!("{} {version} has no kernels for {set}", kind.dist));
            continue;
        }
        if !plan.add_mounted(
            kind.env,
            kind.mount,
            &format!("{} is mounted", kind.dist),
            view,
            env,
        ) {
            continue;
        }
        out.push(LibraryMount {
            kind,
            version: version.clone(),
            tree,
            served,
        });
    }
    out
}

/// Most writable places (a tmpfs each) one library gives a container: the
/// fetch places an import lets through, and a few of the kind's own.
const MAX_PLACES: usize = gpuarch_wire::library::MAX_FETCH_DIRS + 8;

/// A tree's [`Served`]: Err(None) when there is none.
fn read_served(path: &Path) -> Result<Served, Option<String>> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(None),
        Err(e) => return Err(Some(e.to_string())),
    };
    let bytes = crate::context::read_at_most(f, MAX_SERVED).map_err(|e| Some(e.to_string()))?;
    let s: Served = serde_json::from_slice(&bytes).map_err(|e| Some(e.to_string()))?;
    if s.schema != SCHEMA {
        return Err(Some(format!(
            "schema {}; this hook reads {SCHEMA}",
            s.schema
        )));
    }
    // Each becomes a mount destination below the kind's mount: as many
    // as an import lets through, and the kind's own scratch places.
    let places = s.writable_dirs().count();
    if places > MAX_PLACES {
        return Err(Some(format!(
            "{places} writable places: a container is given at most {MAX_PLACES}"
        )));
    }
    if let Some(bad) = s.writable_dirs().find(|d| !plain_relative(d)) {
        return Err(Some(format!("{bad:?} is not a plain relative directory")));
    }
    Ok(s)
}

/// A tree's place as a mount destination below the kind's: the library
/// rule of plain relative parts, and at most 1 KiB.
fn plain_relative(d: &str) -> bool {
    d.len() <= 1024 && library::check_relative(d).is_ok()
}

#[cfg(test)]
mod tests;
