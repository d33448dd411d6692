//! Which of gpuarch's consumers an image holds: the `*.dist-info` (and
//! `*.egg-info`) entries of its Python environments, read from its rootfs
//! through a handle confined to it ([`Root`]), bounded in entries, bytes
//! and time, and cached per image.
//!
//! The environments are those the container's Python would import from,
//! found as Python finds them ([`envs`]): the interpreters on the
//! process's `PATH` (venvs, conda envs, prefixes), `VIRTUAL_ENV`,
//! `CONDA_PREFIX`, `PYTHONPATH`, the user site of the process's user, and
//! the usual prefixes, `lib64` included. A consumer's release is the
//! `Version:` of its `METADATA` (`PKG-INFO` for an egg), else its entry's
//! name. Where an interpreter's environment could not be read, the
//! result says so (`Software::unread`), and no consumer's absence counts
//! as proven.
//!
//! The read runs on a thread of its own and is waited for at most
//! [`WAIT`]: a directory whose first read alone takes longer (an overlay
//! merging half a million entries) leaves the image not read, and the
//! start goes on.
//!
//! The cache is keyed by what identifies the environments' contents: each
//! one's path, inode, modification and change times, and what was not
//! read. Beside it, per process (its Python variables and user), what
//! discovery found for the last few images and every path it depended on
//! ([`probe`]): a start whose paths all stat as they did takes those
//! environments without listing a directory, inline, with no reader
//! thread. Images that share the layer holding them share an entry; a
//! container that installs a package changes them, and is read again. An
//! image's author sets none of those three (mtime is set by the layer's
//! tar, ctime and the inode by the host when it is unpacked), so no image
//! can name another's entry.

mod envs;
mod files;
mod probe;
pub mod tree;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_core::oci::ContainerView;
use gpuarch_core::software::{self, Dist, Release, Software};
use sha2::{Digest, Sha256};

use crate::rootfs::Root;
use envs::Site;
pub use envs::rel_of;
pub use files::Files;
pub use tree::Layers;
use tree::Tree;

/// Most directory entries read for one image, in all.
pub const MAX_ENTRIES: usize = 1 << 18;
/// Most `METADATA` files read for one image; past them a consumer's
/// release is its entry's name.
pub const MAX_METADATA_READS: usize = 64;
/// Longest the reader works; past it the image counts as not read.
pub const DEADLINE: Duration = Duration::from_millis(40);
/// Longest a start waits for the reader, whatever one system call of it
/// costs.
pub const WAIT: Duration = Duration::from_millis(50);
/// Most bytes of a `METADATA` read: its headers come first.
const MAX_METADATA: usize = 64 << 10;
/// Most entries the cache directory keeps before it is emptied.
pub const MAX_CACHED: usize = 4096;
/// Most bytes of a cache entry read.
const MAX_CACHE_ENTRY: u64 = 64 << 10;

/// Why the image was not read, for the Plan's notes.
#[derive(Debug, thiserror::Error)]
pub enum Stop {
    #[error("over {0} directory entries")]
    Entries(usize),
    #[error("over {} ms", DEADLINE.as_millis())]
    Time,
}

pub(crate) struct Budget {
    entries: usize,
    max: usize,
    until: Instant,
}

impl Budget {
    fn new(max: usize, deadline: Duration) -> Self {
        Self {
            entries: 0,
            max,
            until: Instant::now() + deadline,
        }
    }

    /// One more directory entry.
    fn take(&mut self) -> Result<(), Stop> {
        self.entries += 1;
        if self.entries > self.max {
            return Err(Stop::Entries(self.max));
        }
        self.in_time()
    }

    fn in_time(&self) -> Result<(), Stop> {
        if Instant::now() > self.until {
            return Err(Stop::Time);
        }
        Ok(())
    }
}

/// The cache key of these sites: their paths, inodes, and modification and
/// change times, and what was not read.
fn key<T: Tree>(tree: &T, sites: &[Site<T::Dir>], unread: &[String]) -> String {
    let mut h = Sha256::new();
    // 4: a site may be made of several layers' directories; 5: of a
    // consumer in two releases the oldest is kept, not the first found.
    h.update(b"gpuarch-image-software-5\0");
    for e in sites {
        h.update(e.rel.as_bytes());
        h.update(b"\0");
        // Not st_dev: an overlay's is new with each container's mount.
        for id in tree.identity(&e.dir) {
            for n in &id[1..] {
                h.update(n.to_le_bytes());
            }
        }
        h.update(b"\0");
    }
    for u in unread {
        h.update(b"unread\0");
        h.update(u.as_bytes());
        h.update(b"\0");
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// `Version:` of a core-metadata file's headers (what comes before the
/// first empty line; the description follows it).
fn metadata_version(text: &[u8]) -> Option<Release> {
    text.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.strip_prefix(b"Version:"))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(Release::parse)
}

/// Most bytes of a `METADATA` read first: every build backend writes
/// `Version:` third, after `Metadata-Version:` and `Name:`; torch's
/// whole file is 32 KB.
const METADATA_HEAD: usize = 4 << 10;

/// The release a core-metadata file `rel` names: from its first
/// [`METADATA_HEAD`] bytes, else (headers longer than that, with no
/// `Version:` yet) from its first [`MAX_METADATA`].
fn read_version<T: Tree>(root: &T, rel: &str) -> Option<Release> {
    let head = root.read_regular(rel, METADATA_HEAD).ok()?;
    if let Some(r) = metadata_version(&head) {
        return Some(r);
    }
    let headers_end =
        head.windows(2).any(|w| w == b"\n\n") || head.windows(3).any(|w| w == b"\n\r\n");
    if head.len() < METADATA_HEAD || headers_end {
        return None;
    }
    metadata_version(&root.read_regular(rel, MAX_METADATA).ok()?)
}

/// The consumers in these sites, under the budget. Where the sites hold a
/// consumer in two releases, which one a process imports depends on the
/// interpreter it runs: two torches make torch not known, of another
/// consumer the oldest is kept, and a library's reader in two versions
/// (`Software::exact`) gets no library. The notes say which.
fn scan<T: Tree>(
    root: &T,
    sites: &[Site<T::Dir>],
    budget: &mut Budget,
    notes: &mut Vec<String>,
) -> Result<Software, Stop> {
    let mut sw = Software::default();
    // Every release of each consumer, with where: the image may hold one
    // in each of several environments, and which a process imports
    // depends on the interpreter it runs.
    let mut all: Vec<(Dist, Release, String)> = Vec::new();
    let mut gated: Vec<(String, String)> = Vec::new();
    let mut metadata_reads = 0;
    for site in sites {
        let mut found = Vec::new();
        root.names(&site.dir, budget, &mut |n, _| {
            if let Some(d) = software::dist_info(n) {
                found.push((d, n.to_owned()));
            }
            if let Some(gate) = gpuarch_core::library::gated_dist_info(n) {
                gated.push(gate);
            }
        })?;
        sw.read.push(format!("/{}", site.rel));
        for ((dist, by_name), entry) in found {
            let meta = if entry.ends_with(".dist-info") {
                format!("{}/{entry}/METADATA", site.rel)
            } else {
                format!("{}/{entry}/PKG-INFO", site.rel)
            };
            let release = if metadata_reads < MAX_METADATA_READS {
                budget.in_time()?;
                metadata_reads += 1;
                read_version(root, &meta).unwrap_or(by_name)
            } else {
                by_name
            };
            all.push((dist, release, format!("/{}/{entry}", site.rel)));
        }
    }
    all.sort();
    all.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    for same in all.chunk_by(|a, b| a.0 == b.0) {
        let (dist, oldest, _) = &same[0];
        sw.dists.insert(*dist, *oldest);
        if same.len() < 2 {
            continue;
        }
        // Torch's names grow with its releases: a list for one may be
        // refused by the other. Another consumer's release only ever
        // narrows what is given (DeepSpeed's parser): the oldest decides.
        let taken = if *dist == Dist::Torch {
            sw.dists.remove(dist);
            "the arch lists suit every torch release"
        } else {
            "the oldest decides"
        };
        let of: Vec<String> = same
            .iter()
            .map(|(_, r, at)| format!("{r} ({at:?})"))
            .collect();
        notes.push(format!(
            "the image holds {dist} {}: {taken}",
            of.join(" and ")
        ));
    }
    // A library is served for its reader's very version: where the image
    // holds two of a reader, neither is known to be the one imported.
    gated.sort();
    gated.dedup();
    let readers: Vec<&str> = gpuarch_core::library::ALL
        .iter()
        .map(|k| k.reader.name())
        .collect();
    for same in gated.chunk_by(|a, b| a.0 == b.0) {
        let (dist, version) = &same[0];
        if same.len() > 1 && readers.contains(&dist.as_str()) {
            let versions: Vec<&str> = same.iter().map(|(_, v)| v.as_str()).collect();
            notes.push(format!(
                "the image holds {dist} {}: no library is served for it",
                versions.join(" and ")
            ));
            continue;
        }
        sw.exact.insert(dist.clone(), version.clone());
    }
    Ok(sw)
}

/// What the image at `root` holds for the process of `view` (its env and
/// user), from `cache` (a directory that exists) when it has the entry,
/// else read and then cached. The notes say what could not be read or
/// cached. Never fails: an image that cannot be read is one nothing is
/// known of.
pub fn read(root: &Root, view: &ContainerView, cache: Option<&Path>) -> (Software, Vec<String>) {
    read_within(root, view, cache, MAX_ENTRIES, DEADLINE, WAIT)
}

/// A Slurm task as its TaskProlog sees it (Slurm runs the prolog as the
/// job's owner, with the task's env): its env and user, and what the
/// node's root holds for that process ([`read`], as that user; not cached,
/// the cache being root's), where its env names a Python environment of
/// its own ([`names_an_environment`]). The notes say what could not be
/// read, or why nothing was.
pub fn read_task() -> (ContainerView, Vec<String>) {
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let mut view = ContainerView::with_env(env);
    view.user = Some((
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    ));
    if !names_an_environment(&view) {
        return (view, vec![NO_ENVIRONMENT.to_owned()]);
    }
    let (software, notes) = match Root::open(Path::new("/")) {
        Ok(root) => read(&root, &view, None),
        Err(e) => not_read(e),
    };
    // An interpreter the read could not follow (a pyenv shim, a wrapper
    // script) may import another torch than the one found: for a task,
    // whose command is not known, nothing read is then taken.
    if !software.unread.is_empty() {
        let why = software.unread.join("; ");
        return (
            view,
            vec![format!(
                "the task's Python environments were not read whole ({why:.300}): it is planned for software not known"
            )],
        );
    }
    view.software = software;
    (view, notes)
}

/// Why a task's environments were not read.
pub const NO_ENVIRONMENT: &str = "the task's env names no Python environment of its own (no VIRTUAL_ENV or CONDA_PREFIX, no python on PATH outside the system's directories): it may run in a container, so the node's Python is not taken for its own";

/// The directories of the node's own interpreters: a task whose only
/// python is there may run an image's (Apptainer, pyxis), which the
/// prolog cannot see.
const SYSTEM_BINS: [&str; 6] = [
    "/usr/bin",
    "/bin",
    "/usr/local/bin",
    "/usr/sbin",
    "/sbin",
    "/usr/local/sbin",
];

/// Whether the task of `view` names a Python environment of its own: a
/// `VIRTUAL_ENV` or `CONDA_PREFIX` that is a directory, or a `python3` or
/// `python` on its `PATH` outside [`SYSTEM_BINS`] (a venv's, conda's, a
/// module's). Only then is what the node holds what the task imports;
/// the values made for a Python read elsewhere could break another one
/// (an arch name an older torch does not know).
pub fn names_an_environment(view: &ContainerView) -> bool {
    let activated = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|k| view.env_get(k))
        .any(|v| Path::new(v).is_absolute() && Path::new(v).is_dir());
    activated
        || view
            .env_get("PATH")
            .unwrap_or_default()
            .split(':')
            .take(32)
            .filter(|d| d.starts_with('/') && !SYSTEM_BINS.contains(&d.trim_end_matches('/')))
            .any(|d| {
                ["python3", "python"]
                    .iter()
                    .any(|p| Path::new(d).join(p).exists())
            })
}

/// [`read`] for an image given as its layers (gpuarchd's NRI path).
pub fn read_layers(
    layers: &Layers,
    view: &ContainerView,
    cache: Option<&Path>,
) -> (Software, Vec<String>) {
    read_within(layers, view, cache, MAX_ENTRIES, DEADLINE, WAIT)
}

/// An image nothing is known of, and why, as the Plan's note says it.
pub fn not_read(why: impl std::fmt::Display) -> (Software, Vec<String>) {
    (
        Software::default(),
        vec![format!(
            "the image's Python environments were not read: {why}"
        )],
    )
}

fn read_within<T: Tree + Send + 'static>(
    root: &T,
    view: &ContainerView,
    cache: Option<&Path>,
    max: usize,
    deadline: Duration,
    wait: Duration,
) -> (Software, Vec<String>) {
    // A start like an earlier one takes, with a stat for each path that
    // discovery depended on, what it found, and the consumers cached for
    // it: no directory is listed, so no thread is needed to bound it.
    if let Some(hit) = cache
        .filter(|c| c.is_dir())
        .and_then(|c| seen_before(root, view, c))
    {
        return hit;
    }
    let Ok(root) = root.try_clone() else {
        return not_read("no file descriptor left");
    };
    // Only what finds the environments: the process's env and user.
    let process = ContainerView {
        env: view.env.clone(),
        user: view.user,
        ..ContainerView::default()
    };
    let cache = cache.map(Path::to_owned);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let reader = std::thread::Builder::new()
        .name("image-read".to_owned())
        .spawn(move || {
            let mut root = root;
            let _ = tx.send(read_here(
                &mut root,
                &process,
                cache.as_deref(),
                max,
                deadline,
            ));
        });
    if let Err(e) = reader {
        return not_read(format!("no thread to read it: {e}"));
    }
    match rx.recv_timeout(wait) {
        Ok(read) => read,
        // The reader is left to finish its system call and end; the start
        // does not wait for it.
        Err(_) => not_read(format!(
            "over {} ms (one directory read alone took longer)",
            wait.as_millis()
        )),
    }
}

fn read_here<T: Tree>(
    root: &mut T,
    view: &ContainerView,
    cache: Option<&Path>,
    max: usize,
    deadline: Duration,
) -> (Software, Vec<String>) {
    let mut notes = Vec::new();
    let mut budget = Budget::new(max, deadline);
    // A tree that resolves paths itself stops at the same instant; what
    // it then could not look up is not taken for absent: a lookup past
    // the deadline is trouble, and the image counts as not read.
    root.until(budget.until);
    let root = &*root;
    let probing = probe::Probing::new(root);
    let found = match envs::discover(&probing, view, &mut budget) {
        Ok(f) => f,
        Err(stop) => return not_read(stop),
    };
    if let Some(e) = root.trouble() {
        return not_read(e);
    }
    if let Some(c) = cache.filter(|c| c.is_dir()) {
        let d = Discovered {
            probes: probing.probes.into_inner(),
            sites: found.sites.iter().map(|s| s.rel.clone()).collect(),
            unread: found.unread.clone(),
        };
        if let Err(e) = remember(c, view, d) {
            notes.push(format!("what was found not cached: {e}"));
        }
    }
    if found.sites.is_empty() && found.unread.is_empty() {
        // Nothing to read, and a known absence: no environment at all.
        return (
            Software {
                read: vec![software::NO_PYTHON.to_owned()],
                ..Software::default()
            },
            notes,
        );
    }
    let image_key = key(root, &found.sites, &found.unread);
    let entry = cache
        .filter(|c| c.is_dir())
        .map(|c| c.join(format!("{image_key}.json")));
    if let Some(Cached {
        mut software,
        notes: said,
    }) = entry.as_deref().and_then(cached)
    {
        software.image_key = Some(image_key);
        notes.extend(said);
        return (software, notes);
    }
    let mut said = Vec::new();
    let mut sw = match scan(root, &found.sites, &mut budget, &mut said) {
        Ok(sw) => sw,
        Err(stop) => return not_read(stop),
    };
    if let Some(e) = root.trouble() {
        return not_read(e);
    }
    sw.unread = found.unread;
    sw.image_key = Some(image_key);
    let kept = Cached {
        software: sw,
        notes: said,
    };
    if let Some(entry) = entry
        && let Err(e) = store(&entry, &kept)
    {
        notes.push(format!("the image's consumers not cached: {e}"));
    }
    notes.extend(kept.notes);
    (kept.software, notes)
}

/// A cache entry: what the image holds, and what the read said of it (two
/// releases of a consumer, and which decides), so that every start of the
/// image says it, not the first alone.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Cached {
    software: Software,
    notes: Vec<String>,
}

/// What discovery found for a process, and the paths it depended on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Discovered {
    probes: Vec<probe::Probe>,
    sites: Vec<String>,
    unread: Vec<String>,
}

/// Images kept per process (its Python variables and user): most images
/// share a default `PATH`.
const MAX_DISCOVERED: usize = 8;

/// The variables of a process that decide where its Python imports from.
pub const PROCESS_VARS: [&str; 7] = [
    "PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTHONPATH",
    "PYTHONUSERBASE",
    "HOME",
    "PYTHONHOME",
];

/// Hash into `h` what of the process of `view` decides which environments
/// the read finds: its Python variables and its user.
pub fn hash_process(h: &mut Sha256, view: &ContainerView) {
    for var in PROCESS_VARS {
        h.update(var.as_bytes());
        h.update(b"=");
        h.update(view.env_get(var).unwrap_or("\0unset").as_bytes());
        h.update(b"\0");
    }
    h.update(format!("{:?}", view.user).as_bytes());
}

/// The cache file of what discovery found for the process of `view`.
fn discovered_file(cache: &Path, view: &ContainerView) -> PathBuf {
    let mut h = Sha256::new();
    h.update(b"gpuarch-image-discovered-1\0");
    hash_process(&mut h, view);
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    cache.join(format!("d-{hex}.json"))
}

fn all_discovered(file: &Path) -> Vec<Discovered> {
    std::fs::File::open(file)
        .ok()
        .and_then(|f| crate::context::read_at_most(f, MAX_CACHE_ENTRY).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Keep `d` first among what was found for this process.
fn remember(cache: &Path, view: &ContainerView, d: Discovered) -> std::io::Result<()> {
    let file = discovered_file(cache, view);
    let mut all = all_discovered(&file);
    all.retain(|x| *x != d);
    all.insert(0, d);
    all.truncate(MAX_DISCOVERED);
    // What does not fit in one entry's bound is not kept: it could never
    // be read back, and its stats are not a cheap start.
    while !all.is_empty() {
        let bytes = serde_json::to_vec(&all).map_err(std::io::Error::other)?;
        if bytes.len() as u64 <= MAX_CACHE_ENTRY {
            return store_bytes(&file, &bytes);
        }
        all.pop();
    }
    Ok(())
}

/// The read of an image like one read before: every path its discovery
/// depended on is as it was, and its consumers are cached. Only `stat`s
/// and `open`s of known paths, no directory listed.
fn seen_before<T: Tree>(
    root: &T,
    view: &ContainerView,
    cache: &Path,
) -> Option<(Software, Vec<String>)> {
    let d = all_discovered(&discovered_file(cache, view))
        .into_iter()
        .find(|d| d.probes.iter().all(|p| p.holds(root)))?;
    if d.sites.is_empty() && d.unread.is_empty() {
        return Some((
            Software {
                read: vec![software::NO_PYTHON.to_owned()],
                ..Software::default()
            },
            Vec::new(),
        ));
    }
    let sites = d
        .sites
        .iter()
        .map(|rel| {
            root.dir(rel).ok().map(|dir| Site {
                rel: rel.clone(),
                dir,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let image_key = key(root, &sites, &d.unread);
    let entry = cache.join(format!("{image_key}.json"));
    cached(&entry).map(|mut c| {
        c.software.image_key = Some(image_key);
        (c.software, c.notes)
    })
}

/// The entry at `entry`; `None` where there is none or it does not parse
/// (one written before its notes were kept is read again, and replaced).
fn cached(entry: &Path) -> Option<Cached> {
    let f = std::fs::File::open(entry).ok()?;
    let bytes = crate::context::read_at_most(f, MAX_CACHE_ENTRY).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn store(entry: &Path, sw: &Cached) -> std::io::Result<()> {
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
    store_bytes(entry, &bytes)
}

fn store_bytes(entry: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = entry.parent().unwrap_or(Path::new("."));
    // Written whole and renamed into place, so a reader sees all of it or
    // nothing; not synced: an entry lost in a crash is read again, and a
    // sync on a disk-backed cache cost a start over 50 ms in the tests.
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        entry.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(bytes)?;
        std::fs::rename(&tmp, entry)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
    let (sw, notes) = read(root, view, Some(cache));
    view.software = sw;
    notes
}

#[cfg(test)]
mod tests;
