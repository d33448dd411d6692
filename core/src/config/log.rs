//! `log`: where the hook and the shim put their lines, and how much.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Invalid, absolute, in_range};

/// Where `gpuarch-hook` and `gpuarch-runtime` put their lines. Never the
/// process's stderr unless asked, or a terminal: run by an engine, that
/// stderr is the container's own (the shim's on `create`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Default `auto`. `GPUARCH_LOG` (a target, a level, or both:
    /// `stderr,debug`) overrides it and `level`.
    pub to: LogTarget,
    pub level: LogLevel,
    /// The file of `to: file`, and of `auto` on a host with neither a
    /// journal nor `/dev/log`. Its directory is not created: without it
    /// the lines are dropped. Default [`DEFAULT_LOG_FILE`].
    pub file: PathBuf,
    /// Past this size the file is renamed to `<file>.1` (replacing the old
    /// one) and a new one started. Default 1 MiB; 4096 to 1 GiB.
    #[serde(deserialize_with = "log_max_bytes")]
    pub max_bytes: u64,
}

/// Where the hook and the shim log when nothing better is there.
pub const DEFAULT_LOG_FILE: &str = "/run/gpuarch/gpuarch.log";

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            to: LogTarget::Auto,
            level: LogLevel::Info,
            file: PathBuf::from(DEFAULT_LOG_FILE),
            max_bytes: 1 << 20,
        }
    }
}

fn log_max_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "max_bytes", 4096..=(1 << 30))
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogTarget {
    /// stderr when it is a terminal, else the journal, else syslog's
    /// `/dev/log`, else `file`.
    #[default]
    Auto,
    Journal,
    Syslog,
    File,
    Stderr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
}

impl std::str::FromStr for LogTarget {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "auto" => Self::Auto,
            "journal" => Self::Journal,
            "syslog" => Self::Syslog,
            "file" => Self::File,
            "stderr" => Self::Stderr,
            _ => return Err(()),
        })
    }
}

impl std::str::FromStr for LogLevel {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "error" => Self::Error,
            "warn" => Self::Warn,
            "info" => Self::Info,
            "debug" => Self::Debug,
            _ => return Err(()),
        })
    }
}

impl LogConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        absolute("log.file", &self.file)
    }
}
