//! The per-architecture JIT caches under `jit_cache.dir` (the hook makes
//! them; see `gpuarch_core::jit`): what is there, and eviction of the least
//! recently started above `jit_cache.max_bytes`.
//!
//! Everything a container wrote is walked by handle ([`crate::tree`]):
//! never following a symlink, at any depth, each inode once; and only names
//! the hook makes are touched. A cache's contents can neither point
//! gpuarchd elsewhere on the host nor hide from the size count behind a
//! link, a depth or many names for one file.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpuarch_core::config::JitCacheConfig;
use gpuarch_core::jit::{self, Label};
use gpuarch_wire::dbus::JitCacheRecord;

use crate::cache::{StoreFs, scan_mounts};

/// A cache handed out this recently is never evicted: the runtime may not
/// have mounted it yet.
pub const GRACE: Duration = Duration::from_secs(600);

/// How often gpuarchd enforces the limit on its own.
pub const INTERVAL: Duration = Duration::from_secs(600);

/// The caches below `cfg.dir`; none when it does not exist. `in_use` is
/// (scope, targets) of the caches mounted now.
pub fn list(
    cfg: &JitCacheConfig,
    in_use: &HashSet<(String, String)>,
) -> io::Result<Vec<JitCacheRecord>> {
    let mut out = Vec::new();
    let scopes = match std::fs::read_dir(&cfg.dir) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for s in scopes {
        let s = s?;
        let scope = s.file_name().to_string_lossy().into_owned();
        if !jit::valid_dir_name(&scope) || !s.file_type()?.is_dir() {
            continue;
        }
        let label = read_label(&s.path());
        let Ok(caches) = std::fs::read_dir(s.path()) else {
            continue;
        };
        for c in caches.flatten() {
            let targets = c.file_name().to_string_lossy().into_owned();
            let Ok(meta) = c.metadata() else { continue };
            if !jit::valid_dir_name(&targets) || !meta.is_dir() {
                continue;
            }
            out.push(JitCacheRecord {
                kind: label
                    .as_ref()
                    .map(|l| l.scope.to_string())
                    .unwrap_or_default(),
                uid: meta.uid(),
                image: label
                    .as_ref()
                    .and_then(|l| l.image.clone())
                    .unwrap_or_default(),
                namespace: label
                    .as_ref()
                    .and_then(|l| l.namespace.clone())
                    .unwrap_or_default(),
                bytes: disk_use(&c.path()),
                in_use: in_use.contains(&(scope.clone(), targets.clone())),
                last_used: meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_secs()),
                path: c.path().display().to_string(),
                scope: scope.clone(),
                targets,
            });
        }
    }
    out.sort_by(|a, b| (&a.scope, &a.targets).cmp(&(&b.scope, &b.targets)));
    Ok(out)
}

/// A scope's `scope.json`, read without following a symlink.
fn read_label(scope: &Path) -> Option<Label> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(scope.join(jit::LABEL_FILE))
        .ok()?;
    let mut text = Vec::new();
    f.take(64 << 10).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Bytes allocated to `dir` and everything in it, by handle
/// ([`crate::tree::size`]): never following a symlink, at any depth, each
/// inode once. A walk cut short (a directory moved during it) counts what
/// it saw, and says so.
pub fn disk_use(dir: &Path) -> u64 {
    let (total, err) = crate::tree::size(dir);
    if let Some(e) = err {
        tracing::warn!(
            "JIT cache {}: cannot be read ({e}); only the {total} bytes read so far are counted",
            dir.display()
        );
    }
    total
}

/// (scope, targets) of every cache below `dir` mounted in some mount
/// namespace: a mount of `dir`'s filesystem whose root is the cache or
/// inside it.
pub fn mounted(dir: &Path) -> HashSet<(String, String)> {
    let mut found = HashSet::new();
    let Some(fs) = StoreFs::locate(dir) else {
        return found;
    };
    let prefix = format!("{}/", fs.root.trim_end_matches('/'));
    scan_mounts(|dev, root| {
        if dev != fs.dev {
            return;
        }
        let Some(rest) = root.strip_prefix(&prefix) else {
            return;
        };
        let mut parts = rest.split('/');
        if let (Some(s), Some(t)) = (parts.next(), parts.next())
            && jit::valid_dir_name(s)
            && jit::valid_dir_name(t)
        {
            found.insert((s.to_owned(), t.to_owned()));
        }
    });
    found
}

/// What one collection did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub freed_bytes: u64,
    pub removed: Vec<PathBuf>,
    /// Caches set aside but not (wholly) removed, and why: they stay out
    /// of the hook's reach, and the next pass tries again.
    pub failed: Vec<String>,
}

fn age(p: &Path) -> Option<Duration> {
    std::fs::symlink_metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .map(|t| SystemTime::now().duration_since(t).unwrap_or_default())
}

/// Remove the least recently started caches until the rest fit in
/// `cfg.max_bytes`; never one mounted now (`in_use`) or handed out in the
/// last [`GRACE`]. A cache is renamed out of the hook's reach first and
/// judged again, so one handed out meanwhile goes back.
pub fn gc(cfg: &JitCacheConfig, in_use: &HashSet<(String, String)>) -> io::Result<GcReport> {
    let mut report = GcReport::default();
    leftovers(&cfg.dir);
    let mut caches = list(cfg, in_use)?;
    let mut total: u64 = caches.iter().map(|c| c.bytes).sum();
    caches.sort_by_key(|c| c.last_used);
    for c in caches {
        if total <= cfg.max_bytes {
            break;
        }
        let path = PathBuf::from(&c.path);
        if c.in_use || age(&path).is_none_or(|a| a < GRACE) {
            continue;
        }
        let gone = path.with_file_name(format!(".evict-{}", c.targets));
        if std::fs::rename(&path, &gone).is_err() {
            continue;
        }
        if age(&gone).is_none_or(|a| a < GRACE) {
            let _ = std::fs::rename(&gone, &path);
            continue;
        }
        match remove_tree(&gone) {
            Ok(()) => {
                total = total.saturating_sub(c.bytes);
                report.freed_bytes += c.bytes;
                report.removed.push(path);
            }
            Err(e) => report.failed.push(format!("{}: {e}", gone.display())),
        }
    }
    Ok(report)
}

/// Say what a collection did, in the journal.
pub fn log_report(r: &GcReport) {
    if !r.removed.is_empty() {
        tracing::info!(
            "JIT caches: removed {} least recently started, {} bytes",
            r.removed.len(),
            r.freed_bytes
        );
    }
    for f in &r.failed {
        tracing::warn!("JIT caches: cannot remove {f}");
    }
}

/// What a collection or a hook left half done: `.evict-*` (gpuarchd
/// stopped mid-removal) and `.new-*` older than [`GRACE`] (a hook died
/// before renaming its new directory into place).
fn leftovers(dir: &Path) {
    let Ok(scopes) = std::fs::read_dir(dir) else {
        return;
    };
    for s in scopes.flatten() {
        let top = s.file_name().to_string_lossy().into_owned();
        if top.starts_with(".new-") && age(&s.path()).is_some_and(|a| a >= GRACE) {
            let _ = remove_tree(&s.path());
            continue;
        }
        if !jit::valid_dir_name(&top) || !s.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(caches) = std::fs::read_dir(s.path()) else {
            continue;
        };
        for c in caches.flatten() {
            let n = c.file_name().to_string_lossy().into_owned();
            let stale = n.starts_with(".evict-")
                || (n.starts_with(".new-") && age(&c.path()).is_some_and(|a| a >= GRACE));
            if stale {
                let _ = remove_tree(&c.path());
            }
        }
    }
}

/// Remove a cache by handle ([`crate::tree::remove`]): never following a
/// symlink, at any depth.
fn remove_tree(p: &Path) -> io::Result<()> {
    crate::tree::remove(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn set_age(p: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        std::fs::File::open(p).unwrap().set_modified(t).unwrap();
    }

    fn cache(dir: &Path, scope: &str, targets: &str, bytes: usize, age_s: u64) -> PathBuf {
        let p = dir.join(scope).join(targets);
        std::fs::create_dir_all(p.join("torch_extensions")).unwrap();
        std::fs::write(p.join("torch_extensions/ext.so"), vec![7u8; bytes]).unwrap();
        set_age(&p, age_s);
        p
    }

    /// Before: 2,000 names for one 10 MiB file counted
    /// as 20 GiB and evicted another uid's cache under a 64 MiB cap; a tree
    /// deeper than PATH_MAX counted as 0 and was never freed.
    #[test]
    fn many_names_for_one_file_and_a_deep_tree_are_sized_truly() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let victim = cache(&dir, "uid2-shared", "sm_86", 4 << 20, 9000);
        let linked = cache(&dir, "uid1-shared", "sm_90", 10 << 20, 3600);
        for i in 0..2000 {
            std::fs::hard_link(
                linked.join("torch_extensions/ext.so"),
                linked.join(format!("torch_extensions/l{i}")),
            )
            .unwrap();
        }
        let cfg = JitCacheConfig {
            dir: dir.clone(),
            max_bytes: 64 << 20,
            ..JitCacheConfig::default()
        };
        let l = list(&cfg, &HashSet::new()).unwrap();
        let total: u64 = l.iter().map(|c| c.bytes).sum();
        assert!(total < 20 << 20, "{l:?}");
        assert_eq!(gc(&cfg, &HashSet::new()).unwrap(), GcReport::default());
        assert!(victim.exists());

        // A 1,000-level tree of 16 MiB: counted, and the first to go when
        // it is the oldest over the cap.
        let deep = dir.join("uid3-shared/sm_80");
        std::fs::create_dir_all(dir.join("uid3-shared")).unwrap();
        crate::tree::tests::deep(&deep, 1000, 16 << 20);
        set_age(&deep, 99_999);
        let l = list(&cfg, &HashSet::new()).unwrap();
        let d = l.iter().find(|c| c.targets == "sm_80").unwrap();
        assert!(d.bytes >= 16 << 20, "{d:?}");
        let tight = JitCacheConfig {
            max_bytes: 20 << 20,
            ..cfg.clone()
        };
        let r = gc(&tight, &HashSet::new()).unwrap();
        assert_eq!(r.removed, std::slice::from_ref(&deep), "{r:?}");
        assert!(!deep.exists() && victim.exists() && linked.exists());
    }

    /// A directory in a container's own cache swapped,
    /// over and over, with a link to another uid's cache (and to `/`):
    /// sizing never counts what is behind the link.
    #[test]
    fn a_directory_swapped_with_a_link_is_never_followed() {
        use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let other = cache(&dir, "uid2-shared", "sm_86", 32 << 20, 100);
        let mine = cache(&dir, "uid1-shared", "sm_90", 1 << 20, 100);
        let sub = mine.join("torch_extensions");
        let link = mine.join("swap");
        symlink(&other, &link).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, sub, link) = (stop.clone(), sub.clone(), link.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    renameat2(
                        AT_FDCWD,
                        &sub,
                        AT_FDCWD,
                        &link,
                        RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                    n += 1;
                }
                n
            })
        };
        for _ in 0..3000 {
            let n = disk_use(&mine);
            assert!(n < 8 << 20, "{n} bytes: the link was followed");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(swapper.join().unwrap() > 0);
        assert!(other.join("torch_extensions/ext.so").exists());
    }

    #[test]
    fn the_least_recently_started_unmounted_caches_go_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let old = cache(&dir, "uid1-shared", "sm_75", 1 << 20, 7200);
        let older_in_use = cache(&dir, "uid1-shared", "sm_80", 1 << 20, 9000);
        let mid = cache(&dir, "uid2-shared", "sm_86", 1 << 20, 3600);
        let fresh = cache(&dir, "uid2-shared", "sm_90", 1 << 20, 10);
        std::fs::write(
            dir.join("uid1-shared/scope.json"),
            r#"{"scope":"shared","uid":1,"gid":1}"#,
        )
        .unwrap();
        let cfg = JitCacheConfig {
            dir: dir.clone(),
            max_bytes: 2 << 20,
            ..JitCacheConfig::default()
        };
        let in_use: HashSet<_> = [("uid1-shared".to_owned(), "sm_80".to_owned())].into();
        let before = list(&cfg, &in_use).unwrap();
        assert_eq!(before.len(), 4);
        assert!(before.iter().all(|c| c.bytes >= 1 << 20), "{before:?}");
        assert_eq!(before[0].kind, "shared");
        assert!(before[1].in_use && !before[0].in_use);

        let r = gc(&cfg, &in_use).unwrap();
        // Over by about 2 MiB: the two oldest that may go, in order.
        assert_eq!(r.removed, [old.clone(), mid.clone()]);
        assert!(!old.exists() && !mid.exists());
        assert!(older_in_use.exists() && fresh.exists());
        // Under the limit now: nothing more.
        assert_eq!(gc(&cfg, &in_use).unwrap(), GcReport::default());
        // Never one handed out in the grace period, over the limit or not.
        let tight = JitCacheConfig {
            max_bytes: 1 << 20,
            ..cfg.clone()
        };
        let r = gc(&tight, &HashSet::new()).unwrap();
        assert_eq!(r.removed, [older_in_use]);
        assert!(fresh.exists());
    }

    #[test]
    fn links_a_container_left_are_neither_followed_nor_counted_through() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let host = tmp.path().join("host");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::write(host.join("precious"), vec![1u8; 4 << 20]).unwrap();
        let c = cache(&dir, "uid1-shared", "sm_86", 4096, 0);
        symlink(&host, c.join("escape")).unwrap();
        symlink(host.join("precious"), c.join("torch_extensions/escape.so")).unwrap();
        // A symlinked scope and cache, and a label that is a link.
        symlink(&host, dir.join("uid9-shared")).unwrap();
        symlink(&host, dir.join("uid1-shared/sm_90")).unwrap();
        symlink(host.join("precious"), dir.join("uid1-shared/scope.json")).unwrap();
        set_age(&c, 7200);
        let cfg = JitCacheConfig {
            dir: dir.clone(),
            max_bytes: 1 << 20,
            ..JitCacheConfig::default()
        };
        let l = list(&cfg, &HashSet::new()).unwrap();
        assert_eq!(l.len(), 1, "{l:?}");
        assert!(
            l[0].bytes < 1 << 20,
            "counted through a link: {}",
            l[0].bytes
        );
        assert_eq!(l[0].kind, "", "a label read through a link");
        // Over the limit only if the links were counted: nothing removed.
        assert_eq!(gc(&cfg, &HashSet::new()).unwrap().removed.len(), 0);
        let cfg = JitCacheConfig {
            max_bytes: 1,
            ..cfg
        };
        assert_eq!(gc(&cfg, &HashSet::new()).unwrap().removed, [c]);
        assert_eq!(std::fs::read(host.join("precious")).unwrap().len(), 4 << 20);
        assert!(host.exists() && dir.join("uid9-shared").exists());
    }

    #[test]
    fn half_done_work_is_cleaned_up() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let c = cache(&dir, "uid1-shared", "sm_86", 10, 0);
        let evict = dir.join("uid1-shared/.evict-sm_75");
        let young = dir.join("uid1-shared/.new-sm_90-12");
        let old = dir.join(".new-uid3-shared-12");
        for p in [&evict, &young, &old] {
            std::fs::create_dir_all(p).unwrap();
        }
        set_age(&old, 7200);
        let cfg = JitCacheConfig {
            dir: dir.clone(),
            ..JitCacheConfig::default()
        };
        gc(&cfg, &HashSet::new()).unwrap();
        assert!(!evict.exists() && !old.exists());
        assert!(young.exists() && c.exists());
    }
}
