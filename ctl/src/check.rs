//! The findings `gpuarchctl doctor` prints: a check's name, its status,
//! what it found and, for a problem, the line that fixes it; and where
//! files are looked for (below `--root`, so an image or a chroot can be
//! checked before it boots). Shared by doctor's own checks and the engines'
//! ([`crate::engine`]).

use std::path::{Path, PathBuf};

/// A check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Nothing to check (an engine that is not installed).
    Skip,
    /// Works, with something missing that a part of gpuarch needs (NVRTC
    /// for the kernel builds): containers still get their Plan. Not a
    /// failure for the exit status.
    Warn,
    Fail,
}

/// One finding.
#[derive(Debug, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

pub fn ok(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Ok,
        detail: detail.into(),
        fix: None,
    }
}

pub fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Fail,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

pub fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Warn,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

pub fn skip(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Skip,
        detail: detail.into(),
        fix: None,
    }
}

/// `path` (absolute, on the host) as seen below `root`.
pub fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}
