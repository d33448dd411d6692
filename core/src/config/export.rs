//! `export`: what gpuarchd publishes for schedulers beyond D-Bus (Node
//! Feature Discovery's labels file).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Invalid;

/// What gpuarchd publishes for schedulers beyond D-Bus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportConfig {
    /// Keep Node Feature Discovery's local-source file (`nfd_file`) with
    /// the node's `gpuarch.io/` labels, rewritten on a real change. Default
    /// false.
    pub nfd: bool,
    /// Default [`DEFAULT_NFD_FILE`]; its directory must exist (NFD's).
    pub nfd_file: PathBuf,
}

/// Default of `export.nfd_file`: where NFD's local source reads.
pub const DEFAULT_NFD_FILE: &str = "/etc/kubernetes/node-feature-discovery/features.d/gpuarch";

impl Default for ExportConfig {
    fn default() -> Self {
        Self {
            nfd: false,
            nfd_file: PathBuf::from(DEFAULT_NFD_FILE),
        }
    }
}

impl ExportConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if !self.nfd_file.is_absolute()
            || self
                .nfd_file
                .file_name()
                .is_none_or(|n| n.to_string_lossy().starts_with('.'))
        {
            return Err(Invalid::NfdFile(self.nfd_file.clone()));
        }
        Ok(())
    }
}
