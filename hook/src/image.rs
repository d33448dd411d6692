//! Which of gpuarch's consumers an image holds: the `*.dist-info` (and
//! `*.egg-info`) entries of its Python environments, read from its rootfs
//! through a handle confined to it ([`Root`]), bounded in entries and time,
//! and cached per image.
//!
//! The environments looked at are `site-packages` and `dist-packages` of
//! each `python3*` directory under `/usr/lib`, `/usr/local/lib`,
//! `/opt/conda/lib`, `/opt/venv/lib`, `/venv/lib`, and Debian's
//! `/usr/lib/python3/dist-packages`. A consumer's release is the `Version:`
//! of its `METADATA` (`PKG-INFO` for an egg), else its entry's name.
//!
//! The cache is keyed by what identifies those directories' contents: each
//! one's inode, modification and change times. Images that share the layer
//! holding them share an entry; a container that installs a package changes
//! them, and is read again. An image's author sets none of those three
//! (mtime is set by the layer's tar, ctime and the inode by the host when
//! it is unpacked), so no image can name another's entry.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_core::software::{self, Dist, Release, Software};
use sha2::{Digest, Sha256};

use crate::rootfs::Root;

/// The prefixes whose `python3*` directories hold environments.
const PREFIXES: [&str; 5] = [
    "usr/lib",
    "usr/local/lib",
    "opt/conda/lib",
    "opt/venv/lib",
    "venv/lib",
];
/// Debian's and Ubuntu's own packages' environment.
const DEBIAN: &str = "usr/lib/python3/dist-packages";
/// Most directory entries read for one image, in all.
pub const MAX_ENTRIES: usize = 1 << 18;
/// Most environments looked at.
pub const MAX_ENVIRONMENTS: usize = 32;
/// Longest a read may take; past it the image counts as not read.
pub const DEADLINE: Duration = Duration::from_millis(50);
/// Most bytes of a `METADATA` read: its headers come first.
const MAX_METADATA: usize = 64 << 10;
/// Most entries the cache directory keeps before it is emptied.
pub const MAX_CACHED: usize = 4096;
/// Most bytes of a cache entry read.
const MAX_CACHE_ENTRY: u64 = 64 << 10;

/// Why the image was not read, for the Plan's notes.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("over {0} directory entries")]
    Entries(usize),
    #[error("over {} ms", DEADLINE.as_millis())]
    Time,
}

struct Budget {
    entries: usize,
    max: usize,
    until: Instant,
}

impl Budget {
    fn take(&mut self) -> Result<(), Stop> {
        self.entries += 1;
        if self.entries > self.max {
            return Err(Stop::Entries(self.max));
        }
        if self.entries.is_multiple_of(256) && Instant::now() > self.until {
            return Err(Stop::Time);
        }
        Ok(())
    }
}

/// An environment found: its path inside the image and a handle on it.
struct Environment {
    rel: String,
    dir: OwnedFd,
}

/// Names in directory `dir`, each passed to `each`, under the budget.
fn names(dir: &OwnedFd, budget: &mut Budget, mut each: impl FnMut(&str)) -> Result<(), Stop> {
    let Ok(fd) = nix::unistd::dup(dir.as_fd()) else {
        return Ok(());
    };
    let Ok(mut d) = nix::dir::Dir::from_fd(fd) else {
        return Ok(());
    };
    for e in d.iter() {
        let Ok(e) = e else { break };
        budget.take()?;
        if let Ok(name) = e.file_name().to_str() {
            each(name);
        }
    }
    Ok(())
}

fn environments(root: &Root, budget: &mut Budget) -> Result<Vec<Environment>, Stop> {
    let mut rels = vec![DEBIAN.to_owned()];
    for prefix in PREFIXES {
        let Ok(dir) = root.open_dir_read(Path::new(prefix)) else {
            continue;
        };
        let mut pythons = Vec::new();
        names(&dir, budget, |n| {
            if n.starts_with("python3") && pythons.len() < MAX_ENVIRONMENTS {
                pythons.push(n.to_owned());
            }
        })?;
        pythons.sort();
        for p in pythons {
            for site in ["site-packages", "dist-packages"] {
                rels.push(format!("{prefix}/{p}/{site}"));
            }
        }
    }
    // Once each, however many names lead there (`python3` beside
    // `python3.12`, a symlinked `lib`).
    let mut seen = std::collections::HashSet::new();
    Ok(rels
        .into_iter()
        .filter_map(|rel| {
            let dir = root.open_dir_read(Path::new(&rel)).ok()?;
            let st = nix::sys::stat::fstat(dir.as_fd()).ok()?;
            seen.insert((st.st_dev, st.st_ino))
                .then_some(Environment { rel, dir })
        })
        .take(MAX_ENVIRONMENTS)
        .collect())
}

/// The cache key of these environments: their paths, inodes, and
/// modification and change times.
fn key(envs: &[Environment]) -> String {
    let mut h = Sha256::new();
    // 2: with the exact versions a prebuilt library is gated on.
    h.update(b"gpuarch-image-software-2\0");
    for e in envs {
        let Ok(st) = nix::sys::stat::fstat(e.dir.as_fd()) else {
            continue;
        };
        h.update(e.rel.as_bytes());
        h.update(b"\0");
        // Not st_dev: an overlay's is new with each container's mount.
        for n in [
            st.st_ino as i64,
            st.st_mtime,
            st.st_mtime_nsec,
            st.st_ctime,
            st.st_ctime_nsec,
        ] {
            h.update(n.to_le_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `Version:` of a core-metadata file's headers.
fn metadata_version(text: &[u8]) -> Option<Release> {
    let text = String::from_utf8_lossy(text);
    text.lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix("Version:"))
        .and_then(Release::parse)
}

/// The consumers in these environments, under the budget.
fn scan(
    root: &Root,
    envs: &[Environment],
    budget: &mut Budget,
    notes: &mut Vec<String>,
) -> Result<Software, Stop> {
    let mut sw = Software::default();
    let mut torches: Vec<(Release, String)> = Vec::new();
    for env in envs {
        let mut found = Vec::new();
        names(&env.dir, budget, |n| {
            if let Some(d) = software::dist_info(n) {
                found.push((d, n.to_owned()));
            }
            if let Some((dist, version)) = gpuarch_core::library::gated_dist_info(n) {
                sw.exact.entry(dist).or_insert(version);
            }
        })?;
        sw.read.push(format!("/{}", env.rel));
        for ((dist, by_name), entry) in found {
            let meta = if entry.ends_with(".dist-info") {
                format!("{}/{entry}/METADATA", env.rel)
            } else {
                format!("{}/{entry}/PKG-INFO", env.rel)
            };
            let release = root
                .read_regular(Path::new(&meta), MAX_METADATA)
                .ok()
                .and_then(|t| metadata_version(&t))
                .or(Some(by_name));
            let Some(release) = release else { continue };
            if dist == Dist::Torch {
                torches.push((release, format!("/{}/{entry}", env.rel)));
            }
            sw.dists.entry(dist).or_insert(release);
        }
    }
    torches.sort();
    torches.dedup_by(|a, b| a.0 == b.0);
    if torches.len() > 1 {
        sw.dists.remove(&Dist::Torch);
        notes.push(format!(
            "the image holds torch {}: the arch lists suit every torch release",
            torches
                .iter()
                .map(|(r, at)| format!("{r} ({at})"))
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    }
    Ok(sw)
}

/// What the image at `root` holds, from `cache` (a directory that exists)
/// when it has the entry, else read and then cached. The notes say what
/// could not be read or cached. Never fails: an image that cannot be read
/// is one nothing is known of.
pub fn read(root: &Root, cache: Option<&Path>) -> (Software, Vec<String>) {
    read_within(root, cache, MAX_ENTRIES)
}

fn read_within(root: &Root, cache: Option<&Path>, max: usize) -> (Software, Vec<String>) {
    let mut notes = Vec::new();
    let mut budget = Budget {
        entries: 0,
        max,
        until: Instant::now() + DEADLINE,
    };
    let envs = match environments(root, &mut budget) {
        Ok(e) => e,
        Err(stop) => {
            notes.push(format!(
                "the image's Python environments were not read: {stop}"
            ));
            return (Software::default(), notes);
        }
    };
    if envs.is_empty() {
        // Nothing to read, and a known absence: no environment at all.
        return (
            Software {
                read: vec!["(no Python environment)".to_owned()],
                ..Software::default()
            },
            notes,
        );
    }
    let entry = cache
        .filter(|c| c.is_dir())
        .map(|c| c.join(format!("{}.json", key(&envs))));
    if let Some(sw) = entry.as_deref().and_then(cached) {
        return (sw, notes);
    }
    let sw = match scan(root, &envs, &mut budget, &mut notes) {
        Ok(sw) => sw,
        Err(stop) => {
            notes.push(format!(
                "the image's Python environments were not read: {stop}"
            ));
            return (Software::default(), notes);
        }
    };
    if let Some(entry) = entry
        && let Err(e) = store(&entry, &sw)
    {
        notes.push(format!("the image's consumers not cached: {e}"));
    }
    (sw, notes)
}

fn cached(entry: &Path) -> Option<Software> {
    let f = std::fs::File::open(entry).ok()?;
    let bytes = crate::context::read_at_most(f, MAX_CACHE_ENTRY).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn store(entry: &Path, sw: &Software) -> std::io::Result<()> {
    let dir = entry.parent().unwrap_or(Path::new("."));
    let count = std::fs::read_dir(dir)?.take(MAX_CACHED + 1).count();
    if count > MAX_CACHED {
        for e in std::fs::read_dir(dir)?.flatten() {
            if e.file_name().to_string_lossy().ends_with(".json") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let bytes = serde_json::to_vec(sw).map_err(std::io::Error::other)?;
    gpuarch_fs::write_atomic(entry, &bytes)
}

/// The rootfs of a config, where it can be found from here: `root.path`,
/// absolute or relative to `bundle`.
pub fn rootfs_of(config: &serde_json::Value, bundle: Option<&Path>) -> Option<PathBuf> {
    let path = Path::new(config.get("root")?.get("path")?.as_str()?);
    if path.is_absolute() {
        Some(path.to_owned())
    } else {
        bundle.map(|b| b.join(path))
    }
}

/// Read the consumers of the image at `root` into `view` (through the
/// handle confined to it, cached in `cache`); the notes.
pub fn read_into(
    view: &mut gpuarch_core::oci::ContainerView,
    root: &Root,
    cache: &Path,
) -> Vec<String> {
    let (sw, notes) = read(root, Some(cache));
    view.software = sw;
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn consumers_come_from_metadata_in_every_environment() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(
            r,
            "usr/local/lib/python3.12/dist-packages/torch-2.9.1+cu128.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1+cu128\n\nVersion: 9.9\n",
        );
        write(
            r,
            "opt/conda/lib/python3.11/site-packages/flashinfer_python-0.6.5.dist-info/METADATA",
            "Name: flashinfer-python\nVersion: 0.6.5\n",
        );
        // The name says 0.0.1; METADATA is what pip reads.
        write(
            r,
            "usr/lib/python3/dist-packages/xformers-0.0.1.dist-info/METADATA",
            "Name: xformers\nVersion: 0.0.33.post2\n",
        );
        // No METADATA: the entry's name.
        std::fs::create_dir_all(
            r.join("usr/lib/python3.12/site-packages/deepspeed-0.19.8.dist-info"),
        )
        .unwrap();
        write(
            r,
            "usr/lib/python3.12/site-packages/numpy-2.1.0.dist-info/METADATA",
            "Version: 2.1.0\n",
        );
        let root = Root::open(r).unwrap();
        let (sw, notes) = read(&root, None);
        assert!(notes.is_empty(), "{notes:?}");
        let got: Vec<String> = sw.dists.iter().map(|(d, v)| format!("{d} {v}")).collect();
        assert_eq!(
            got,
            [
                "torch 2.9.1",
                "flashinfer-python 0.6.5",
                "xformers 0.0.33",
                "deepspeed 0.19.8"
            ]
        );
        assert_eq!(sw.read.len(), 4, "{:?}", sw.read);
    }

    #[test]
    fn two_torches_make_torch_unknown_and_no_environment_is_known_absence() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (env, v) in [
            ("usr/lib/python3.10/site-packages", "2.7.1"),
            ("opt/venv/lib/python3.12/site-packages", "2.9.1"),
        ] {
            write(
                r,
                &format!("{env}/torch-{v}.dist-info/METADATA"),
                &format!("Version: {v}\n"),
            );
        }
        let (sw, notes) = read(&Root::open(r).unwrap(), None);
        assert_eq!(sw.get(Dist::Torch), None);
        assert!(sw.was_read());
        assert!(
            notes[0].contains(
                "torch 2.7.1 (/usr/lib/python3.10/site-packages/torch-2.7.1.dist-info) and 2.9.1"
            ),
            "{notes:?}"
        );
        let empty = tempfile::tempdir().unwrap();
        let (sw, _) = read(&Root::open(empty.path()).unwrap(), None);
        assert!(sw.was_read() && sw.dists.is_empty() && !sw.may_have(Dist::DeepSpeed));
    }

    #[test]
    fn a_hostile_image_neither_blocks_nor_leads_outside_nor_costs_without_bound() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().join("rootfs");
        let env = "usr/lib/python3.12/site-packages";
        // METADATA a FIFO: opening it to read would wait for a writer.
        let d = r.join(env).join("torch-2.7.1.dist-info");
        std::fs::create_dir_all(&d).unwrap();
        nix::unistd::mkfifo(
            &d.join("METADATA"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        // METADATA an absolute link: it resolves inside the image, to the
        // image's file, never the host's beside it.
        let d = r.join(env).join("deepspeed-0.1.0.dist-info");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(dir.path().join("host-metadata"), "Version: 6.6.6\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("host-metadata"), d.join("METADATA")).unwrap();
        // An environment that is a link out of the image: followed inside.
        std::fs::create_dir_all(r.join("opt/conda/lib/python3.11")).unwrap();
        std::os::unix::fs::symlink(
            "/../../../../",
            r.join("opt/conda/lib/python3.11/site-packages"),
        )
        .unwrap();
        let root = Root::open(&r).unwrap();
        let t = Instant::now();
        let (sw, notes) = read(&root, None);
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(
            sw.get(Dist::Torch),
            Some(Release::new(2, 7, 1)),
            "by its name"
        );
        assert_eq!(
            sw.get(Dist::DeepSpeed),
            Some(Release::new(0, 1, 0)),
            "not the host's 6.6.6"
        );
        assert!(notes.is_empty(), "{notes:?}");
        // Entries past the bound: the image counts as not read.
        for i in 0..64 {
            std::fs::create_dir_all(r.join(env).join(format!("pkg{i}"))).unwrap();
        }
        let (sw, notes) = read_within(&root, None, 32);
        assert!(!sw.was_read() && sw.dists.is_empty());
        assert!(
            notes[0].contains("not read: over 32 directory entries"),
            "{notes:?}"
        );
    }

    #[test]
    fn the_cache_answers_until_an_environment_changes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let r = dir.path();
        let env = "usr/lib/python3.12/site-packages";
        write(
            r,
            &format!("{env}/torch-2.7.1.dist-info/METADATA"),
            "Version: 2.7.1\n",
        );
        let root = Root::open(r).unwrap();
        let (first, _) = read(&root, Some(cache.path()));
        assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 1);
        // A changed METADATA alone is not seen: the entry answers.
        write(
            r,
            &format!("{env}/torch-2.7.1.dist-info/METADATA"),
            "Version: 2.9.1\n",
        );
        assert_eq!(read(&root, Some(cache.path())).0, first);
        // A package installed changes the environment: read again.
        std::thread::sleep(Duration::from_millis(20));
        write(
            r,
            &format!("{env}/deepspeed-0.19.8.dist-info/METADATA"),
            "Version: 0.19.8\n",
        );
        let (again, _) = read(&root, Some(cache.path()));
        assert_eq!(again.get(Dist::Torch), Some(Release::new(2, 9, 1)));
        assert!(again.get(Dist::DeepSpeed).is_some());
        // A missing cache directory is not created.
        let gone = cache.path().join("gone");
        let _ = read(&root, Some(&gone));
        assert!(!gone.exists());
    }
}
