//! The kernel cache in gpuarchd: packages, pre-warm jobs, the hook's build
//! requests, verification and eviction, and the manifests the hook reads.
//!
//! Builds run on blocking threads, at most `kernels.workers` at once. After
//! every job the packages it touched are re-published: each arch's entry is
//! looked up (every file's sha256 checked) before it is named in
//! `<mount_root>/<package>/manifest.json`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use gpuarch_core::arch::Target;
use gpuarch_core::config::KernelsConfig;
use gpuarch_kernels::build::{ArchResult, Builder, Fetch, Task};
use gpuarch_kernels::spec::{self, Package};
use gpuarch_kernels::store::{self, Store};
use gpuarch_kernels::{import, inspect, publish};
use gpuarch_wire::dbus::{JobState, KernelRecord, VerifyRecord};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{Semaphore, mpsc};
use tracing::{info, warn};
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

use crate::state::Shared;

pub use gpuarch_wire::dbus::JOBS_PATH;
/// Finished jobs kept on the bus for late readers.
const KEEP_FINISHED: usize = 32;
const SETTLE: Duration = Duration::from_millis(300);

/// One pre-warm job's progress and outcome, shared with its D-Bus object.
#[derive(Debug, Default)]
pub struct JobStatus {
    pub total: usize,
    pub done: usize,
    pub state: JobState,
    pub message: String,
    /// One line per task: `rmsnorm sm_86: built bf16`.
    pub lines: Vec<String>,
}

#[derive(Debug)]
pub struct Cache {
    pub builder: Arc<Builder>,
    pub cfg: KernelsConfig,
    packages: RwLock<BTreeMap<String, Package>>,
    package_errors: RwLock<Vec<String>>,
    workers: Arc<Semaphore>,
    /// One import at a time: each streams to disk, and two at once would
    /// only share the disk and the inspector's page cache.
    imports: Semaphore,
    /// Imports accepted and not finished: each holds its callers' files.
    imports_pending: Arc<AtomicUsize>,
    /// Archs asked for since start, published alongside the host's.
    archs: Mutex<BTreeSet<Target>>,
    next_job: AtomicU64,
    jobs: Mutex<Jobs>,
    shared: Arc<Shared>,
    /// The last scan of the mounts: when, and the keys in use.
    in_use_seen: Mutex<Option<(std::time::Instant, HashSet<String>)>>,
}

/// How old a scan of the mounts ListKernels may report.
pub const IN_USE_TTL: Duration = Duration::from_secs(5);

/// The job objects on the bus: kept here so that a new bus connection
/// (after a dbus-daemon restart) serves them again.
#[derive(Debug, Default)]
struct Jobs {
    live: BTreeMap<String, Arc<Mutex<JobStatus>>>,
    /// Finished jobs, oldest first; past [`KEEP_FINISHED`] they are dropped.
    finished: Vec<String>,
}

/// `sm_XX` for every GPU of the host.
pub fn host_archs(shared: &Shared) -> BTreeSet<Target> {
    shared
        .snapshot()
        .map(|s| {
            s.devices
                .iter()
                .map(|d| Target::sass(d.compute_capability))
                .collect()
        })
        .unwrap_or_default()
}

impl Cache {
    /// Open the store (clearing dead builds) and read the packages.
    pub fn open(cfg: KernelsConfig, shared: Arc<Shared>) -> std::io::Result<Arc<Self>> {
        let store = Store::open(&cfg.cache_dir, cfg.max_bytes)?;
        let mut builder = Builder::new(
            store,
            cfg.cuda_dirs.clone(),
            Duration::from_secs(cfg.build_timeout_s),
        );
        if let Some(r) = &cfg.remote {
            match gpuarch_registry::OciRemote::new(r) {
                Ok(remote) => {
                    tracing::info!(
                        "kernel builds shared through {} (push {})",
                        r.repository,
                        if r.push { "on" } else { "off" }
                    );
                    builder = builder.with_remote(Box::new(remote));
                }
                Err(e) => tracing::error!("{e}; building everything here"),
            }
        }
        let workers = usize::try_from(cfg.workers).unwrap_or(1).max(1);
        let c = Arc::new(Self {
            builder: Arc::new(builder),
            packages: RwLock::new(BTreeMap::new()),
            package_errors: RwLock::new(Vec::new()),
            workers: Arc::new(Semaphore::new(workers)),
            imports: Semaphore::new(1),
            imports_pending: Arc::new(AtomicUsize::new(0)),
            in_use_seen: Mutex::new(None),
            archs: Mutex::new(BTreeSet::new()),
            next_job: AtomicU64::new(1),
            jobs: Mutex::new(Jobs::default()),
            cfg,
            shared,
        });
        c.reload_packages();
        Ok(c)
    }

    pub fn packages(&self) -> BTreeMap<String, Package> {
        self.packages.read().map(|p| p.clone()).unwrap_or_default()
    }

    pub fn package_errors(&self) -> Vec<String> {
        self.package_errors
            .read()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// Re-read the package directories. Returns the names of packages
    /// added or changed; removed ones are unpublished.
    pub fn reload_packages(&self) -> Vec<String> {
        let (found, errors) = spec::discover(&self.cfg.package_dirs);
        for e in &errors {
            warn!("kernel package skipped: {e}");
        }
        let mut changed = Vec::new();
        let Ok(mut pkgs) = self.packages.write() else {
            return changed;
        };
        for name in pkgs.keys() {
            if !found.contains_key(name) {
                info!("kernel package {name} removed");
                if let Err(e) = publish::unpublish(&self.cfg.mount_root, name) {
                    warn!("cannot unpublish kernel package {name}: {e}");
                }
            }
        }
        for (name, p) in &found {
            if pkgs.get(name) != Some(p) {
                info!(
                    "kernel package {name} {} from {}",
                    p.spec.version,
                    p.dir.display()
                );
                changed.push(name.clone());
            }
        }
        *pkgs = found;
        if let Ok(mut e) = self.package_errors.write() {
            *e = errors.iter().map(ToString::to_string).collect();
        }
        changed
    }

    /// Archs to publish for: the host's, those asked for, those stored.
    fn publish_archs(&self, name: &str, stored: &[store::Entry]) -> BTreeSet<Target> {
        let mut a = host_archs(&self.shared);
        if let Ok(x) = self.archs.lock() {
            a.extend(x.iter().copied());
        }
        a.extend(
            stored
                .iter()
                .filter(|e| e.manifest.package == name)
                .filter_map(|e| Target::parse(&e.manifest.arch).ok()),
        );
        a
    }

    /// Re-publish `names` (all packages and imports when None) from the
    /// store: blocking.
    pub fn publish(&self, names: Option<&[String]>) {
        self.publish_imports(names);
        let pkgs = self.packages();
        let stored = match self.builder.store.scan() {
            Ok(s) => s,
            Err(e) => {
                // Publishing from nothing would take every build away from
                // new containers: the manifests stay as they are.
                warn!("cannot read the kernel cache to publish it: {e}");
                return;
            }
        };
        for (name, p) in &pkgs {
            if names.is_some_and(|n| !n.contains(name)) {
                continue;
            }
            let results: Vec<ArchResult> = self
                .publish_archs(name, &stored)
                .into_iter()
                .map(|a| self.builder.resolve(p, a, Fetch::Stored))
                .collect();
            if let Err(e) = publish::publish(&self.cfg.mount_root, p, &results) {
                warn!(
                    "cannot publish kernel package {name} in {}: {e}",
                    self.cfg.mount_root.display()
                );
            }
        }
    }

    /// Publish the imports named (all when None) from their records: each
    /// file's entry looked up (its sha256 checked) first. A kernel package
    /// of the same name wins.
    fn publish_imports(&self, names: Option<&[String]>) {
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

    /// The packages, once every one of `packages` is among them.
    fn known(&self, packages: &[String]) -> Result<BTreeMap<String, Package>, RequestError> {
        let known = self.packages();
        match packages.iter().find(|p| !known.contains_key(*p)) {
            Some(p) => Err(RequestError::NoPackage {
                name: p.clone(),
                known: known.keys().cloned().collect::<Vec<_>>().join(", "),
            }),
            None => Ok(known),
        }
    }

    /// Check `packages` and `archs` of a request; empty means all packages,
    /// and the host's archs.
    pub fn tasks(&self, packages: &[String], archs: &[String]) -> Result<Vec<Task>, RequestError> {
        let known = self.known(packages)?;
        let targets: BTreeSet<Target> = if archs.is_empty() {
            host_archs(&self.shared)
        } else {
            archs
                .iter()
                .map(|a| parse_arch(a))
                .collect::<Result<_, _>>()?
        };
        if targets.is_empty() {
            return Err(RequestError::NoArchs);
        }
        let names: Vec<String> = if packages.is_empty() {
            known.keys().cloned().collect()
        } else {
            packages.to_vec()
        };
        Ok(names
            .iter()
            .flat_map(|p| {
                targets.iter().map(move |a| Task {
                    package: p.clone(),
                    arch: *a,
                })
            })
            .collect())
    }

    /// Run `tasks` (at most `workers` at once), getting what is not stored
    /// by `fetch`, updating `state`, then publish. Pins what it serves when
    /// `pin`.
    pub async fn run_job(
        self: &Arc<Self>,
        tasks: Vec<Task>,
        fetch: Fetch,
        pin: bool,
        state: Arc<Mutex<JobStatus>>,
    ) {
        if let Ok(mut a) = self.archs.lock() {
            a.extend(tasks.iter().map(|t| t.arch));
        }
        if let Ok(mut s) = state.lock() {
            s.total = tasks.len();
            s.state = JobState::Running;
        }
        let pkgs = Arc::new(self.packages());
        let mut handles = Vec::new();
        for t in tasks {
            let permit = self.workers.clone().acquire_owned().await;
            let (b, pkgs, state) = (self.builder.clone(), pkgs.clone(), state.clone());
            handles.push(tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let r = match pkgs.get(&t.package) {
                    Some(p) => b.resolve(p, t.arch, fetch),
                    None => ArchResult::failed(&t, "the package was removed"),
                };
                if pin
                    && let Some((e, _)) = &r.served
                    && let Err(err) = b.store.pin(&e.manifest.key)
                {
                    warn!("cannot pin {}: {err}", e.manifest.key);
                }
                let line = describe(&r);
                if let Ok(mut s) = state.lock() {
                    s.done += 1;
                    s.lines.push(line);
                }
                r
            }));
        }
        let mut failed = Vec::new();
        let mut touched = BTreeSet::new();
        for h in handles {
            if let Ok(r) = h.await {
                touched.insert(r.package.clone());
                if r.served.is_none() {
                    failed.push((
                        format!("{} {}", r.package, r.arch),
                        r.error
                            .clone()
                            .unwrap_or_else(|| "no variant builds for it".into()),
                    ));
                }
            }
        }
        self.republish(touched.into_iter().collect()).await;
        finish(&state, &failed, "served");
    }

    /// Publish `names` again and sweep the views no one mounts.
    async fn republish(self: &Arc<Self>, names: Vec<String>) {
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            me.publish(Some(&names));
            me.sweep_views(&me.mounted().views);
        })
        .await;
    }

    /// The stored builds of `packages` (empty: every package) for `archs`
    /// (empty: every arch stored), for a push. Imports are not pushed:
    /// another node cannot ask for them by key.
    pub fn stored(
        &self,
        packages: &[String],
        archs: &[String],
    ) -> Result<Vec<store::Entry>, RequestError> {
        let known = self.known(packages)?;
        let targets: BTreeSet<Target> = archs
            .iter()
            .map(|a| parse_arch(a))
            .collect::<Result<_, _>>()?;
        let entries = self
            .builder
            .store
            .scan()
            .map_err(|e| RequestError::Store(e.to_string()))?;
        Ok(entries
            .into_iter()
            .filter(|e| e.manifest.backend != import::BACKEND)
            .filter(|e| {
                packages.is_empty() && known.contains_key(&e.manifest.package)
                    || packages.contains(&e.manifest.package)
            })
            .filter(|e| {
                targets.is_empty()
                    || Target::parse(&e.manifest.arch).is_ok_and(|t| targets.contains(&t))
            })
            .collect())
    }

    /// Push `entries` to the registry, one at a time, updating `state`.
    pub async fn run_push(
        self: &Arc<Self>,
        entries: Vec<store::Entry>,
        state: Arc<Mutex<JobStatus>>,
    ) {
        let mut failed = Vec::new();
        for e in entries {
            let b = self.builder.clone();
            let m = &e.manifest;
            let head = format!("{} {} {}", m.package, m.arch, m.variant);
            let permit = self.workers.clone().acquire_owned().await;
            let pushed = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                match b.remote() {
                    Some(r) => r.push(&e).map_err(|e| e.to_string()),
                    None => Err("no registry (kernels.remote)".to_owned()),
                }
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            let line = match pushed {
                Ok(at) => format!("{head}: pushed to {at}"),
                Err(why) => {
                    failed.push((head.clone(), why.clone()));
                    format!("{head}: failed: {why}")
                }
            };
            if let Ok(mut s) = state.lock() {
                s.done += 1;
                s.lines.push(line);
            }
        }
        finish(&state, &failed, "pushed");
    }

    /// A place among the imports accepted, or `None` when
    /// [`MAX_PENDING_IMPORTS`] wait already (each holds up to 64 of its
    /// caller's descriptors). The place is freed when the value drops.
    pub fn import_place(&self) -> Option<ImportPlace> {
        let n = self.imports_pending.fetch_add(1, Ordering::SeqCst);
        let place = ImportPlace(self.imports_pending.clone());
        (n < MAX_PENDING_IMPORTS).then_some(place)
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
        let permit = match self.imports.try_acquire() {
            Ok(p) => Ok(p),
            Err(_) => {
                if let Ok(mut s) = state.lock() {
                    s.message = "waiting for another import to finish".to_owned();
                }
                self.imports.acquire().await
            }
        };
        let Ok(_permit) = permit else {
            return;
        };
        if let Ok(mut s) = state.lock() {
            s.message.clear();
        }
        let me = self.clone();
        let st = state.clone();
        let n = name.clone();
        let result = tokio::task::spawn_blocking(move || me.import_files(&n, files, ldconfig, &st))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
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
    ) -> Result<(), String> {
        if self.packages().contains_key(name) {
            return Err(format!(
                "{name} is a kernel package's name; import under another"
            ));
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
            let meta = f.metadata().map_err(|e| format!("{file}: {e}"))?;
            if !meta.is_file() {
                return Err(format!("{file}: not a regular file"));
            }
            let too_large = || {
                format!(
                    "{file}: the import is larger than kernels.max_bytes ({})",
                    store.max_bytes()
                )
            };
            if meta.len() > left {
                return Err(too_large());
            }
            room(store.root(), &file, meta.len())?;
            // A file that grows as it is read stops at the bound too.
            let staged = import::stage(store, &f, left).map_err(|e| match e.kind() {
                std::io::ErrorKind::FileTooLarge => too_large(),
                _ => format!("{file}: {e}"),
            })?;
            left -= staged.bytes();
            drop(f);
            let (entry, objs) =
                import::store_file(store, name, &file, staged).map_err(|e| e.to_string())?;
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
        let old =
            import::commit(store, &record).map_err(|e| format!("recording the import: {e}"))?;
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

    /// A new job number and its object path.
    pub fn new_job_path(&self) -> String {
        format!(
            "{JOBS_PATH}/{}",
            self.next_job.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn add_job(&self, path: &str, state: Arc<Mutex<JobStatus>>) {
        if let Ok(mut j) = self.jobs.lock() {
            j.live.insert(path.to_owned(), state);
        }
    }

    /// Remember a finished job; returns the paths of jobs to drop.
    fn retire_job(&self, path: String) -> Vec<String> {
        let Ok(mut j) = self.jobs.lock() else {
            return Vec::new();
        };
        j.finished.push(path);
        let excess = j.finished.len().saturating_sub(KEEP_FINISHED);
        let old: Vec<String> = j.finished.drain(..excess).collect();
        for p in &old {
            j.live.remove(p);
        }
        old
    }

    /// Serve every job still kept on `conn` (a new bus connection).
    pub async fn serve_jobs(&self, conn: &Connection) -> zbus::Result<()> {
        let jobs: Vec<_> = match self.jobs.lock() {
            Ok(j) => j.live.iter().map(|(p, s)| (p.clone(), s.clone())).collect(),
            Err(_) => return Ok(()),
        };
        for (path, state) in jobs {
            conn.object_server()
                .at(path.as_str(), Job { state })
                .await?;
        }
        Ok(())
    }

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

    /// Evict above the limit (never pinned or mounted entries), sweep the
    /// views no container mounts; republish.
    pub fn gc(&self) -> std::io::Result<store::GcReport> {
        let mounted = self.mounted();
        if let Ok(mut c) = self.in_use_seen.lock() {
            *c = Some((std::time::Instant::now(), mounted.keys.clone()));
        }
        let r = self.builder.store.gc(&mounted.keys)?;
        let swept = self.sweep_views(&mounted.views);
        if swept > 0 {
            info!("kernel cache: removed {swept} views no container mounts");
        }
        if !r.evicted.is_empty() {
            info!(
                "kernel cache: evicted {} entries, {} bytes",
                r.evicted.len(),
                r.freed_bytes
            );
            self.publish(None);
        }
        Ok(r)
    }

    /// Check every entry's files; corrupt ones are quarantined. Returns one
    /// record per entry and the tasks that rebuild what was quarantined.
    /// A store that cannot be read is an error, never "0 builds checked".
    pub fn verify(&self) -> std::io::Result<(Vec<VerifyRecord>, Vec<Task>)> {
        let mut out = Vec::new();
        let mut rebuild = Vec::new();
        for e in self.builder.store.scan()? {
            let m = &e.manifest;
            let res = Store::verify_entry(&e);
            if let Err(why) = &res {
                if let Err(err) = self.builder.store.quarantine(&m.key, &why.to_string()) {
                    warn!("cannot quarantine {}: {err}", m.key);
                }
                if m.backend == import::BACKEND {
                    warn!(
                        "import {}: {} is corrupt; import it again",
                        m.package, m.variant
                    );
                } else if let Ok(arch) = Target::parse(&m.arch) {
                    rebuild.push(Task {
                        package: m.package.clone(),
                        arch,
                    });
                }
            }
            out.push(VerifyRecord {
                key: m.key.clone(),
                package: m.package.clone(),
                arch: m.arch.clone(),
                variant: m.variant.clone(),
                ok: res.is_ok(),
                problem: res.err().map(|e| e.to_string()).unwrap_or_default(),
            });
        }
        Ok((out, rebuild))
    }

    /// One record per stored entry, and one per variant refused for an arch.
    /// A store that cannot be read is an error, never an empty list.
    pub fn list(&self) -> std::io::Result<Vec<KernelRecord>> {
        let store = &self.builder.store;
        let in_use = self.in_use_recent();
        let mut out = Vec::new();
        for e in store.scan()? {
            let m = &e.manifest;
            let used = store.last_used(&e);
            out.push(KernelRecord {
                key: m.key.clone(),
                package: m.package.clone(),
                version: m.version.clone(),
                variant: m.variant.clone(),
                dtype: m.dtype.clone().unwrap_or_default(),
                arch: m.arch.clone(),
                toolkit: m.toolkit.clone(),
                bytes: e.bytes,
                files: m.files.keys().cloned().collect(),
                pinned: store.pinned(&m.key),
                in_use: in_use.contains(&m.key),
                last_used: used,
                built_at: m.built_at,
                path: e.dir.display().to_string(),
            });
        }
        Ok(out)
    }

    pub fn used_bytes(&self) -> std::io::Result<u64> {
        self.builder.store.used_bytes()
    }

    /// Requests the hook left in the spool: `<package>@<arch>` files. Each is
    /// removed as it is taken; unknown packages and bad names are dropped.
    pub fn take_requests(&self) -> Vec<Task> {
        let Ok(entries) = std::fs::read_dir(&self.cfg.spool_dir) else {
            return Vec::new();
        };
        let pkgs = self.packages();
        let mut tasks = Vec::new();
        for e in entries.flatten().take(1024) {
            let name = e.file_name().to_string_lossy().into_owned();
            let _ = std::fs::remove_file(e.path());
            let Some((p, a)) = name.split_once('@') else {
                continue;
            };
            match (pkgs.contains_key(p), parse_arch(a)) {
                (true, Ok(arch)) => tasks.push(Task {
                    package: p.to_owned(),
                    arch,
                }),
                _ => warn!("dropping kernel build request {name:?}: unknown package or arch"),
            }
        }
        tasks
    }
}

/// A pre-warm request that names what this cache cannot build.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("no kernel package named {name:?} (known: {known})")]
    NoPackage { name: String, known: String },
    #[error("no architectures given and no GPU inventory to take the host's from")]
    NoArchs,
    #[error("{0} is PTX; give a machine-code arch such as sm_86")]
    Ptx(Target),
    #[error("{0}")]
    Arch(#[from] gpuarch_core::arch::ArchError),
    #[error("reading the kernel cache: {0}")]
    Store(String),
}

/// `sm_86`, `8.6` or `86`: a SASS target.
pub fn parse_arch(a: &str) -> Result<Target, RequestError> {
    let t = a.trim();
    let t = if t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty() {
        format!("sm_{t}")
    } else {
        t.to_owned()
    };
    match Target::parse(&t) {
        Ok(t) if t.kind == gpuarch_core::arch::CodeKind::Sass => Ok(t),
        Ok(t) => Err(RequestError::Ptx(t)),
        Err(e) => Err(e.into()),
    }
}

fn describe(r: &ArchResult) -> String {
    let head = format!("{} {}", r.package, r.arch);
    match (&r.served, &r.error) {
        (Some((e, true)), _) => match &e.manifest.origin {
            Some(from) => format!("{head}: pulled {} from {from}", e.manifest.variant),
            None => format!("{head}: built {}", e.manifest.variant),
        },
        (Some((e, false)), _) => format!("{head}: cached {}", e.manifest.variant),
        (None, Some(err)) => format!("{head}: failed: {err}"),
        (None, None) => format!(
            "{head}: no variant builds ({})",
            r.unavailable
                .iter()
                .map(|u| format!("{}: {}", u.variant, first_line(&u.reason)))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s)
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
        if !valid_view(&name) || fresh || mounted.contains(&name) {
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

/// A view's name: 64 hex digits (the hook's sha256).
fn valid_view(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
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
            && valid_view(name)
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

/// Watch the package directories and the spool; `tx` gets a unit per
/// settled burst of changes. The watcher stops when dropped.
pub fn watch(
    cfg: &KernelsConfig,
    tx: mpsc::UnboundedSender<()>,
) -> Option<notify::RecommendedWatcher> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<()>();
    let mut w = match notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok() {
            let _ = raw_tx.send(());
        }
    }) {
        Ok(w) => w,
        Err(e) => {
            warn!("cannot watch kernel packages ({e}); changes apply on restart");
            return None;
        }
    };
    let mut dirs: Vec<PathBuf> = cfg.package_dirs.clone();
    if let Err(e) = std::fs::create_dir_all(&cfg.spool_dir) {
        warn!("cannot create {}: {e}", cfg.spool_dir.display());
    }
    dirs.push(cfg.spool_dir.clone());
    for d in dirs.iter().filter(|d| d.is_dir()) {
        match w.watch(d, RecursiveMode::Recursive) {
            Ok(()) => info!("watching {} for kernel packages and requests", d.display()),
            Err(e) => warn!("cannot watch {}: {e}", d.display()),
        }
    }
    tokio::spawn(async move {
        while raw_rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while raw_rx.try_recv().is_ok() {}
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    Some(w)
}

/// End a job: done when nothing `failed`, else failed with each reason.
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
const IMPORT_RESERVE: u64 = 256 << 20;

/// Whether `len` more bytes fit on the filesystem of `root` and leave
/// [`IMPORT_RESERVE`]: a clear refusal before the copy, not a full disk
/// for every other writer there.
fn room(root: &std::path::Path, file: &str, len: u64) -> Result<(), String> {
    let Ok(fs) = nix::sys::statvfs::statvfs(root) else {
        return Ok(()); // the copy's own errors say it
    };
    let free = fs.blocks_available().saturating_mul(fs.fragment_size());
    if len.saturating_add(IMPORT_RESERVE) > free {
        return Err(format!(
            "{file}: {len} bytes, and {} has {free} bytes free; an import leaves {IMPORT_RESERVE}",
            root.display()
        ));
    }
    Ok(())
}

/// The job's end: done, or failed with one line per distinct reason
/// (`(what, why)` pairs), so that one missing NVRTC across every package
/// and arch is one reason and a count, not a line for each.
fn finish(state: &Mutex<JobStatus>, failed: &[(String, String)], verb: &str) {
    if let Ok(mut s) = state.lock() {
        if failed.is_empty() {
            s.state = JobState::Done;
            s.message = format!("{} of {} {verb}", s.total, s.total);
        } else {
            s.state = JobState::Failed;
            s.message = format!(
                "{} of {} not {verb}: {}",
                failed.len(),
                s.total,
                by_reason(failed)
            );
        }
    }
}

/// `why (for a, b, c and N more)` per distinct reason, in first-seen order.
fn by_reason(failed: &[(String, String)]) -> String {
    const NAMED: usize = 4;
    let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
    for (what, why) in failed {
        match reasons.iter_mut().find(|(w, _)| w == why) {
            Some((_, whats)) => whats.push(what),
            None => reasons.push((why, vec![what])),
        }
    }
    reasons
        .iter()
        .map(|(why, whats)| {
            let named = whats
                .iter()
                .take(NAMED)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            let more = whats.len().saturating_sub(NAMED);
            if more > 0 {
                format!("{why} (for {named} and {more} more)")
            } else {
                format!("{why} (for {named})")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Run `tasks` as a job: built (or pulled) by `fetch`, pinned when `pin`.
pub async fn start_job(
    cache: Arc<Cache>,
    tasks: Vec<Task>,
    fetch: Fetch,
    pin: bool,
) -> zbus::Result<zbus::OwnedObjectPath> {
    let c = cache.clone();
    start_work(cache, tasks.len(), move |state| async move {
        c.run_job(tasks, fetch, pin, state).await;
    })
    .await
}

/// Run `work` (of `total` steps, counted in its [`JobStatus`]) as a job
/// whose object is served on the bus (now, and again after a reconnect);
/// emits progress and `Finished`, then leaves the object for late readers.
/// The job runs whether or not the bus is up.
pub async fn start_work<F, Fut>(
    cache: Arc<Cache>,
    total: usize,
    work: F,
) -> zbus::Result<zbus::OwnedObjectPath>
where
    F: FnOnce(Arc<Mutex<JobStatus>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let path = cache.new_job_path();
    let owned = zbus::OwnedObjectPath::try_from(path.clone())?;
    let state = Arc::new(Mutex::new(JobStatus {
        total,
        state: JobState::Running,
        ..JobStatus::default()
    }));
    cache.add_job(&path, state.clone());
    if let Some(conn) = cache.shared.bus() {
        let job = Job {
            state: state.clone(),
        };
        conn.object_server().at(path.as_str(), job).await?;
    }
    let fut = work(state.clone());
    tokio::spawn(async move {
        let run = tokio::spawn(fut);
        // Progress as it goes, at most every 200 ms.
        let mut last = usize::MAX;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while !run.is_finished() {
            tick.tick().await;
            let done = state.lock().map(|s| s.done).unwrap_or(0);
            if done != last {
                last = done;
                emit_progress(cache.shared.bus(), &path).await;
            }
        }
        let _ = run.await;
        emit_progress(cache.shared.bus(), &path).await;
        let (ok, msg) = state
            .lock()
            .map(|s| (s.state == JobState::Done, s.message.clone()))
            .unwrap_or((false, "job state lost".into()));
        if ok {
            info!("{path}: {msg}");
        } else {
            warn!("{path}: {msg}");
        }
        let conn = cache.shared.bus();
        if let Some(conn) = &conn
            && let Ok(iface) = conn
                .object_server()
                .interface::<_, Job>(path.as_str())
                .await
        {
            let em = iface.signal_emitter();
            let i = iface.get().await;
            let _ = i.state_changed(em).await;
            let _ = Job::finished(em, ok, &msg).await;
        }
        for old in cache.retire_job(path) {
            if let Some(conn) = &conn {
                let _ = conn.object_server().remove::<Job, _>(old.as_str()).await;
            }
        }
    });
    Ok(owned)
}

async fn emit_progress(conn: Option<Connection>, path: &str) {
    let Some(conn) = conn else { return };
    if let Ok(iface) = conn.object_server().interface::<_, Job>(path).await {
        let i = iface.get().await;
        let _ = i.progress_changed(iface.signal_emitter()).await;
    }
}

/// `io.gpuarch1.Job`: one pre-warm.
/// (Served here, where jobs are made, so that the cache needs nothing of
/// the bus service that hands it requests.)
#[derive(Debug)]
pub struct Job {
    pub state: Arc<std::sync::Mutex<JobStatus>>,
}

/// A job on the kernel cache: a pre-warm, pull, push or import.
#[interface(name = "io.gpuarch1.Job")]
impl Job {
    /// Fraction of its steps (builds, pulls, pushes, files) finished, 0 to 1.
    #[zbus(property)]
    fn progress(&self) -> f64 {
        self.state.lock().map_or(0.0, |s| {
            if s.total == 0 {
                1.0
            } else {
                s.done as f64 / s.total as f64
            }
        })
    }

    /// "running", "done" (everything asked for is served) or "failed".
    #[zbus(property)]
    fn state(&self) -> JobState {
        self.state.lock().map_or(JobState::Failed, |s| s.state)
    }

    /// The outcome in one line, once finished.
    #[zbus(property(emits_changed_signal = "false"))]
    fn message(&self) -> String {
        self.state
            .lock()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    }

    /// One line per finished step: `rmsnorm sm_75: built fp16`.
    #[zbus(property(emits_changed_signal = "false"))]
    fn log(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.lines.clone())
            .unwrap_or_default()
    }

    /// The job ended: ok when everything asked for is served.
    #[zbus(signal)]
    pub async fn finished(emitter: &SignalEmitter<'_>, ok: bool, message: &str)
    -> zbus::Result<()>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// One missing NVRTC across packages and archs is one reason and a
    /// count, not a 2 KB line; distinct reasons stay apart, in order.
    #[test]
    fn job_failures_are_one_line_per_reason() {
        let nvrtc = "NVRTC (libnvrtc.so.13 or libnvrtc.so.12) not found: install ...";
        let mut failed: Vec<(String, String)> = ["saxpy", "rmsnorm", "rotary"]
            .iter()
            .flat_map(|p| ["sm_75", "sm_86"].map(|a| (format!("{p} {a}"), nvrtc.to_owned())))
            .collect();
        failed.insert(1, ("saxpy sm_90".into(), "no variant builds for it".into()));
        assert_eq!(
            by_reason(&failed),
            format!(
                "{nvrtc} (for saxpy sm_75, saxpy sm_86, rmsnorm sm_75, rmsnorm sm_86 and 2 more); no variant builds for it (for saxpy sm_90)"
            )
        );
    }

    /// Root, to make mount namespaces; else false, after a SKIPPED line, or
    /// a failure where every test must run (CI=true or
    /// GPUARCH_TEST_REQUIRE_ALL=1).
    fn may_make_namespaces() -> bool {
        if nix::unistd::Uid::effective().is_root() {
            return true;
        }
        let why = "needs root to make a mount namespace";
        if std::env::var("CI").is_ok_and(|v| v == "true")
            || std::env::var("GPUARCH_TEST_REQUIRE_ALL").is_ok_and(|v| v == "1")
        {
            panic!("cannot run (CI=true or GPUARCH_TEST_REQUIRE_ALL=1): {why}");
        }
        eprintln!("SKIPPED: {why}");
        false
    }

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
        if !may_make_namespaces() {
            return;
        }
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
        if !may_make_namespaces() {
            return;
        }
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
