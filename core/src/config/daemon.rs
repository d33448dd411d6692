//! `daemon`: what gpuarchd does on its own (NVML reads, the snapshot).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::in_range;

/// What gpuarchd does on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Seconds between inventory refreshes from NVML. Default 60; 1 to
    /// 86400. After a failed refresh the daemon retries sooner (1 s, 2 s,
    /// 4 s, ... up to this interval).
    #[serde(deserialize_with = "refresh_interval_s")]
    pub refresh_interval_s: u64,
    /// Budget of one NVML read, in milliseconds; past it the refresh counts
    /// as failed and the inventory is marked stale. Default 10000; 1 to
    /// 600000.
    #[serde(deserialize_with = "nvml_timeout_ms")]
    pub nvml_timeout_ms: u64,
    /// The inventory snapshot: where gpuarchd writes it (unless started
    /// with `--snapshot`, read at start) and where the hook, the shim and
    /// `gpuarchctl --offline` read it (unless `GPUARCH_INVENTORY` names
    /// another). A config key, because the shim runs in the environment of
    /// whatever started it (the system containerd under Docker), not one
    /// the admin set. Default [`DEFAULT_SNAPSHOT`].
    pub snapshot: PathBuf,
}

/// Where the inventory snapshot is by default.
pub const DEFAULT_SNAPSHOT: &str = "/run/gpuarch/inventory.json";

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            refresh_interval_s: 60,
            nvml_timeout_ms: 10_000,
            snapshot: PathBuf::from(DEFAULT_SNAPSHOT),
        }
    }
}

fn refresh_interval_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "refresh_interval_s", 1..=86_400)
}

fn nvml_timeout_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "nvml_timeout_ms", 1..=600_000)
}
