//! `audit`: the image audit at container start. gpuarchd audits each image
//! once (the CUDA binaries its consumers carry, in a worker process) and
//! keeps the result; each start's Plan then notes every binary an
//! assigned GPU cannot run.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Invalid, absolute, in_range};

/// The image audit at container start. Off unless `dir` is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Where gpuarchd keeps each image's audit (`<dir>/<image>.json`) and
    /// where the hook asks for one (`<dir>/requests/`). gpuarchd makes it,
    /// root only; the hook uses it only when it exists. Default null: no
    /// audit at start (`gpuarchctl audit` works without it).
    pub dir: Option<PathBuf>,
    /// How long a start waits for the audit of an image seen for the first
    /// time, in milliseconds (0 to 60000). Default 0: the first start of an
    /// image asks for its audit and goes on; later starts are judged.
    #[serde(deserialize_with = "wait_ms")]
    pub wait_ms: u64,
    /// Refuse a start when an assigned GPU cannot run one of the image's
    /// binaries, with the reason. Default false: the start goes on, and
    /// the Plan's notes say what will fail.
    pub refuse: bool,
    /// Longest one audit runs, in seconds (1 to 3600). Default 300.
    #[serde(deserialize_with = "max_seconds")]
    pub max_seconds: u64,
}

fn wait_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "audit.wait_ms", 0..=60_000)
}

fn max_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "audit.max_seconds", 1..=3600)
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            dir: None,
            wait_ms: 0,
            refuse: false,
            max_seconds: 300,
        }
    }
}

impl AuditConfig {
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        self.dir
            .as_deref()
            .map_or(Ok(()), |p| absolute("audit.dir", p))
    }

    /// Where the hook leaves its requests.
    pub fn requests_dir(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join("requests"))
    }

    /// The kept audit of the image whose read key is `key`.
    pub fn entry(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.json")))
    }
}

/// Whether `key` names an image as the image read keys it (64 hex
/// digits): the only names gpuarchd takes from its request directory.
pub fn valid_key(key: &str) -> bool {
    key.len() == 64
        && key
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}
