//! The store's remote tier, as the builder sees it: pull an entry before
//! building it, push one after. The registry client itself is
//! `gpuarch-registry`; this crate keeps only the contract, so the store,
//! the hook and the fuzz targets carry no HTTP or TLS.

use std::path::Path;

use crate::store::{BuildInfo, Entry, EntryManifest, Meta};

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The config cannot be used: the repository, the credentials, the CA file.
    #[error("kernels.remote: {0}")]
    Config(String),
    /// The registry did not answer, or not in time, or failed: build here.
    #[error("registry {reference}: {message}")]
    Unavailable { reference: String, message: String },
    /// The registry answered with an artifact gpuarch will not serve.
    #[error("artifact {reference} ({digest}) refused: {reason}")]
    Refused {
        reference: String,
        digest: String,
        reason: String,
    },
}

/// A pulled entry: where it came from, and what its manifest says.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// `repository@sha256:...` of the artifact's manifest.
    pub origin: String,
    pub manifest: EntryManifest,
}

impl Pulled {
    /// What the store records of it, as of a build.
    pub fn build_info(&self) -> BuildInfo {
        BuildInfo {
            toolkit: self.manifest.toolkit.clone(),
            min_driver_cuda: self.manifest.min_driver_cuda.clone(),
            origin: Some(self.origin.clone()),
        }
    }
}

/// A place builds are shared through.
pub trait Remote: Send + Sync + std::fmt::Debug {
    /// Pull `key` into `out` (empty) and check it is the build `meta`
    /// describes, as [`crate::store::check_outputs`] checks a build:
    /// `Ok(None)` when there is no such artifact. On any error `out` is
    /// left empty.
    fn pull_into(
        &self,
        key: &str,
        meta: &Meta,
        out: &Path,
        max_bytes: u64,
    ) -> Result<Option<Pulled>, RemoteError>;

    /// Push a stored entry built here; its `repository@digest`.
    fn push(&self, entry: &Entry) -> Result<String, RemoteError>;

    /// Whether builds made here are pushed.
    fn pushes(&self) -> bool;
}
