//! What each GPU container got, kept for `gpuarchctl why`: one small JSON
//! file per start in `hook.record_dir` (`/run/gpuarch/containers`, made
//! by tmpfiles.d, mode 0700; used only when it exists).
//!
//! - Written by the shim on `create` and by the hook's precreate; the
//!   hook's in-container stages write one only when none is there for the
//!   id (precreate's Plan is what podman's container got).
//! - Replaced by a later start of the same id; removed, oldest first, by
//!   a pruning pass once the directory holds [`MAX_RECORDS`], and when
//!   older than [`MAX_AGE_S`]. Not on the runtime's `delete`: engines
//!   delete a container's task as soon as it exits, which is when someone
//!   asks why it failed.
//! - Kept by `gpuarch_fs::record`: one file named by the id (a hash of
//!   it when the engine's id is not a plain name), renamed into place: no
//!   directory listing. The pruning pass (a listing and a `stat` each)
//!   runs on one write in [`PRUNE_EVERY`], chosen by the clock's
//!   nanoseconds, never by the id, and on every write to a directory
//!   whose size says it may be full (on tmpfs a size counts its entries):
//!   there the cap is exact.
//! - A file is at most [`MAX_RECORD_BYTES`].

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::oci::Names;
use crate::plan::Plan;

/// Records kept at most; past it the oldest quarter goes.
pub const MAX_RECORDS: usize = 1024;
/// A record older than this is removed (30 days).
pub const MAX_AGE_S: u64 = 30 * 24 * 3600;
/// One record's bytes at most: notes past it are left out.
pub const MAX_RECORD_BYTES: usize = 16 * 1024;
/// On average one write in this many prunes the directory.
pub const PRUNE_EVERY: u32 = 32;
/// An id longer than this is kept cut (containerd's are 76 bytes at most).
pub const MAX_ID_BYTES: usize = 256;

/// One container start, as `gpuarchctl why` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    #[serde(default)]
    pub names: Names,
    /// Which program planned it: `gpuarch-runtime create`, ...
    pub by: String,
    /// When, in seconds since the epoch.
    pub at: u64,
    /// The Plan as `gpuarchctl plan` prints it: env, notes, mounts.
    pub plan: serde_json::Value,
}

impl Record {
    /// A record of `plan` for container `id` now.
    pub fn new(id: &str, by: &str, plan: &Plan) -> Self {
        let mut end = id.len().min(MAX_ID_BYTES);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        let mut names = plan.container.clone();
        names.id = None;
        let mut value = serde_json::to_value(plan).unwrap_or_default();
        // The source as the notes and `gpuarchctl plan` name it.
        if let (Some(src), Some(obj)) = (plan.source, value.as_object_mut()) {
            obj.insert("source".into(), src.to_string().into());
        }
        Self {
            id: id[..end].to_owned(),
            names,
            by: by.to_owned(),
            at: now(),
            plan: value,
        }
    }

    /// The record's JSON within [`MAX_RECORD_BYTES`]: notes are dropped
    /// from the end (saying how many) until it fits.
    pub fn to_bytes(&self) -> Vec<u8> {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        if bytes.len() <= MAX_RECORD_BYTES {
            return bytes;
        }
        let mut r = self.clone();
        loop {
            let bytes = serde_json::to_vec(&r).unwrap_or_default();
            if bytes.len() <= MAX_RECORD_BYTES {
                return bytes;
            }
            let notes = r.plan.get_mut("notes").and_then(|n| n.as_array_mut());
            match notes {
                Some(n) if n.len() > 1 => {
                    let keep = n.len() / 2;
                    let gone = n.len() - keep;
                    n.truncate(keep);
                    n.push(format!("({gone} more notes left out of this record)").into());
                }
                _ => {
                    r.plan = serde_json::json!({
                        "notes": ["the Plan was over the record's size bound: see the log"]
                    });
                }
            }
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `id` as a file name: itself when it is a plain name (letters, digits,
/// `_.-`, not starting with a dot, at most 128 bytes), else `h-` and a
/// hash of it.
pub fn key(id: &str) -> String {
    let plain = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if plain {
        id.to_owned()
    } else {
        let d = sha2::Sha256::digest(id.as_bytes());
        let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("h-{hex}")
    }
}

impl Record {
    /// A record as [`Record::to_bytes`] wrote it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Whether `query` names this record: an id or a prefix of one (at
    /// least 3 characters), a container or pod name, or `namespace/pod`.
    pub fn matches(&self, q: &str) -> bool {
        let n = &self.names;
        (q.len() >= 3 && self.id.starts_with(q))
            || n.name.as_deref() == Some(q)
            || n.pod.as_deref() == Some(q)
            || matches!((&n.namespace, &n.pod), (Some(ns), Some(p)) if q.split_once('/') == Some((ns.as_str(), p.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_id_is_its_own_key_and_any_other_a_hash() {
        assert_eq!(key("3f2a9c1e5b7d"), "3f2a9c1e5b7d");
        for hostile in ["", ".hidden", "../../etc", "a/b", &"x".repeat(129), "ü"] {
            let k = key(hostile);
            assert!(k.starts_with("h-") && k.len() == 34, "{hostile:?}: {k}");
        }
        assert_ne!(key("a/b"), key("a/c"));
    }

    #[test]
    fn a_query_names_an_id_prefix_a_name_or_namespace_and_pod() {
        let mut r = Record::new("3f2a9c1e5b7d", "t", &Plan::default());
        r.names = Names {
            name: Some("train".into()),
            pod: Some("job-7".into()),
            namespace: Some("ml".into()),
            ..Names::default()
        };
        for q in ["3f2", "3f2a9c1e5b7d", "train", "job-7", "ml/job-7"] {
            assert!(r.matches(q), "{q}");
        }
        for q in ["3f", "2a9", "ml", "other/job-7", "ml/job-"] {
            assert!(!r.matches(q), "{q}");
        }
    }
}
