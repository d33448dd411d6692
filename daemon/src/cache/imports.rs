//! Imports: a site's own kernel files (cubins, fatbins, libraries) stored
//! under a name, all or nothing, and published like a package. One runs at
//! a time; a few more may wait, each holding its caller's open files.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpuarch_kernels::{import, inspect, publish};
use gpuarch_wire::dbus::JobState;
use tracing::{info, warn};

use super::Cache;
use super::jobs::{JobStatus, finish};

impl Cache {
    /// A place among the imports accepted, or `None` when
    /// [`MAX_PENDING_IMPORTS`] wait already (each holds up to 64 of its
    /// caller's descriptors). The place is freed when the value drops.
    pub fn import_place(&self) -> Option<ImportPlace> {
        let n = self.imports_pending.fetch_add(1, Ordering::SeqCst);
        let place = ImportPlace(self.imports_pending.clone());
        (n < MAX_PENDING_IMPORTS).then_some(place)
    }

    /// This job's turn among the imports (of either kind: one at a time),
    /// its message saying so while it waits. None when the cache closes.
    pub(super) async fn import_turn(
        &self,
        state: &Mutex<JobStatus>,
    ) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let permit = match self.imports.try_acquire() {
            Ok(p) => Ok(p),
            Err(_) => {
                if let Ok(mut s) = state.lock() {
                    s.message = "waiting for another import to finish".to_owned();
                }
                self.imports.acquire().await
            }
        };
        let permit = permit.ok()?;
        if let Ok(mut s) = state.lock() {
            s.message.clear();
        }
        Some(permit)
    }

    /// Import `files` (name, open file) as `name`: each stored, then the
    /// import recorded and published, or, if any file fails, nothing
    /// changed. A file that runs on none of the host's GPUs is stored with
    /// a warning.
    pub async fn run_import(
        self: &Arc<Self>,
        name: String,
        files: Vec<(String, std::fs::File)>,
        ldconfig: bool,
        state: Arc<Mutex<JobStatus>>,
        _place: ImportPlace,
    ) {
        let Some(_permit) = self.import_turn(&state).await else {
            return;
        };
        let me = self.clone();
        let st = state.clone();
        let n = name.clone();
        let result = tokio::task::spawn_blocking(move || me.import_files(&n, files, ldconfig, &st))
            .await
            .unwrap_or_else(|e| Err(ImportError::Task(e.to_string())));
        match result {
            Ok(()) => {
                self.republish(vec![name]).await;
                finish(&state, &[], "imported");
            }
            // All or nothing: not "1 of 3 not imported".
            Err(why) => {
                if let Ok(mut s) = state.lock() {
                    s.state = JobState::Failed;
                    s.message = format!("{name} not imported, nothing changed: {why}");
                }
            }
        }
    }

    fn import_files(
        &self,
        name: &str,
        files: Vec<(String, std::fs::File)>,
        ldconfig: bool,
        state: &Mutex<JobStatus>,
    ) -> Result<(), ImportError> {
        if self.packages().contains_key(name) {
            return Err(ImportError::PackageName(name.to_owned()));
        }
        let store = &self.builder.store;
        let snap = self.shared.snapshot();
        let driver = snap
            .as_ref()
            .and_then(|s| gpuarch_core::arch::CudaVersion::parse(&s.cuda_driver_version).ok());
        let mut keys = Vec::new();
        // What the whole import may take: kernels.max_bytes, all files
        // together, and never the store's last free bytes.
        let mut left = store.max_bytes();
        for (file, f) in files {
            let io = |error| ImportError::Io {
                file: file.clone(),
                error,
            };
            let meta = f.metadata().map_err(io)?;
            if !meta.is_file() {
                return Err(ImportError::NotAFile(file));
            }
            let too_large = || ImportError::TooLarge {
                file: file.clone(),
                max: store.max_bytes(),
            };
            if meta.len() > left {
                return Err(too_large());
            }
            room(store.root(), &file, meta.len())?;
            // A file that grows as it is read stops at the bound too.
            let staged = import::stage(store, &f, left).map_err(|e| match e.kind() {
                std::io::ErrorKind::FileTooLarge => too_large(),
                _ => io(e),
            })?;
            left -= staged.bytes();
            drop(f);
            let (entry, objs) = import::store_file(store, name, &file, staged)?;
            let info = &entry.manifest.files[&file];
            let mut line = format!("{file}: carries {}", info.targets.join(", "));
            let mut runs = 0;
            for d in snap.iter().flat_map(|s| s.devices.iter()) {
                let p = inspect::placement(&objs, d.compute_capability, driver);
                runs += usize::from(!matches!(p, inspect::Placement::No(_)));
                line.push_str(&format!(
                    "; GPU {} ({}): {p}",
                    d.index, d.compute_capability
                ));
            }
            if runs == 0 {
                line.push_str("; warning: it runs on none of this host's GPUs");
                warn!("import {name}: {file} runs on none of this host's GPUs");
            }
            keys.push(entry.manifest.key.clone());
            if let Ok(mut s) = state.lock() {
                s.done += 1;
                s.lines.push(line);
            }
        }
        let record = import::Record {
            name: name.to_owned(),
            ldconfig,
            keys,
            imported_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let old = import::commit(store, &record).map_err(ImportError::Record)?;
        info!(
            "imported {name}: {} file(s){}",
            record.keys.len(),
            if old.is_some() {
                ", replacing the previous import"
            } else {
                ""
            }
        );
        Ok(())
    }

    /// Remove import `name`: new containers no longer get it; those that
    /// mount it keep it, and its files are left to the LRU. Returns how
    /// many files it had, or the imports there are when none is `name`.
    pub fn remove_import(&self, name: &str) -> std::io::Result<Result<usize, Vec<String>>> {
        let store = &self.builder.store;
        let Some(gone) = import::remove(store, name)? else {
            return Ok(Err(import::all(store)
                .0
                .into_iter()
                .map(|r| r.name)
                .collect()));
        };
        // A kernel package of that name is what is published there.
        if !self.packages().contains_key(name)
            && let Err(e) = publish::unpublish(&self.cfg.mount_root, name)
        {
            warn!("cannot unpublish import {name}: {e}");
        }
        info!(
            "import {name} removed: {} file(s) unpinned",
            gone.keys.len()
        );
        Ok(Ok(gone.keys.len()))
    }

    /// Publish the imports named (all when None) from their records: each
    /// file's entry looked up (its sha256 checked) first. A kernel package
    /// of the same name wins.
    pub(super) fn publish_imports(&self, names: Option<&[String]>) {
        let store = &self.builder.store;
        let (records, errors) = import::all(store);
        for e in errors {
            warn!("{e}");
        }
        let pkgs = self.packages();
        for r in records {
            if names.is_some_and(|n| !n.contains(&r.name)) {
                continue;
            }
            if pkgs.contains_key(&r.name) {
                warn!(
                    "import {} not published: a kernel package has that name",
                    r.name
                );
                continue;
            }
            let mut entries = Vec::new();
            for k in &r.keys {
                match store.lookup(k) {
                    Ok(Some(e)) => entries.push(e),
                    Ok(None) => warn!(
                        "import {}: file {k} is gone (quarantined?); import it again",
                        r.name
                    ),
                    Err(e) => warn!("import {}: {k}: {e}", r.name),
                }
            }
            if let Err(e) = publish::publish_import(&self.cfg.mount_root, &r, &entries) {
                warn!(
                    "cannot publish import {} in {}: {e}",
                    r.name,
                    self.cfg.mount_root.display()
                );
            }
        }
    }
}

/// Imports accepted at once: one runs, the others wait their turn.
pub const MAX_PENDING_IMPORTS: usize = 8;

/// A place among the imports accepted ([`Cache::import_place`]).
#[derive(Debug)]
pub struct ImportPlace(Arc<AtomicUsize>);

impl Drop for ImportPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Free bytes an import leaves on the store's filesystem, at least.
pub(super) const IMPORT_RESERVE: u64 = 256 << 20;

/// Whether `len` more bytes fit on the filesystem of `root` and leave
/// [`IMPORT_RESERVE`]: a clear refusal before the copy, not a full disk
/// for every other writer there.
fn room(root: &std::path::Path, file: &str, len: u64) -> Result<(), ImportError> {
    let Some(free) = free_bytes(root) else {
        return Ok(()); // the copy's own errors say it
    };
    if len.saturating_add(IMPORT_RESERVE) > free {
        return Err(ImportError::NoRoom {
            file: file.to_owned(),
            len,
            root: root.to_owned(),
            free,
        });
    }
    Ok(())
}

/// The bytes free to an unprivileged writer on the filesystem of `root`.
pub(super) fn free_bytes(root: &std::path::Path) -> Option<u64> {
    let fs = nix::sys::statvfs::statvfs(root).ok()?;
    Some(fs.blocks_available().saturating_mul(fs.fragment_size()))
}

/// Why an import changed nothing. Each prints its cause: the job's message
/// is this one line.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0} is a kernel package's name; import under another")]
    PackageName(String),
    #[error("{file}: {error}")]
    Io { file: String, error: std::io::Error },
    #[error("{0}: not a regular file")]
    NotAFile(String),
    #[error("{file}: the import is larger than kernels.max_bytes ({max})")]
    TooLarge { file: String, max: u64 },
    #[error("{file}: {len} bytes, and {} has {free} bytes free; an import leaves {IMPORT_RESERVE}", root.display())]
    NoRoom {
        file: String,
        len: u64,
        root: std::path::PathBuf,
        free: u64,
    },
    #[error(transparent)]
    File(#[from] import::ImportError),
    #[error("recording the import: {0}")]
    Record(std::io::Error),
    #[error("the import stopped: {0}")]
    Task(String),
}
