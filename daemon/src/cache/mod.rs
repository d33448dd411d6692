//! The kernel cache in gpuarchd, its front: the packages, what a request
//! may ask for, publishing, eviction, verification and the listing. Builds
//! run on blocking threads, at most `kernels.workers` at once. After every
//! job the packages it touched are re-published: each arch's entry is
//! looked up (every file's sha256 checked) before it is named in
//! `<mount_root>/<package>/manifest.json`.
//!
//! The rest lives beside it: [`jobs`] (pre-warm, pull and push jobs and
//! their D-Bus objects), [`imports`] (a site's own files), [`mounts`]
//! (what containers mount of the cache, on any mount namespace, and the
//! views no one does).

mod imports;
mod jobs;
mod libraries;
mod mounts;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use gpuarch_core::arch::Target;
use gpuarch_core::config::KernelsConfig;
use gpuarch_kernels::build::{ArchResult, Builder, Fetch, Task};
use gpuarch_kernels::spec::{self, Package};
use gpuarch_kernels::store::{self, Store};
use gpuarch_kernels::{import, publish};
use gpuarch_wire::dbus::{KernelRecord, VerifyRecord};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{Semaphore, mpsc};
use tracing::{info, warn};

use crate::state::Shared;
use jobs::Jobs;

pub use gpuarch_wire::dbus::JOBS_PATH;
pub use imports::{ImportPlace, MAX_PENDING_IMPORTS};
pub use jobs::{Job, JobStatus, start_job, start_work};
pub use mounts::{
    IN_USE_TTL, MOUNTINFO_MAX_BYTES, Mounted, StoreFs, VIEW_GRACE, mounted, scan_mounts,
};

/// How long a burst of changes to the packages or the spool settles
/// before it is acted on.
const SETTLE: Duration = Duration::from_millis(300);

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

/// The capability of every GPU of the host.
pub fn host_caps(shared: &Shared) -> BTreeSet<gpuarch_core::arch::ComputeCapability> {
    shared
        .snapshot()
        .map(|s| s.devices.iter().map(|d| d.compute_capability).collect())
        .unwrap_or_default()
}

/// `sm_XX` for every GPU of the host.
pub fn host_archs(shared: &Shared) -> BTreeSet<Target> {
    host_caps(shared).into_iter().map(Target::sass).collect()
}

impl Cache {
    /// Open the store (clearing dead builds) and read the packages.
    pub fn open(cfg: KernelsConfig, shared: Arc<Shared>) -> std::io::Result<Arc<Self>> {
        let store = Store::open(&cfg.cache_dir, cfg.max_bytes)?;
        // NVRTC runs in a worker per build, never in gpuarchd.
        let mut builder = Builder::new(
            store,
            cfg.cuda_dirs.clone(),
            Duration::from_secs(cfg.build_timeout_s),
        )
        .with_worker(gpuarch_kernels::worker::Worker::this_program(
            cfg.build_memory_mib << 20,
        ));
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
        let left = gpuarch_kernels::library::clear_staging(&cfg.libraries_dir());
        if left > 0 {
            tracing::info!(
                "removed {left} half-made library import(s) or tree(s) of a gpuarchd that died"
            );
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
        if names.is_none() {
            self.lay_out_libraries();
        }
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
            let Some((p, a)) = gpuarch_wire::spool::parse_request(&name) else {
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
    #[error(transparent)]
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
