//! A consumer library's served trees, as gpuarchd lays them out and the
//! hook reads them (`gpuarch_kernels::library` has the whole layout):
//! `<root>/<dist>/<version>/serve/<set>/` and, beside it, `<set>.json`
//! ([`Served`]).

use std::path::{Path, PathBuf};

use gpuarch_core::arch::ComputeCapability;
use serde::{Deserialize, Serialize};

/// Version of [`Served`].
pub const SCHEMA: u32 = 1;

/// Most directories of a library's files its import may lack (its
/// checksum lists name files there the wheel does not hold): each is a
/// writable tmpfs in every container the library is served to. FlashInfer
/// 0.6.13 has 3.
pub const MAX_FETCH_DIRS: usize = 64;

/// What one tree holds, and where in it the consumer must be able to
/// write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Served {
    pub schema: u32,
    /// The capabilities it is for, lowest first (`10.0`).
    pub caps: Vec<String>,
    pub files: u64,
    pub bytes: u64,
    /// GPU code files held; the rest are the library's own metadata.
    pub code_files: u64,
    /// Directories (relative) of files the library's lists name but the
    /// import lacks, which hold none of the tree's code: the consumer
    /// fetches such a file at run time, so each gets a small writable
    /// tmpfs over it in the container, as its own cache would be.
    pub fetch_dirs: Vec<String>,
    /// Directories (relative) the consumer writes into at run time
    /// whatever it holds (FlashInfer's `flashinfer/` of include links and
    /// their locks): a tmpfs each as well.
    pub scratch_dirs: Vec<String>,
    /// Missing files that could be asked for on these capabilities and lie
    /// among the tree's code, where no tmpfs can go (the first 16): the
    /// tree is then incomplete and must not be pointed at.
    pub missing: Vec<String>,
    pub missing_count: u64,
}

impl Served {
    pub fn complete(&self) -> bool {
        self.missing_count == 0
    }

    /// Every directory that gets a tmpfs, relative to the tree.
    pub fn writable_dirs(&self) -> impl Iterator<Item = &String> {
        self.scratch_dirs.iter().chain(&self.fetch_dirs)
    }
}

/// The name of the tree for `caps`: each capability once, lowest first,
/// joined by `+` (`8.6+10.0`).
pub fn set_name(caps: &[ComputeCapability]) -> String {
    let mut c: Vec<_> = caps.to_vec();
    c.sort();
    c.dedup();
    c.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("+")
}

/// The tree of `set` for an imported version, and its [`Served`] file.
pub fn tree_paths(root: &Path, dist: &str, version: &str, set: &str) -> (PathBuf, PathBuf) {
    let serve = root.join(dist).join(version).join("serve");
    (serve.join(set), serve.join(format!("{set}.json")))
}
