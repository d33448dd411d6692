//! `env`: how the Plan's variables are injected.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::Invalid;
use crate::env::EnvVar;

/// How the Plan's variables are injected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Replace values the container already sets. Default `false`.
    #[serde(rename = "override")]
    pub override_existing: bool,
    /// Variables never to inject. Default: none.
    pub disable: BTreeSet<EnvVar>,
    /// Opt-in variables to inject ([`EnvVar::opt_in`]:
    /// `ACCELERATE_MIXED_PRECISION`). Default: none.
    pub enable: BTreeSet<EnvVar>,
    /// The CUDA toolkit to build arch lists for when the container says
    /// none (no `CUDA_VERSION`, no `NVIDIA_REQUIRE_CUDA`, no annotation
    /// `io.gpuarch.cuda-version`). Default: none, and then each GPU's exact
    /// capability (see [`crate::toolkit`]).
    pub cuda_version: Option<crate::arch::CudaVersion>,
}

impl EnvConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if let Some(v) = self.enable.iter().find(|v| !v.opt_in()) {
            let opt_in: Vec<&str> = EnvVar::ALL
                .iter()
                .filter(|v| v.opt_in())
                .map(|v| v.name())
                .collect();
            return Err(Invalid::NotOptIn {
                var: v.name().to_owned(),
                opt_in: opt_in.join(", "),
            });
        }
        Ok(())
    }
}
