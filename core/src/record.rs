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
//! - A write is one file named by the id (a hash of it when the engine's
//!   id is not a plain name), renamed into place: no directory listing.
//!   The pruning pass (a listing and a `stat` each) runs on one write in
//!   [`PRUNE_EVERY`], chosen by the clock's nanoseconds, never by the id,
//!   and on every write to a directory whose size says it may be full (on
//!   tmpfs a size counts its entries): there the cap is exact.
//! - A file is at most [`MAX_RECORD_BYTES`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

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

/// The record files in `dir`: (key, path).
fn list(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    Ok(std::fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let key = name.to_str()?.strip_suffix(".json")?;
            (!key.starts_with('.')).then(|| (key.to_owned(), e.path()))
        })
        .collect())
}

/// Keep `record` in `dir` (which must exist: nothing is kept otherwise).
/// With `only_first`, nothing is written when a record of the same id is
/// there. Returns whether it wrote.
pub fn keep(dir: &Path, record: &Record, only_first: bool) -> std::io::Result<bool> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    keep_pruning(dir, record, only_first, nanos.is_multiple_of(PRUNE_EVERY))
}

fn keep_pruning(
    dir: &Path,
    record: &Record,
    only_first: bool,
    prune_now: bool,
) -> std::io::Result<bool> {
    let name = format!("{}.json", key(&record.id));
    let path = dir.join(&name);
    if only_first && std::fs::symlink_metadata(&path).is_ok() {
        return Ok(false);
    }
    if prune_now || may_be_full(dir) {
        prune(dir)?;
    }
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?; // create_new: never through a symlink
        f.write_all(&record.to_bytes())?;
        // A record of the same id (a restarted container) is replaced.
        std::fs::rename(&tmp, &path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    Ok(true)
}

/// What one entry adds to a directory's size on tmpfs (the kernel's
/// `BOGO_DIRENT_SIZE`), where `/run/gpuarch` is.
const DIRENT_BYTES: u64 = 20;
/// Writers that may race to the last places: the cap is kept this far
/// below [`MAX_RECORDS`] by a directory's size alone.
const RACING: u64 = 16;

/// Whether `dir` may already hold [`MAX_RECORDS`] records, from its size
/// alone (one `stat`): then the write prunes first, and on tmpfs the cap
/// is exact, not kept on average by the clock's pass. A size that is not
/// a multiple of 20 is not tmpfs's count (a disk directory's is in
/// blocks), and only the clock's pass prunes there; a disk size that is
/// one is read as a count too, and at worst prunes once more.
fn may_be_full(dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| {
        let size = m.len();
        size % DIRENT_BYTES == 0 && size / DIRENT_BYTES + RACING >= MAX_RECORDS as u64
    })
}

/// Remove records older than [`MAX_AGE_S`], and past [`MAX_RECORDS`] the
/// oldest until three quarters are left. Ages are the files' mtimes (when
/// each was written).
fn prune(dir: &Path) -> std::io::Result<()> {
    let now = std::time::SystemTime::now();
    let mut all: Vec<(std::time::SystemTime, PathBuf)> = list(dir)?
        .into_iter()
        .filter_map(|(_, p)| Some((std::fs::symlink_metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    all.sort();
    let old =
        |t: std::time::SystemTime| now.duration_since(t).is_ok_and(|d| d.as_secs() > MAX_AGE_S);
    let over = all.len().saturating_sub(MAX_RECORDS * 3 / 4);
    let excess = if all.len() + RACING as usize >= MAX_RECORDS {
        over
    } else {
        0
    };
    for (i, (t, p)) in all.iter().enumerate() {
        if i < excess || old(*t) {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(())
}

/// The records `query` names: an id or a prefix of one (at least 3
/// characters), a container or pod name, or `namespace/pod`. Newest first.
pub fn find(dir: &Path, query: &str) -> std::io::Result<Vec<Record>> {
    let mut found = Vec::new();
    for (_, path) in list(dir)? {
        let Ok(f) = std::fs::File::open(&path) else {
            continue;
        };
        let mut bytes = Vec::new();
        if f.take(MAX_RECORD_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .is_err()
            || bytes.len() > MAX_RECORD_BYTES
        {
            continue;
        }
        let Ok(r) = serde_json::from_slice::<Record>(&bytes) else {
            continue;
        };
        if matches(&r, query) {
            found.push(r);
        }
    }
    found.sort_by_key(|r| std::cmp::Reverse(r.at));
    Ok(found)
}

fn matches(r: &Record, q: &str) -> bool {
    let n = &r.names;
    (q.len() >= 3 && r.id.starts_with(q))
        || n.name.as_deref() == Some(q)
        || n.pod.as_deref() == Some(q)
        || matches!((&n.namespace, &n.pod), (Some(ns), Some(p)) if q.split_once('/') == Some((ns.as_str(), p.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(notes: usize) -> Plan {
        Plan {
            env: vec![("TORCH_CUDA_ARCH_LIST".into(), "8.6".into())],
            notes: (0..notes)
                .map(|i| format!("note {i} {}", "x".repeat(200)))
                .collect(),
            container: Names {
                pod: Some("job-7".into()),
                namespace: Some("ml".into()),
                ..Names::default()
            },
            ..Plan::default()
        }
    }

    #[test]
    fn kept_found_by_prefix_or_name_and_replaced() {
        let d = tempfile::tempdir().unwrap();
        let id = "3f2a9c1e5b7d".repeat(5);
        assert!(
            keep(
                d.path(),
                &Record::new(&id, "gpuarch-runtime create", &plan(2)),
                false
            )
            .unwrap()
        );
        // A hook stage after it does not replace it.
        assert!(
            !keep(
                d.path(),
                &Record::new(&id, "gpuarch-hook create-container", &plan(0)),
                true
            )
            .unwrap()
        );
        for q in [&id[..3], id.as_str(), "job-7", "ml/job-7"] {
            let r = find(d.path(), q).unwrap();
            assert_eq!(r.len(), 1, "{q}");
            assert_eq!(r[0].by, "gpuarch-runtime create");
            assert_eq!(r[0].plan["env"]["TORCH_CUDA_ARCH_LIST"], "8.6");
        }
        for q in ["3f", "other", "ml/other", "default/job-7"] {
            assert!(find(d.path(), q).unwrap().is_empty(), "{q}");
        }
        // The same id started again replaces its record.
        keep(d.path(), &Record::new(&id, "again", &plan(0)), false).unwrap();
        let r = find(d.path(), &id).unwrap();
        assert_eq!((r.len(), r[0].by.as_str()), (1, "again"));
    }

    #[test]
    fn a_hostile_id_is_a_hash_and_a_huge_plan_is_cut() {
        for bad in ["../../etc/passwd", ".hidden", "", "a/b", &"a".repeat(129)] {
            let k = key(bad);
            assert!(k.starts_with("h-") && k.len() == 34, "{bad}: {k}");
        }
        assert_eq!(key("moby-3f2a_1.x"), "moby-3f2a_1.x");
        let d = tempfile::tempdir().unwrap();
        let id = "../".repeat(200);
        keep(d.path(), &Record::new(&id, "t", &plan(1000)), false).unwrap();
        let files: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(files.len(), 1);
        let len = files[0].metadata().unwrap().len() as usize;
        assert!(len <= MAX_RECORD_BYTES, "{len}");
        let r = &find(d.path(), "../../").unwrap()[0];
        assert_eq!(r.id.len(), MAX_ID_BYTES);
        let notes = r.plan["notes"].as_array().unwrap();
        assert!(
            notes
                .last()
                .unwrap()
                .as_str()
                .unwrap()
                .contains("more notes left out")
        );
    }

    #[test]
    fn the_cap_is_exact_on_tmpfs_whatever_the_clock_chooses() {
        // /run/gpuarch is a tmpfs; /dev/shm is one here too.
        let Some(shm) = Some(Path::new("/dev/shm")).filter(|p| p.is_dir()) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI needs /dev/shm (a tmpfs)"
            );
            return;
        };
        let d = tempfile::tempdir_in(shm).unwrap();
        let mut most = 0;
        for i in 0..MAX_RECORDS + 300 {
            // The clock's pass never chosen: the size alone prunes.
            keep_pruning(
                d.path(),
                &Record::new(&format!("c{i}"), "t", &plan(0)),
                false,
                false,
            )
            .unwrap();
            most = most.max(list(d.path()).unwrap().len());
        }
        assert!(most <= MAX_RECORDS, "{most} records at once");
        // Pruned a few times, not at every write.
        assert!(most >= MAX_RECORDS - RACING as usize - 1, "{most}");
    }

    #[test]
    fn the_directory_stays_bounded_and_old_records_go() {
        let d = tempfile::tempdir().unwrap();
        // A record written long ago, and a full directory.
        let stale = d.path().join("old.json");
        std::fs::write(&stale, b"{}").unwrap();
        let long_ago =
            std::time::SystemTime::now() - std::time::Duration::from_secs(MAX_AGE_S + 60);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        // Without a pruning pass the write costs no listing.
        keep_pruning(d.path(), &Record::new("first", "t", &plan(0)), false, false).unwrap();
        assert!(stale.exists());
        for i in 0..MAX_RECORDS {
            let f = d.path().join(format!("c{i:04}.json"));
            std::fs::write(&f, b"{}").unwrap();
            let t = std::time::SystemTime::now() - std::time::Duration::from_secs(3600)
                + std::time::Duration::from_millis(i as u64);
            std::fs::File::options()
                .write(true)
                .open(&f)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        keep_pruning(d.path(), &Record::new("newest", "t", &plan(0)), false, true).unwrap();
        let left: Vec<String> = list(d.path())
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert!(left.len() <= MAX_RECORDS * 3 / 4 + 1, "{}", left.len());
        assert!(!stale.exists());
        assert!(left.contains(&"newest".to_owned()) && left.contains(&"first".to_owned()));
        // The newest of the others stay, the oldest went.
        assert!(left.contains(&format!("c{:04}", MAX_RECORDS - 1)));
        assert!(!left.contains(&"c0000".to_owned()));
    }
}
