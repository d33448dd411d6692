//! The records `gpuarchctl why` reads, kept as files: the format and its
//! bounds are `gpuarch_core::record`'s; here they are written, pruned
//! and found. One file per start in `hook.record_dir`, renamed into
//! place; a pruning pass on one write in [`PRUNE_EVERY`] (by the clock)
//! and on every write to a directory that may be full.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use gpuarch_core::record::{MAX_AGE_S, MAX_RECORD_BYTES, MAX_RECORDS, PRUNE_EVERY, Record, key};

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
        let Ok(r) = Record::from_bytes(&bytes) else {
            continue;
        };
        if r.matches(query) {
            found.push(r);
        }
    }
    found.sort_by_key(|r| std::cmp::Reverse(r.at));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuarch_core::oci::Names;
    use gpuarch_core::plan::Plan;
    use gpuarch_core::record::MAX_ID_BYTES;

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
