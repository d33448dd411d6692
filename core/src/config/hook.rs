//! `hook` and `runtime`: the limits of one hook or shim invocation, where
//! they keep what they learn, and what the shim runs and adds.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Invalid, absolute, in_range};

/// Limits of one `gpuarch-hook` or `gpuarch-runtime` invocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HookConfig {
    /// Wall-clock budget for planning one container, in milliseconds. Past
    /// it the container starts unchanged (or, with `strict`, fails). Default
    /// 5000; 1 to 60000.
    #[serde(deserialize_with = "timeout_ms")]
    pub timeout_ms: u64,
    /// Where the consumers read from each image are kept, by image. Used
    /// only when the directory exists (gpuarch's tmpfiles.d makes it, mode
    /// 0700); the hook never creates it. Default `/run/gpuarch/images`.
    pub image_cache: PathBuf,
    /// Where each GPU container's Plan is kept for `gpuarchctl why`
    /// ([`crate::record`]). Used only when the directory exists
    /// (tmpfiles.d makes it, mode 0700). Default `/run/gpuarch/containers`.
    pub record_dir: PathBuf,
}

/// [`HookConfig::image_cache`]'s default.
pub const DEFAULT_IMAGE_CACHE: &str = "/run/gpuarch/images";
/// [`HookConfig::record_dir`]'s default.
pub const DEFAULT_RECORD_DIR: &str = "/run/gpuarch/containers";

impl Default for HookConfig {
    fn default() -> Self {
        Self {
            timeout_ms: 5000,
            image_cache: PathBuf::from(DEFAULT_IMAGE_CACHE),
            record_dir: PathBuf::from(DEFAULT_RECORD_DIR),
        }
    }
}

fn timeout_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "timeout_ms", 1..=60_000)
}

/// What `gpuarch-runtime` runs, and what it adds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Absolute path of the runtime. Default: the first of `runc`, `crun`
    /// found on PATH (never `gpuarch-runtime` itself). It may be another
    /// shim, such as `nvidia-container-runtime`.
    pub path: Option<PathBuf>,
    /// In each container given a Plan, also write `/run/gpuarch/env` and
    /// `/etc/profile.d/gpuarch.sh`: `docker exec` and `kubectl exec` start
    /// processes with the env the engine stored, not the bundle's, so only
    /// these files carry the Plan to them. The shim writes them into the
    /// rootfs before the runtime starts; where a mount in the config would
    /// cover them, it adds gpuarch-hook's `createContainer` stage instead
    /// (one more process start). Default false: it writes into the
    /// container's own filesystem, and costs each GPU container's start
    /// (docs/BENCHMARKS.md).
    pub env_files: bool,
}

impl RuntimeConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        self.path
            .as_deref()
            .map_or(Ok(()), |p| absolute("runtime.path", p))
    }
}
