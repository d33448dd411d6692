//! The store's remote tier, as the builder sees it: pull an entry before
//! building it, push one after. The registry client itself is
//! `gpuarch-registry`; this crate keeps only the contract, so the store,
//! the hook and the fuzz targets carry no HTTP or TLS.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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

/// A consumer's wheel (`crate::library`) as the registry shares it: its
/// artifact's config. The wheel itself is one blob, and a node that pulls
/// it imports it as it would a wheel an admin handed over: what this says
/// is checked against the wheel, never trusted instead of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedWheel {
    pub schema: u32,
    /// The distribution, as PyPI spells it: `flashinfer-cubin`.
    pub dist: String,
    pub version: String,
    /// The wheel's file name.
    pub wheel: String,
    pub sha256: String,
    pub bytes: u64,
}

/// Version of [`SharedWheel`].
pub const SHARED_WHEEL_SCHEMA: u32 = 1;

/// The tag a library version is shared under: `library-<dist>-<version>`,
/// never a store key (those are 64 hex digits). `None` where the version
/// has a character no tag may hold (a PEP 440 epoch `!` or local `+`).
pub fn library_tag(dist: &str, version: &str) -> Option<String> {
    let tag = format!("library-{dist}-{version}");
    (tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
    .then_some(tag)
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

    /// Whether builds (and library imports) made here are pushed.
    fn pushes(&self) -> bool;

    /// Push the wheel `wheel` (read from its start) that `about` describes;
    /// its `repository@digest`.
    fn push_wheel(&self, wheel: &std::fs::File, about: &SharedWheel)
    -> Result<String, RemoteError>;

    /// Pull the wheel of `dist` `version` into `out` (empty, open for
    /// writing), at most `max_bytes` of it, within `budget`: what the
    /// artifact says of it and its `repository@digest`, `Ok(None)` when
    /// there is none. The blob's digest is checked as it arrives; the
    /// wheel's own content is the importer's to check. On any error `out`
    /// is left empty.
    fn pull_wheel(
        &self,
        dist: &str,
        version: &str,
        out: &std::fs::File,
        max_bytes: u64,
        budget: Duration,
    ) -> Result<Option<(SharedWheel, String)>, RemoteError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_tag_is_a_valid_tag_and_never_a_store_key() {
        assert_eq!(
            library_tag("flashinfer-cubin", "0.6.13").as_deref(),
            Some("library-flashinfer-cubin-0.6.13")
        );
        assert_eq!(
            library_tag("flashinfer-cubin", "0.7.0rc1.post2").as_deref(),
            Some("library-flashinfer-cubin-0.7.0rc1.post2")
        );
        // An epoch or a local version: no tag can hold them.
        assert_eq!(library_tag("flashinfer-cubin", "1!0.6"), None);
        assert_eq!(library_tag("flashinfer-cubin", "0.6.13+cu130"), None);
        assert_eq!(library_tag("flashinfer-cubin", &"1".repeat(120)), None);
    }
}
