//! The content-addressed store of builds.
//!
//! ```text
//! <root>/objects/<k[0..2]>/<k>/   one build: its files and manifest.json
//! <root>/tmp/<k>.<pid>.<n>/       builds in progress (same filesystem)
//! <root>/locks/<k>.lock           flock: one build of a key at a time
//! <root>/failures/<k>.json        a build the compiler refused, and why
//! <root>/pins/<k>                 pinned by an admin's pre-warm
//! <root>/used/<k>                 its mtime is the entry's last use
//! <root>/quarantine/<k>.<t>/      entries that failed verification
//! <root>/remote-refused/<k>.json  a registry artifact refused, and why
//! ```
//!
//! An entry appears by one `rename(2)` of a complete, fsynced directory, so
//! a reader sees all of it or nothing; a builder killed midway leaves only
//! a `tmp/` directory, removed by the next builder of that key (which takes
//! the lock the dead one held) or when the store is opened.

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use gpuarch_core::arch::{CodeKind, Target};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use gpuarch_fs::write_atomic;

pub use crate::error::BuildError;
use crate::inspect;
use crate::spec::sha256_hex;

/// Version of the entry manifest layout (and part of every key).
pub const SCHEMA: u32 = 1;
pub const MANIFEST: &str = "manifest.json";
/// The backend of an entry an admin imported ([`crate::import`]): its
/// files are checked to carry GPU code, of any arch.
pub const IMPORT_BACKEND: &str = "import";

/// What an entry is: written as its `manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryManifest {
    pub schema: u32,
    pub key: String,
    pub package: String,
    pub version: String,
    pub variant: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// The target the build is for and was verified to be: `sm_86`.
    pub arch: String,
    pub backend: String,
    /// The compiler: `nvrtc 12.9`, or the command's program.
    pub toolkit: String,
    /// Oldest driver CUDA version that loads it (the toolkit's for PTX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_driver_cuda: Option<String>,
    pub built_at: u64,
    pub files: BTreeMap<String, FileInfo>,
    #[serde(default)]
    pub exports: Vec<String>,
    /// Where it was pulled from (`repository@sha256:...`); absent when it
    /// was built here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub sha256: String,
    pub bytes: u64,
    /// The code it carries, as read from it: `["sm_86"]`, `["compute_86"]`.
    #[serde(default)]
    pub targets: Vec<String>,
}

/// One entry as found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub dir: PathBuf,
    pub manifest: EntryManifest,
    /// Bytes of its files and manifest.
    pub bytes: u64,
}

/// Why a stored entry cannot be served: it is quarantined with this reason.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    #[error("{file}: {error}")]
    Read { file: String, error: io::Error },
    #[error("{MANIFEST}: {0}")]
    Manifest(serde_json::Error),
    #[error("manifest names key {0} for another directory")]
    OtherKey(String),
    #[error("{file}: sha256 {got} differs from the manifest's {want}")]
    Digest {
        file: String,
        got: String,
        want: String,
    },
}

/// What a finished build request produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Built now.
    Built(Entry),
    /// Already in the store (perhaps built by another process meanwhile).
    Cached(Entry),
}

impl Outcome {
    pub fn entry(&self) -> &Entry {
        match self {
            Outcome::Built(e) | Outcome::Cached(e) => e,
        }
    }
}

/// What a build's closure reports besides its files.
#[derive(Clone, Debug, Default)]
pub struct BuildInfo {
    pub toolkit: String,
    pub min_driver_cuda: Option<String>,
    /// Set when the files were pulled from a registry, not built.
    pub origin: Option<String>,
}

/// The fixed part of an entry's manifest, known before building.
#[derive(Clone, Debug)]
pub struct Meta {
    pub package: String,
    pub version: String,
    pub variant: String,
    pub dtype: Option<String>,
    pub arch: Target,
    pub backend: String,
    pub exports: Vec<String>,
}

/// Result of a garbage collection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub freed_bytes: u64,
    pub evicted: Vec<String>,
    /// Bytes in use after it.
    pub used_bytes: u64,
}

#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    max_bytes: u64,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn valid_key(k: &str) -> bool {
    k.len() == 64
        && k.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn fsync_dir(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

impl Store {
    /// Open (creating) the store at `root` and clear builds left by dead
    /// builders.
    pub fn open(root: &Path, max_bytes: u64) -> io::Result<Self> {
        for d in [
            "objects",
            "tmp",
            "locks",
            "failures",
            "pins",
            "used",
            "quarantine",
            "remote-refused",
        ] {
            fs::create_dir_all(root.join(d))?;
        }
        let s = Self {
            root: root.to_owned(),
            max_bytes,
        };
        s.clear_dead_tmp(None)?;
        Ok(s)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    pub fn entry_dir(&self, key: &str) -> PathBuf {
        self.root.join("objects").join(&key[..2]).join(key)
    }

    fn lock(&self, key: &str, wait: bool) -> io::Result<Option<Flock<File>>> {
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join("locks").join(format!("{key}.lock")))?;
        let arg = if wait {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockExclusiveNonblock
        };
        match Flock::lock(f, arg) {
            Ok(l) => Ok(Some(l)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if !wait => Ok(None),
            Err((_, e)) => Err(io::Error::from(e)),
        }
    }

    /// Remove `tmp/` directories whose builder is gone: for `key` only
    /// (the caller holds its lock), or for every key whose lock is free.
    fn clear_dead_tmp(&self, key: Option<&str>) -> io::Result<()> {
        for e in fs::read_dir(self.root.join("tmp"))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let k = name.split('.').next().unwrap_or_default();
            let dead = match key {
                Some(key) => k == key,
                None if valid_key(k) => self.lock(k, false)?.is_some(),
                None => true,
            };
            if dead {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        Ok(())
    }

    fn read_manifest(dir: &Path) -> Result<EntryManifest, EntryError> {
        let text = fs::read(dir.join(MANIFEST)).map_err(|e| EntryError::Read {
            file: MANIFEST.to_owned(),
            error: e,
        })?;
        serde_json::from_slice(&text).map_err(EntryError::Manifest)
    }

    fn entry_at(dir: &Path) -> Result<Entry, EntryError> {
        let manifest = Self::read_manifest(dir)?;
        let mbytes = fs::metadata(dir.join(MANIFEST))
            .map(|m| m.len())
            .unwrap_or(0);
        let bytes = manifest.files.values().map(|f| f.bytes).sum::<u64>() + mbytes;
        Ok(Entry {
            dir: dir.to_owned(),
            manifest,
            bytes,
        })
    }

    /// Check every file of the entry against its manifest.
    pub fn verify_entry(entry: &Entry) -> Result<(), EntryError> {
        let m = &entry.manifest;
        if entry.dir.file_name().and_then(|n| n.to_str()) != Some(m.key.as_str()) {
            return Err(EntryError::OtherKey(m.key.clone()));
        }
        for (name, info) in &m.files {
            let (got, _) = File::open(entry.dir.join(name))
                .and_then(crate::file::sha256_of)
                .map_err(|e| EntryError::Read {
                    file: name.clone(),
                    error: e,
                })?;
            if got != info.sha256 {
                return Err(EntryError::Digest {
                    file: name.clone(),
                    got,
                    want: info.sha256.clone(),
                });
            }
        }
        Ok(())
    }

    /// The entry of `key`, verified: every file's sha256 is checked. A
    /// corrupt entry is moved to `quarantine/` and reported as absent.
    pub fn lookup(&self, key: &str) -> io::Result<Option<Entry>> {
        let dir = self.entry_dir(key);
        if !dir.exists() {
            return Ok(None);
        }
        match Self::entry_at(&dir).and_then(|e| Self::verify_entry(&e).map(|()| e)) {
            Ok(e) => Ok(Some(e)),
            Err(why) => {
                self.quarantine(key, &why.to_string())?;
                Ok(None)
            }
        }
    }

    /// Move a bad entry out of the way; its reason goes into `reason.txt`.
    pub fn quarantine(&self, key: &str, why: &str) -> io::Result<()> {
        let dir = self.entry_dir(key);
        let to = self.root.join("quarantine").join(format!(
            "{key}.{}.{}",
            now_s(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::rename(&dir, &to) {
            Ok(()) => {
                let _ = fs::write(to.join("reason.txt"), format!("{why}\n"));
                tracing::warn!(key, reason = why, "kernel cache entry quarantined");
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every entry on disk, from the manifests only (no hashing): the
    /// index a daemon loads at start. Unreadable entries are quarantined.
    pub fn scan(&self) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        for shard in fs::read_dir(self.root.join("objects"))?.flatten() {
            for e in fs::read_dir(shard.path())?.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !valid_key(&name) {
                    continue;
                }
                match Self::entry_at(&e.path()) {
                    Ok(entry) => out.push(entry),
                    Err(why) => self.quarantine(&name, &why.to_string())?,
                }
            }
        }
        out.sort_by(|a, b| a.manifest.key.cmp(&b.manifest.key));
        Ok(out)
    }

    /// The recorded refusal of `key`, if any.
    pub fn failure(&self, key: &str) -> Option<String> {
        let text =
            fs::read_to_string(self.root.join("failures").join(format!("{key}.json"))).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("message").and_then(|m| m.as_str()).map(str::to_owned)
    }

    fn record_failure(&self, key: &str, meta: &Meta, message: &str) -> io::Result<()> {
        let body = serde_json::json!({
            "key": key, "package": meta.package, "variant": meta.variant,
            "arch": meta.arch.to_string(), "message": message, "at": now_s(),
        });
        write_atomic(
            &self.root.join("failures").join(format!("{key}.json")),
            body.to_string().as_bytes(),
        )
    }

    /// Where a refusal of the registry's artifact for `key` is recorded.
    fn refusal_path(&self, key: &str) -> PathBuf {
        self.root.join("remote-refused").join(format!("{key}.json"))
    }

    /// The recorded refusal of the registry's artifact for `key`, if any:
    /// it is not pulled again until the record is cleared.
    pub fn remote_refusal(&self, key: &str) -> Option<String> {
        let text = fs::read_to_string(self.refusal_path(key)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("reason").and_then(|m| m.as_str()).map(str::to_owned)
    }

    /// Record that the registry's artifact for `key` was refused, and why.
    pub fn record_remote_refusal(&self, key: &str, reason: &str) -> io::Result<()> {
        let body = serde_json::json!({"key": key, "reason": reason, "at": now_s()});
        write_atomic(&self.refusal_path(key), body.to_string().as_bytes())
    }

    /// Every recorded refusal of a registry artifact: (key, reason).
    pub fn remote_refusals(&self) -> Vec<(String, String)> {
        let mut out: Vec<_> = fs::read_dir(self.root.join("remote-refused"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let key = name.strip_suffix(".json")?.to_owned();
                let reason = self.remote_refusal(&key)?;
                Some((key, reason))
            })
            .collect();
        out.sort();
        out
    }

    /// Forget a recorded refusal, so the next request tries again.
    pub fn clear_failure(&self, key: &str) -> io::Result<()> {
        match fs::remove_file(self.root.join("failures").join(format!("{key}.json"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Build `key` unless it is stored already. One build per key at a
    /// time across processes: a second caller waits on the lock and then
    /// finds the first one's entry. `build` fills the directory it is given
    /// with the output files; each is checked with the inspector before the
    /// entry is stored.
    pub fn build(
        &self,
        key: &str,
        meta: &Meta,
        build: impl FnOnce(&Path) -> Result<BuildInfo, BuildError>,
    ) -> Result<Outcome, BuildError> {
        if !valid_key(key) {
            return Err(BuildError::Tool(format!("invalid key {key:?}")));
        }
        if let Some(e) = self.lookup(key)? {
            return Ok(Outcome::Cached(e));
        }
        if let Some(m) = self.failure(key) {
            return Err(BuildError::Rejected(m));
        }
        let _lock = self.lock(key, true)?;
        if let Some(e) = self.lookup(key)? {
            return Ok(Outcome::Cached(e));
        }
        if let Some(m) = self.failure(key) {
            return Err(BuildError::Rejected(m));
        }
        self.clear_dead_tmp(Some(key))?;
        let tmp = self.root.join("tmp").join(format!(
            "{key}.{}.{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let out = tmp.join("out");
        let work = tmp.join("work");
        fs::create_dir_all(&out).map_err(at(&out))?;
        fs::create_dir_all(&work).map_err(at(&work))?;
        let result = self.build_in(key, meta, &tmp, build);
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        if let Err(BuildError::Rejected(m)) = &result {
            self.record_failure(key, meta, m)?;
        }
        result
    }

    fn build_in(
        &self,
        key: &str,
        meta: &Meta,
        tmp: &Path,
        build: impl FnOnce(&Path) -> Result<BuildInfo, BuildError>,
    ) -> Result<Outcome, BuildError> {
        let out = tmp.join("out");
        let info = build(&out)?;
        let files = check_outputs(&out, meta)?;
        let manifest = EntryManifest {
            schema: SCHEMA,
            key: key.to_owned(),
            package: meta.package.clone(),
            version: meta.version.clone(),
            variant: meta.variant.clone(),
            dtype: meta.dtype.clone(),
            arch: meta.arch.to_string(),
            backend: meta.backend.clone(),
            toolkit: info.toolkit,
            min_driver_cuda: info.min_driver_cuda,
            built_at: now_s(),
            files,
            exports: meta.exports.clone(),
            origin: info.origin,
        };
        let body =
            serde_json::to_vec_pretty(&manifest).map_err(|e| BuildError::Tool(e.to_string()))?;
        let mpath = out.join(MANIFEST);
        let mut f = File::create(&mpath).map_err(at(&mpath))?;
        f.write_all(&body).map_err(at(&mpath))?;
        f.sync_all().map_err(at(&mpath))?;
        for name in manifest.files.keys() {
            let p = out.join(name);
            File::open(&p).and_then(|f| f.sync_all()).map_err(at(&p))?;
        }
        fsync_dir(&out).map_err(at(&out))?;
        let dest = self.entry_dir(key);
        let shard = dest.parent().unwrap_or(&self.root);
        fs::create_dir_all(shard).map_err(at(shard))?;
        fs::rename(&out, &dest).map_err(at(&dest))?;
        fsync_dir(shard)?;
        let _ = fs::remove_dir_all(tmp);
        self.touch(key);
        let entry = Self::entry_at(&dest).map_err(|e| BuildError::Tool(e.to_string()))?;
        Ok(Outcome::Built(entry))
    }

    /// Mark `key` as used now (for LRU).
    pub fn touch(&self, key: &str) {
        let p = self.root.join("used").join(key);
        let ok = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .and_then(|f| f.set_modified(SystemTime::now()));
        if let Err(e) = ok {
            tracing::debug!(key, error = %e, "cannot mark a kernel cache entry used");
        }
    }

    /// When the entry was last used (seconds since the epoch): its `used/`
    /// mark, else when it was built.
    pub fn last_used(&self, e: &Entry) -> u64 {
        fs::metadata(self.root.join("used").join(&e.manifest.key))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(e.manifest.built_at, |d| d.as_secs())
    }

    pub fn pin(&self, key: &str) -> io::Result<()> {
        File::create(self.root.join("pins").join(key)).map(drop)
    }

    pub fn unpin(&self, key: &str) -> io::Result<()> {
        match fs::remove_file(self.root.join("pins").join(key)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    pub fn pinned(&self, key: &str) -> bool {
        self.root.join("pins").join(key).exists()
    }

    /// Bytes held by entries.
    pub fn used_bytes(&self) -> io::Result<u64> {
        Ok(self.scan()?.iter().map(|e| e.bytes).sum())
    }

    /// Evict least recently used entries until the store is within its
    /// limit. Pinned entries and those in `in_use` are never evicted.
    pub fn gc(&self, in_use: &HashSet<String>) -> io::Result<GcReport> {
        let entries = self.scan()?;
        let mut used: u64 = entries.iter().map(|e| e.bytes).sum();
        let mut report = GcReport::default();
        let mut candidates: Vec<(u64, &Entry)> = entries
            .iter()
            .filter(|e| !in_use.contains(&e.manifest.key) && !self.pinned(&e.manifest.key))
            .map(|e| (self.last_used(e), e))
            .collect();
        candidates.sort_by_key(|(t, e)| (*t, e.manifest.key.clone()));
        for (_, e) in candidates {
            if used <= self.max_bytes {
                break;
            }
            let key = &e.manifest.key;
            // Hold the key's lock, so no builder of it runs meanwhile.
            let Some(_lock) = self.lock(key, false)? else {
                continue;
            };
            let gone = self.root.join("tmp").join(format!(
                "{key}.evict.{}",
                TMP_SEQ.fetch_add(1, Ordering::Relaxed)
            ));
            fs::rename(&e.dir, &gone)?;
            fs::remove_dir_all(&gone)?;
            let _ = fs::remove_file(self.root.join("used").join(key));
            used -= e.bytes;
            report.freed_bytes += e.bytes;
            report.evicted.push(key.clone());
        }
        report.used_bytes = used;
        Ok(report)
    }
}

/// Check the build's output files: plain files with plain names, every
/// piece of GPU code for the requested target, at least one of them.
pub fn check_outputs(out: &Path, meta: &Meta) -> Result<BTreeMap<String, FileInfo>, BuildError> {
    let mut files = BTreeMap::new();
    let mut found = false;
    for e in fs::read_dir(out)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ft = e.file_type()?;
        if !ft.is_file() || !gpuarch_core::config::valid_package_name(&name) || name == MANIFEST {
            return Err(BuildError::Rejected(format!(
                "output {name:?} is not a plain file with a plain name"
            )));
        }
        let mapped = crate::file::Mapped::new(&File::open(e.path())?)?;
        let data = mapped.bytes();
        let targets = match inspect::summarize(data) {
            Ok(objs) => objs,
            Err(inspect::InspectError::Unrecognised) => Vec::new(),
            Err(err) => return Err(BuildError::Rejected(format!("output {name}: {err}"))),
        };
        // An imported file runs where its code says; nothing to match.
        if meta.backend == IMPORT_BACKEND {
            found |= !targets.is_empty();
        }
        for o in targets.iter().filter(|_| meta.backend != IMPORT_BACKEND) {
            let fits = match o.target.kind {
                CodeKind::Sass => o.target == meta.arch,
                CodeKind::Ptx => o.target.cap == meta.arch.cap,
            };
            if !fits {
                return Err(BuildError::Rejected(format!(
                    "output {name} carries {} but the build is for {}",
                    o.target, meta.arch
                )));
            }
            if o.target.kind == CodeKind::Sass {
                found = true;
                for x in &meta.exports {
                    if !o.functions.iter().any(|f| f == x) {
                        return Err(BuildError::Rejected(format!(
                            "output {name} does not define the exported kernel {x}"
                        )));
                    }
                }
            }
        }
        files.insert(
            name,
            FileInfo {
                sha256: sha256_hex(data),
                bytes: data.len() as u64,
                targets: targets.iter().map(|o| o.target.to_string()).collect(),
            },
        );
    }
    if !found {
        return Err(BuildError::Rejected(format!(
            "the build produced no {} machine code",
            meta.arch
        )));
    }
    Ok(files)
}

/// An I/O error that names the path it happened at (ENOSPC alone says not
/// which filesystem is full).
fn at(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
