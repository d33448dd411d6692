//! `jit_cache`: the per-architecture JIT caches mounted into containers,
//! and who shares one (a trust boundary).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Invalid;
use super::kernels::max_bytes;

/// Per-architecture JIT caches: a read-write directory per scope and
/// target set, mounted into each GPU container with torch's, Triton's,
/// TorchInductor's, FlashInfer's and the driver's cache variables pointing
/// into it (see `gpuarch_core::jit`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JitCacheConfig {
    /// Give containers a cache. Default false.
    pub enable: bool,
    /// Where the caches are: `<dir>/<scope>/<targets>/`. Default
    /// [`DEFAULT_JIT_DIR`].
    pub dir: PathBuf,
    /// Which containers share a cache. Default `image`.
    pub scope: JitScope,
    /// Size above which gpuarchd removes the least recently started caches
    /// that no container has mounted. Default 20 GiB.
    #[serde(deserialize_with = "max_bytes")]
    pub max_bytes: u64,
}

/// Default of `jit_cache.dir`.
pub const DEFAULT_JIT_DIR: &str = "/var/cache/gpuarch/jit";

impl Default for JitCacheConfig {
    fn default() -> Self {
        Self {
            enable: false,
            dir: PathBuf::from(DEFAULT_JIT_DIR),
            scope: JitScope::Image,
            max_bytes: 20 << 30,
        }
    }
}

/// Which containers share a JIT cache. Whatever is in a cache runs in every
/// container given it, so a scope is a trust boundary; every scope is also
/// split by the container's (host) uid, so a cache is only ever written by
/// one user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JitScope {
    /// Containers of one uid running one image (as the runtime names it:
    /// containerd's CRI and CRI-O do; Docker and podman do not, and their
    /// containers get no cache under this scope), and in one Kubernetes
    /// namespace where the engine names it (containerd's
    /// `io.kubernetes.cri.sandbox-namespace`): two tenants running one
    /// image as one uid never share.
    #[default]
    Image,
    /// Containers of one uid: for nodes where the uid is the tenant.
    Uid,
    /// Containers of one uid in one Kubernetes namespace, as the engine
    /// names it (containerd's `io.kubernetes.cri.sandbox-namespace`; a
    /// pod's own `io.kubernetes.pod.namespace` is a claim, not taken).
    Namespace,
    /// Every container of one uid: for trusted single-tenant nodes.
    Shared,
}

impl std::fmt::Display for JitScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Image => "image",
            Self::Uid => "uid",
            Self::Namespace => "namespace",
            Self::Shared => "shared",
        })
    }
}

impl JitCacheConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if !self.dir.is_absolute() || self.dir.parent().is_none() {
            return Err(Invalid::JitDir(self.dir.clone()));
        }
        Ok(())
    }
}
