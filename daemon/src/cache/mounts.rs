//! What the containers of a host mount of the kernel cache, in any mount
//! namespace (read from `/proc/<pid>/mountinfo`): the entries in use, which
//! eviction must leave alone, and the views no container mounts, which are
//! swept.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use gpuarch_kernels::store;

use super::Cache;

/// How old a scan of the mounts ListKernels may report.
pub const IN_USE_TTL: Duration = Duration::from_secs(5);

impl Cache {
    /// Keys of store entries mounted in any mount namespace now: bound on
    /// their own, or linked into a mounted view.
    pub fn in_use(&self) -> HashSet<String> {
        let keys = self.mounted().keys;
        if let Ok(mut c) = self.in_use_seen.lock() {
            *c = Some((std::time::Instant::now(), keys.clone()));
        }
        keys
    }

    /// What the containers of this host mount of the cache now.
    pub fn mounted(&self) -> Mounted {
        let objects = self.builder.store.root().join("objects");
        match StoreFs::locate(&objects) {
            Some(fs) => mounted(&fs, StoreFs::locate(&self.cfg.view_dir()).as_ref()),
            None => Mounted::default(),
        }
    }

    /// Remove the views no container mounts and none has made for
    /// [`VIEW_GRACE`] (a hook that made one may not have mounted it yet).
    /// A view holds hard links: an evicted build's space is freed with the
    /// last view linking it.
    pub fn sweep_views(&self, mounted_views: &HashSet<String>) -> usize {
        sweep(&self.cfg.view_dir(), mounted_views)
    }

    /// [`Cache::in_use`] as of a scan at most [`IN_USE_TTL`] old, for the
    /// listing anyone may ask for: a flood of ListKernels costs one scan
    /// of `/proc` per interval, not one per call.
    pub fn in_use_recent(&self) -> HashSet<String> {
        if let Ok(c) = self.in_use_seen.lock()
            && let Some((at, keys)) = c.as_ref()
            && at.elapsed() < IN_USE_TTL
        {
            return keys.clone();
        }
        self.in_use()
    }
}

/// Mount tables longer than this (about 2,000 mounts) are not a
/// container's: such a namespace is skipped, not read to its end. An
/// unprivileged user with tens of thousands of mounts in a user namespace
/// once made every scan take 100 s.
pub const MOUNTINFO_MAX_BYTES: u64 = 256 * 1024;

/// A view no container mounts is kept this long after it was made: the
/// hook that made it may not have mounted it yet.
pub const VIEW_GRACE: Duration = Duration::from_secs(600);

/// Where the store's `objects/` is, as mountinfo names it: the filesystem's
/// device (`major:minor`) and the directory's path within that filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFs {
    pub dev: String,
    pub root: String,
    /// The directory as this process names it.
    pub path: String,
}

impl StoreFs {
    /// Locate `objects` (a store's directory) from this process's own
    /// mount table: the mount holding it, and the path below that mount.
    pub fn locate(objects: &Path) -> Option<Self> {
        let real = objects.canonicalize().ok()?;
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mut best: Option<(usize, Self)> = None;
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let (Some(dev), Some(root), Some(point)) = (f.get(2), f.get(3), f.get(4)) else {
                continue;
            };
            let point = unescape(point);
            let Ok(rest) = real.strip_prefix(&point) else {
                continue;
            };
            // The innermost (longest) mount point holding it, the last one
            // mounted there winning a tie.
            if best.as_ref().is_none_or(|(n, _)| point.len() >= *n) {
                let root = Path::new(&unescape(root)).join(rest);
                best = Some((
                    point.len(),
                    Self {
                        dev: (*dev).to_owned(),
                        root: root.display().to_string(),
                        path: real.display().to_string(),
                    },
                ));
            }
        }
        best.map(|(_, fs)| fs)
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the containers of a host mount of the kernel cache.
#[derive(Debug, Default)]
pub struct Mounted {
    /// Store keys: entries bound on their own, and entries linked into a
    /// mounted view.
    pub keys: HashSet<String>,
    /// Views (their directory names) that are mounted.
    pub views: HashSet<String>,
}

/// Remove the views under `dir` that are not in `mounted` and are older
/// than [`VIEW_GRACE`]; how many were removed. Only view names (64 hex
/// digits) are touched, and what an earlier sweep set aside: the hook's
/// temp directories finish or are its own. A hook reusing a view renews
/// its time first, and a view is judged again once set aside, so a view
/// being handed to a container now is kept.
fn sweep(dir: &Path, mounted: &HashSet<String>) -> usize {
    // One sweep at a time (after a job and on GC they may overlap): one
    // must not remove what another set aside to judge again.
    static ONE: Mutex<()> = Mutex::new(());
    let _one = ONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Set aside by a sweep that did not finish (gpuarchd stopped).
        if name.starts_with(".sweep-") {
            let _ = std::fs::remove_dir_all(e.path());
            continue;
        }
        let fresh = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < VIEW_GRACE));
        if !gpuarch_wire::manifest::is_view_name(&name) || fresh || mounted.contains(&name) {
            continue;
        }
        // Out of the hook's sight first, then judged again: a hook that
        // reuses a view renews its time before handing it to the runtime,
        // so one renewed meanwhile goes back.
        let gone = dir.join(format!(".sweep-{name}"));
        if std::fs::rename(e.path(), &gone).is_err() {
            continue;
        }
        let renewed = std::fs::metadata(&gone)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < VIEW_GRACE));
        if renewed {
            let _ = std::fs::rename(&gone, e.path());
            continue;
        }
        if std::fs::remove_dir_all(&gone).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// What is mounted of the store in any mount namespace, read from
/// `/proc/<pid>/mountinfo`, one process per namespace. A mount counts only
/// when it is of the store's own filesystem and its root is exactly an
/// entry of the store's `objects/` (not any path that ends the same:
/// another user's namespace cannot pin an entry with a look-alike), or,
/// when `views` is given, exactly a view of that directory on its
/// filesystem; a mounted view's entries are those its manifest names. A
/// namespace with a mount table over [`MOUNTINFO_MAX_BYTES`] is skipped.
pub fn mounted(store: &StoreFs, views: Option<&StoreFs>) -> Mounted {
    let mut found = Mounted::default();
    let prefix = format!("{}/", store.root.trim_end_matches('/'));
    let view_prefix = views.map(|v| (v, format!("{}/", v.root.trim_end_matches('/'))));
    scan_mounts(|dev, root| {
        // The view itself, or one package of it (a container with
        // mounts of its own under the kernels' directory).
        if let Some((v, vp)) = &view_prefix
            && dev == v.dev
            && let Some(rest) = root.strip_prefix(vp.as_str())
            && let name = rest.split('/').next().unwrap_or_default()
            && gpuarch_wire::manifest::is_view_name(name)
        {
            found.views.insert(name.to_owned());
            return;
        }
        if dev != store.dev {
            return;
        }
        let Some((shard, k)) = root.strip_prefix(&prefix).and_then(|r| r.split_once('/')) else {
            return;
        };
        if store::valid_key(k) && k.starts_with(shard) {
            found.keys.insert(k.to_owned());
        }
    });
    if let Some(v) = views {
        let dir = Path::new(&v.path);
        for name in &found.views {
            found.keys.extend(view_keys(&dir.join(name)));
        }
    }
    found
}

/// Every mount of every mount namespace, as `(device, root)` (the root
/// unescaped), read from `/proc/<pid>/mountinfo`, one process per
/// namespace. A namespace with a mount table over [`MOUNTINFO_MAX_BYTES`]
/// is skipped.
pub fn scan_mounts(mut each: impl FnMut(&str, &str)) {
    use std::io::Read;
    let mut seen_ns = HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut text = String::new();
    for p in procs.flatten() {
        let name = p.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // One read per mount namespace. Under the unit's capability
        // set the namespace link of another user's process cannot be read
        // (no CAP_SYS_PTRACE), but its mountinfo can: read it then too,
        // or that container's mounts would be missed and evicted.
        if let Ok(ns) = std::fs::read_link(p.path().join("ns/mnt"))
            && !seen_ns.insert(ns)
        {
            continue;
        }
        let Ok(f) = std::fs::File::open(p.path().join("mountinfo")) else {
            continue;
        };
        text.clear();
        if f.take(MOUNTINFO_MAX_BYTES + 1)
            .read_to_string(&mut text)
            .is_err()
            || text.len() as u64 > MOUNTINFO_MAX_BYTES
        {
            continue;
        }
        for line in text.lines() {
            let mut f = line.split(' ').skip(2);
            if let (Some(dev), Some(root)) = (f.next(), f.next()) {
                each(dev, &unescape(root));
            }
        }
    }
}

/// The store keys a view links, from its packages' manifests
/// (`<view>/<package>/manifest.json`, or `<view>/manifest.json` for a
/// one-package view an older hook made); none from one that cannot be read
/// (a view the hook is still making is not mounted yet).
fn view_keys(view: &Path) -> Vec<String> {
    let keys = |manifest: &Path| -> Vec<String> {
        std::fs::read(manifest)
            .ok()
            .and_then(|b| serde_json::from_slice::<gpuarch_wire::manifest::View>(&b).ok())
            .map(|v| v.builds.into_iter().map(|b| b.key).collect())
            .unwrap_or_default()
    };
    let own = view.join("manifest.json");
    if own.is_file() {
        return keys(&own);
    }
    let Ok(packages) = std::fs::read_dir(view) else {
        return Vec::new();
    };
    packages
        .flatten()
        .flat_map(|p| keys(&p.path().join("manifest.json")))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gpuarch_core::config::KernelsConfig;

    /// Run `script` in a new mount namespace, wait until it touched
    /// `ready`, and return the process (kill it to end the namespace).
    fn in_namespace(script: &str, ready: &Path) -> std::process::Child {
        let child = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "{script} && touch {} && exec sleep 60",
                ready.display()
            ))
            .spawn()
            .unwrap();
        // Setting up 5,000 mounts takes about 15 s of a quiet 2-core
        // machine, much more of a loaded one: this waits for set-up, it
        // times nothing.
        let t0 = std::time::Instant::now();
        while !ready.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(180),
                "the namespace never got ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    /// A store entry bind-mounted in another mount namespace (as a
    /// container's would be) counts as in use; unmounted, it does not. A
    /// look-alike (a directory whose path merely ends the same, on another
    /// filesystem or elsewhere on the same one) never counts, and a
    /// namespace with an enormous mount table is skipped, not read.
    #[test]
    fn an_entry_mounted_in_another_namespace_is_in_use() {
        gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root("to make a mount namespace"));
        let tmp = tempfile::tempdir().unwrap();
        let key = "ab".repeat(32);
        let objects = tmp.path().join("store/objects");
        let entry = objects.join("ab").join(&key);
        let target = tmp.path().join("target");
        std::fs::create_dir_all(&entry).unwrap();
        std::fs::create_dir_all(&target).unwrap();
        let fs = StoreFs::locate(&objects).unwrap();
        assert!(fs.root.ends_with("/store/objects"), "{fs:?}");

        let mut child = in_namespace(
            &format!("mount --bind {} {}", entry.display(), target.display()),
            &tmp.path().join("ready"),
        );
        assert!(mounted(&fs, None).keys.contains(&key));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!mounted(&fs, None).keys.contains(&key));

        // Look-alikes: the same path tail on a tmpfs, and elsewhere on the
        // store's own filesystem.
        let fake = tmp.path().join("fake/objects/ab").join(&key);
        std::fs::create_dir_all(&fake).unwrap();
        let (t1, t2) = (tmp.path().join("t1"), tmp.path().join("t2"));
        std::fs::create_dir_all(&t1).unwrap();
        std::fs::create_dir_all(&t2).unwrap();
        let script = format!(
            "mount -t tmpfs none {t} && mkdir -p {t}/objects/ab/{key} && mount --bind {t}/objects/ab/{key} {t2} \
             && mount --bind {f} {t1}",
            t = tmp.path().join("fake").display(),
            t2 = t2.display(),
            f = fake.display(),
            t1 = t1.display(),
        );
        let mut child = in_namespace(&script, &tmp.path().join("ready2"));
        assert!(
            !mounted(&fs, None).keys.contains(&key),
            "a look-alike pinned the entry"
        );
        child.kill().unwrap();
        child.wait().unwrap();

        // The real entry, beside 5,000 other mounts: the table is too big
        // to be a container's, so the namespace is not read.
        let many = tmp.path().join("many");
        std::fs::create_dir_all(&many).unwrap();
        let script = format!(
            "mount --bind {e} {t} && mount -t tmpfs none {m} && i=0 && while [ $i -lt 5000 ]; do \
             mkdir {m}/$i && mount -t tmpfs none {m}/$i || exit 1; i=$((i+1)); done",
            e = entry.display(),
            t = target.display(),
            m = many.display(),
        );
        let mut child = in_namespace(&script, &tmp.path().join("ready3"));
        let t0 = std::time::Instant::now();
        let keys = mounted(&fs, None).keys;
        let took = t0.elapsed();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!keys.contains(&key), "a 5,000-mount namespace was read");
        assert!(took < Duration::from_secs(2), "the scan took {took:?}");
    }

    /// A mounted view pins the entries its packages' manifests name, and
    /// so does one package of a view mounted alone; a view no one mounts
    /// is swept once past its grace period, a fresh one is not.
    #[test]
    fn a_mounted_view_pins_its_builds_and_unmounted_old_views_are_swept() {
        gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root("to make a mount namespace"));
        let tmp = tempfile::tempdir().unwrap();
        let [key, key2, key3] = ["cd", "ce", "cf"].map(|k| k.repeat(32));
        let objects = tmp.path().join("store/objects");
        for k in [&key, &key2, &key3] {
            std::fs::create_dir_all(objects.join(&k[..2]).join(k)).unwrap();
        }
        let views = tmp.path().join("store/views");
        let (mounted_view, old_view, fresh_view, part_view) = (
            "a".repeat(64),
            "b".repeat(64),
            "c".repeat(64),
            "d".repeat(64),
        );
        for v in [&mounted_view, &old_view, &fresh_view, &part_view] {
            std::fs::create_dir_all(views.join(v)).unwrap();
        }
        let package = |view: &str, package: &str, key: &str| {
            let m = gpuarch_wire::manifest::View {
                package: package.into(),
                version: "1".into(),
                gpus: Vec::new(),
                builds: vec![gpuarch_wire::manifest::ViewBuild {
                    dir: "sm_86".into(),
                    arch: "sm_86".into(),
                    variant: "fp32".into(),
                    dtype: None,
                    files: Vec::new(),
                    key: key.to_owned(),
                }],
                libraries: Vec::new(),
            };
            let dir = views.join(view).join(package);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
        };
        package(&mounted_view, "saxpy", &key);
        package(&mounted_view, "rotary", &key2);
        package(&part_view, "saxpy", &key3);
        let (target, target2) = (tmp.path().join("target"), tmp.path().join("target2"));
        std::fs::create_dir_all(&target).unwrap();
        std::fs::create_dir_all(&target2).unwrap();
        let fs = StoreFs::locate(&objects).unwrap();
        let vfs = StoreFs::locate(&views).unwrap();
        assert!(mounted(&fs, Some(&vfs)).keys.is_empty());

        let mut child = in_namespace(
            &format!(
                "mount --bind -o ro {} {} && mount --bind -o ro {} {}",
                views.join(&mounted_view).display(),
                target.display(),
                views.join(&part_view).join("saxpy").display(),
                target2.display()
            ),
            &tmp.path().join("ready"),
        );
        let m = mounted(&fs, Some(&vfs));
        assert_eq!(
            m.keys,
            HashSet::from([key.clone(), key2.clone(), key3.clone()]),
            "{m:?}"
        );
        assert_eq!(
            m.views,
            HashSet::from([mounted_view.clone(), part_view.clone()])
        );

        // Age the unmounted one past the grace period; keep the fresh one.
        let old = std::time::SystemTime::now() - VIEW_GRACE - Duration::from_secs(60);
        std::fs::File::open(views.join(&old_view))
            .unwrap()
            .set_modified(old)
            .unwrap();
        std::fs::File::open(views.join(&mounted_view))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let cfg = KernelsConfig {
            cache_dir: tmp.path().join("store"),
            ..KernelsConfig::default()
        };
        // What a sweep that did not finish set aside goes too.
        std::fs::create_dir_all(views.join(".sweep-dead")).unwrap();
        assert_eq!(sweep(&cfg.view_dir(), &m.views), 1);
        assert!(!views.join(".sweep-dead").exists());
        assert!(!views.join(&old_view).exists());
        assert!(views.join(&mounted_view).exists(), "mounted: kept");
        assert!(views.join(&fresh_view).exists(), "fresh: kept");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(mounted(&fs, Some(&vfs)).keys.is_empty());
    }
}
