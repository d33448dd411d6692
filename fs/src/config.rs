//! The config file, read as root reads what decides what runs as root:
//! opened once, its owner and mode (and every directory's above it)
//! checked on what was opened ([`crate::trust`]), then parsed
//! ([`gpuarch_core::config`]).

use std::io;
use std::path::{Path, PathBuf};

use crate::trust;

/// Where the config is read from when `GPUARCH_CONFIG` does not say.
pub const DEFAULT_CONFIG: &str = "/etc/gpuarch/config.yaml";

/// Why the config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read config {}: {error}", path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("config {}: {error}", path.display())]
    Parse {
        path: PathBuf,
        error: gpuarch_core::config::ConfigError,
    },
    /// The config decides what runs as root: another user's, or a writable
    /// one, is refused.
    #[error("config: {0}")]
    Untrusted(trust::Untrusted),
}

/// The config file to read: `GPUARCH_CONFIG` if set (it must then exist),
/// else [`DEFAULT_CONFIG`] (which may be absent: defaults apply).
pub fn config_path() -> (PathBuf, bool) {
    match std::env::var_os("GPUARCH_CONFIG") {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    }
}

/// Read the config named by `GPUARCH_CONFIG`, else [`DEFAULT_CONFIG`]. The
/// default file may be absent (defaults apply); a named one must exist.
pub fn read_config() -> Result<gpuarch_core::config::Config, ConfigFileError> {
    let (path, named) = config_path();
    read_config_at(&path, named)
}

/// Read and check the config at `path`. With `must_exist` false a missing
/// file is the default config.
pub fn read_config_at(
    path: &Path,
    must_exist: bool,
) -> Result<gpuarch_core::config::Config, ConfigFileError> {
    // Opened once and checked as opened: what is read is what was checked.
    let text = match trust::open(path) {
        Ok(f) => io::read_to_string(f).map_err(|error| ConfigFileError::Read {
            path: path.to_owned(),
            error,
        })?,
        Err(e) if e.is_not_found() && !must_exist => {
            return Ok(gpuarch_core::config::Config::default());
        }
        Err(trust::OpenError::Untrusted(u)) => return Err(ConfigFileError::Untrusted(u)),
        Err(trust::OpenError::Io { error, .. }) => {
            return Err(ConfigFileError::Read {
                path: path.to_owned(),
                error,
            });
        }
    };
    gpuarch_core::config::Config::from_yaml(&text).map_err(|error| ConfigFileError::Parse {
        path: path.to_owned(),
        error,
    })
}
