//! The D-Bus service: `io.gpuarch1.Inventory` and `io.gpuarch1.Daemon` at
//! `/io/gpuarch1`. Reads are open to everyone; `Reload` checks the caller's
//! credentials as the bus reports them (the bus policy checks first).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gpuarch_core::snapshot::Snapshot;
use gpuarch_core::{plan, requirement};
use gpuarch_wire::dbus::{DeviceRecord, Env, JitCacheRecord, KernelRecord, VerifyRecord};
use tokio::sync::{mpsc, oneshot};
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, fdo, interface};

use crate::state::Shared;
use gpuarch_kernels::build::Fetch;

pub use gpuarch_wire::dbus::{BUS_NAME, OBJECT_PATH};
/// Members of this group (and root) may call privileged methods.
pub const ADMIN_GROUP: &str = "gpuarch";

/// What the D-Bus side asks of the refresher.
#[derive(Debug)]
pub enum Request {
    /// Re-read the config and the inventory now; answer when done.
    Reload(oneshot::Sender<Result<(), crate::state::ReloadError>>),
    /// The config changed (watcher or SIGHUP): re-plan the refresh timer.
    ConfigChanged,
}

/// Microseconds since the epoch, as systemd's timestamps; 0 for never.
pub fn usec(t: Option<SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn no_inventory(shared: &Shared) -> fdo::Error {
    let why = shared
        .inventory()
        .last_error
        .unwrap_or_else(|| "the first NVML read has not finished".to_owned());
    fdo::Error::Failed(format!(
        "no GPU inventory yet: NVML has not answered since gpuarchd started ({why})"
    ))
}

fn current(shared: &Shared) -> fdo::Result<Arc<Snapshot>> {
    shared.snapshot().ok_or_else(|| no_inventory(shared))
}

/// `io.gpuarch1.Inventory`.
#[derive(Debug)]
pub struct Inventory {
    pub shared: Arc<Shared>,
}

/// The GPUs of this node and what they can run.
#[interface(name = "io.gpuarch1.Inventory", spawn = false)]
impl Inventory {
    /// One dictionary per GPU, in index order: index (u), minor (u), uuid,
    /// name, compute_capability ("8.6"), arch ("Ampere", "" if unknown),
    /// pci_bus_id, memory_bytes (t), features (as: bf16, tf32, fp8,
    /// flash_attention_2, flash_attention_3, flashinfer), mig (aa{sv}:
    /// index, uuid, name, memory_bytes), brand (NVML's, as `tesla`; absent
    /// where NVML does not say).
    #[zbus(out_args("devices"))]
    fn list_devices(&self) -> fdo::Result<Vec<DeviceRecord>> {
        Ok(current(&self.shared)?
            .devices
            .iter()
            .map(DeviceRecord::from)
            .collect())
    }

    /// What a container on these GPUs gets: the variables gpuarch would
    /// inject and one note per decision. Devices as NVIDIA_VISIBLE_DEVICES
    /// names them, one per entry: "0", "GPU-<uuid>", "0:1", "MIG-<uuid>",
    /// "all". An entry naming no device here is an InvalidArgs error, as
    /// are more than 1024 entries or one longer than 256 bytes.
    #[zbus(out_args("env", "notes"))]
    // The return type is written out: the macro makes a tuple's members
    // separate out args (`a{ss}` env, `as` notes), an alias one struct.
    fn plan(&self, devices: Vec<&str>) -> fdo::Result<(Env, Vec<String>)> {
        let snap = current(&self.shared)?;
        let p = plan::plan_devices(&devices, &snap, &self.shared.config().env)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        Ok((p.env.into_iter().collect(), p.notes))
    }

    /// gres.conf lines for this node: one "Name=gpu Type=sm_XY
    /// File=/dev/nvidiaN" per GPU in minor order, after comments with the
    /// node's slurm.conf Gres= and Features=. Failed for a node with MIG.
    #[zbus(out_args("gres_conf"))]
    fn slurm_gres(&self) -> fdo::Result<String> {
        let snap = current(&self.shared)?;
        let node = gpuarch_core::slurm::short_name(
            &nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        gpuarch_core::slurm::gres_conf(&snap, &node).map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Plan for a Slurm job step: `gpus` as SLURM_STEP_GPUS says them
    /// (indices in gres.conf order, which gpuarch writes in minor order;
    /// "0,2-3"). An index the node has not is an InvalidArgs error, as is
    /// a list longer than 4096 bytes.
    #[zbus(out_args("env", "notes"))]
    fn slurm_plan(&self, gpus: &str) -> fdo::Result<(Env, Vec<String>)> {
        // parse_list refuses a list over 4 KiB before reading it.
        let snap = current(&self.shared)?;
        let p = gpuarch_core::slurm::plan(gpus, &snap, &self.shared.config().env)
            .map_err(fdo::Error::InvalidArgs)?;
        Ok((p.env.into_iter().collect(), p.notes))
    }

    /// UUIDs of the GPUs meeting every comma-joined term of the requirement:
    /// arch>=X.Y, arch>X.Y, arch<=X.Y, arch<X.Y, arch=X.Y, arch!=X.Y,
    /// feature=NAME. A bad term is an InvalidArgs error naming it; so is a
    /// requirement longer than 4096 bytes.
    #[zbus(name = "Match", out_args("uuids"))]
    fn match_devices(&self, requirement: &str) -> fdo::Result<Vec<String>> {
        let snap = current(&self.shared)?;
        requirement::match_uuids(requirement, &snap)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))
    }

    /// Compute capability of each GPU, in index order.
    #[zbus(property)]
    fn compute_capabilities(&self) -> Vec<String> {
        self.shared.snapshot().map_or_else(Vec::new, |s| {
            s.devices
                .iter()
                .map(|d| d.compute_capability.to_string())
                .collect()
        })
    }

    /// The NVIDIA driver's version ("" before the first NVML read).
    #[zbus(property)]
    fn driver_version(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.driver_version.clone())
            .unwrap_or_default()
    }

    /// The CUDA version the driver supports, MAJOR.MINOR.
    #[zbus(property)]
    fn cuda_driver_version(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.cuda_driver_version.clone())
            .unwrap_or_default()
    }

    /// True while the last refresh failed and the inventory served is the
    /// last good one.
    #[zbus(property)]
    fn stale(&self) -> bool {
        self.shared.snapshot().is_some_and(|s| s.stale)
    }

    /// What the inventory served was read from: "nvml" ("" before the first
    /// read).
    #[zbus(property)]
    fn source(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.source.clone())
            .unwrap_or_default()
    }

    /// When the inventory served was read and last changed (RFC 3339).
    #[zbus(property)]
    fn generated_at(&self) -> String {
        self.shared
            .snapshot()
            .map(|s| s.generated_at.clone())
            .unwrap_or_default()
    }

    /// When NVML last answered, in microseconds since the epoch (0: never).
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_refresh(&self) -> u64 {
        usec(self.shared.inventory().last_success)
    }

    /// Why the last refresh failed ("" when it succeeded).
    #[zbus(property)]
    fn last_error(&self) -> String {
        self.shared.inventory().last_error.unwrap_or_default()
    }

    /// The NVML library gpuarchd loads, as it was named: `--nvml-lib`,
    /// else `GPUARCH_NVML_LIB`, else `libnvidia-ml.so.1`.
    #[zbus(property(emits_changed_signal = "const"))]
    fn nvml_library(&self) -> String {
        self.shared.nvml_library.clone()
    }

    /// The set of GPUs or their properties changed.
    #[zbus(signal)]
    pub async fn devices_changed(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;
}

/// The uid and groups of a bus connection, as the bus said them.
type Creds = (u32, Option<Vec<u32>>);

/// Credentials by unique connection name. The bus never gives a unique
/// name twice and takes a connection's credentials once, when it
/// connects, so an answer holds for the name's whole life; a privileged
/// caller's second call costs no bus round trip, however busy the bus.
/// Bounded: past [`CREDS_KEPT`] names the oldest half is forgotten.
static CREDS: std::sync::Mutex<std::collections::BTreeMap<String, (u64, Creds)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
const CREDS_KEPT: usize = 4096;

fn creds_cached(sender: &str) -> Option<Creds> {
    CREDS.lock().ok()?.get(sender).map(|(_, c)| c.clone())
}

fn creds_keep(sender: &str, creds: Creds) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let Ok(mut m) = CREDS.lock() else { return };
    if m.len() >= CREDS_KEPT {
        let mut ages: Vec<u64> = m.values().map(|(n, _)| *n).collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        m.retain(|_, (n, _)| *n > cut);
    }
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    m.insert(sender.to_owned(), (n, creds));
}

/// A connection of gpuarchd's own to the bus for credential lookups
/// alone. On the serving connection the lookup's request waits behind
/// gpuarchd's replies to every call in flight: under a flood of 250
/// connections root's first call waited 10 s for it, while a Ping took
/// under a millisecond. On a connection of its own it is one round trip.
static SIDE: tokio::sync::Mutex<Option<Connection>> = tokio::sync::Mutex::const_new(None);

/// Make the side connection now, on a quiet bus (gpuarchd's start, or its
/// return after the bus restarted), rather than under the flood that a
/// first privileged call may come in.
pub(crate) async fn open_side_connection() {
    *SIDE.lock().await = side_connection().await;
}

/// A new side connection to the system bus, if one can be made.
async fn side_connection() -> Option<Connection> {
    zbus::connection::Builder::system()
        .method_timeout(std::time::Duration::from_secs(25))
        .build()
        .await
        .ok()
}

/// GetConnectionCredentials of `sender`, asked on the side connection (made
/// on the serving connection's bus when first needed, and again once if it
/// broke), or on `conn` when none can be made.
async fn lookup_creds(conn: &Connection, sender: &str) -> fdo::Result<fdo::ConnectionCredentials> {
    let ask = |c: Connection| async move {
        fdo::DBusProxy::builder(&c)
            // A plain proxy: no property cache, so no match rule and no
            // GetAll round trip before the one call that matters.
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?
            .get_connection_credentials(zbus::names::BusName::try_from(sender)?)
            .await
    };
    let mut side = SIDE.lock().await;
    for _ in 0..2 {
        if side.is_none() {
            *side = side_connection().await;
        }
        let Some(c) = side.clone() else { break };
        match ask(c).await {
            Ok(creds) => return Ok(creds),
            Err(zbus::fdo::Error::ZBus(_) | zbus::fdo::Error::Disconnected(_)) => *side = None,
            Err(e) => return Err(e),
        }
    }
    drop(side);
    ask(conn.clone()).await
}

/// Why a privileged call is refused, if it is.
pub(crate) async fn authorize(
    conn: &Connection,
    hdr: &Header<'_>,
    method: &str,
) -> fdo::Result<()> {
    let sender = hdr
        .sender()
        .ok_or_else(|| fdo::Error::AccessDenied(format!("{method}: the call has no sender")))?;
    let (uid, bus_groups) = match creds_cached(sender.as_str()) {
        Some(c) => c,
        None => {
            let creds = lookup_creds(conn, sender.as_str()).await?;
            let uid = creds.unix_user_id().ok_or_else(|| {
                fdo::Error::AccessDenied(format!("{method}: the bus did not say who the caller is"))
            })?;
            let c = (uid, creds.unix_group_ids().cloned());
            creds_keep(sender.as_str(), c.clone());
            c
        }
    };
    if uid == 0 {
        return Ok(());
    }
    let admin = nix::unistd::Group::from_name(ADMIN_GROUP)
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw());
    let groups: Vec<u32> = match bus_groups {
        Some(g) => g,
        // Buses without UnixGroupIDs: the groups the user database gives.
        None => groups_of(uid),
    };
    if admin.is_some_and(|g| groups.contains(&g)) {
        return Ok(());
    }
    Err(fdo::Error::AccessDenied(format!(
        "{method} is for root and members of group {ADMIN_GROUP}; the caller (uid {uid}) is neither"
    )))
}

fn groups_of(uid: u32) -> Vec<u32> {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return Vec::new();
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return Vec::new();
    };
    nix::unistd::getgrouplist(&name, user.gid)
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default()
}

/// `io.gpuarch1.Daemon`.
#[derive(Debug)]
pub struct Daemon {
    pub shared: Arc<Shared>,
    pub requests: mpsc::Sender<Request>,
}

/// The daemon itself.
#[interface(name = "io.gpuarch1.Daemon")]
impl Daemon {
    /// Re-read the config and the GPU inventory now; returns when done.
    /// For root and group gpuarch. Fails (with the reason) when the config
    /// is invalid (the previous one stays in force) or NVML did not answer
    /// (the last inventory is served, stale).
    async fn reload(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<()> {
        authorize(conn, &hdr, "Reload").await?;
        let (tx, rx) = oneshot::channel();
        let gone = || fdo::Error::Failed("gpuarchd is stopping".to_owned());
        self.requests
            .send(Request::Reload(tx))
            .await
            .map_err(|_| gone())?;
        rx.await
            .map_err(|_| gone())?
            .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// gpuarchd's version.
    #[zbus(property(emits_changed_signal = "const"))]
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_owned()
    }

    /// When gpuarchd started, in microseconds since the epoch.
    #[zbus(property(emits_changed_signal = "const"))]
    fn started_at(&self) -> u64 {
        usec(Some(self.shared.started))
    }
}

/// `io.gpuarch1.KernelCache`.
#[derive(Debug)]
pub struct KernelCache {
    pub cache: Arc<crate::cache::Cache>,
}

/// Calls that read the cache from disk run on blocking threads, in two
/// pools of two: one for the unprivileged reads (ListKernels, UsedBytes),
/// one for root's operations (GarbageCollect, Verify), so root is never
/// queued behind anyone else's calls.
static READ_WORK: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);
static ROOT_WORK: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// How many unprivileged disk reads may wait or run at once, from one
/// sender and from all: past that a call is answered `LimitsExceeded` at
/// once, so a flood is pushed back onto its senders instead of queueing
/// (as tasks, growing memory) inside gpuarchd.
pub const READS_PER_SENDER: usize = 4;
pub const READS_IN_ALL: usize = 32;

/// Unprivileged disk reads admitted now, by sender.
static ADMITTED: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// A place among the admitted reads, given back when dropped.
struct Admission(String);

impl Admission {
    fn take(hdr: Option<&Header<'_>>, method: &str) -> fdo::Result<Self> {
        let sender = hdr
            .and_then(|h| h.sender())
            .map(|s| s.to_string())
            .unwrap_or_default();
        let mut a = ADMITTED
            .lock()
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        let all: usize = a.values().sum();
        let mine = a.get(&sender).copied().unwrap_or(0);
        if mine >= READS_PER_SENDER || all >= READS_IN_ALL {
            return Err(fdo::Error::LimitsExceeded(format!(
                "{method}: {mine} of this caller's and {all} in all are already in progress \
                 (at most {READS_PER_SENDER} and {READS_IN_ALL}); call again later"
            )));
        }
        *a.entry(sender.clone()).or_default() += 1;
        Ok(Self(sender))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Ok(mut a) = ADMITTED.lock()
            && let Some(n) = a.get_mut(&self.0)
        {
            *n -= 1;
            if *n == 0 {
                a.remove(&self.0);
            }
        }
    }
}

async fn blocking<T: Send + 'static>(
    pool: &'static tokio::sync::Semaphore,
    f: impl FnOnce() -> T + Send + 'static,
) -> fdo::Result<T> {
    let _turn = pool
        .acquire()
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
}

/// A kernel store that could not be read, as the caller sees it.
fn store_error(e: std::io::Error) -> fdo::Error {
    fdo::Error::IOError(format!("reading the kernel cache: {e}"))
}

impl KernelCache {
    /// The job of a Prewarm or Pull: `packages` for `archs` by `fetch`.
    async fn start_tasks(
        &self,
        packages: &[String],
        archs: &[String],
        fetch: Fetch,
        pin: bool,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        let tasks = self
            .cache
            .tasks(packages, archs)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        crate::cache::start_job(self.cache.clone(), tasks, fetch, pin)
            .await
            .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    fn remote_configured(&self) -> fdo::Result<()> {
        if self.cache.builder.remote().is_some() {
            return Ok(());
        }
        Err(fdo::Error::NotSupported(
            match &self.cache.cfg.remote {
                None => "no registry: kernels.remote is not set",
                Some(_) => "the registry in kernels.remote could not be used (journalctl -u gpuarchd says why)",
            }
            .into(),
        ))
    }
}

/// The package and arch lists of a request, within bounds.
fn request_lists(packages: Vec<&str>, archs: Vec<&str>) -> fdo::Result<(Vec<String>, Vec<String>)> {
    if packages.len() > 1024 || archs.len() > 64 {
        return Err(fdo::Error::InvalidArgs(format!(
            "{} packages and {} archs given; at most 1024 and 64",
            packages.len(),
            archs.len()
        )));
    }
    Ok((
        packages.into_iter().map(str::to_owned).collect(),
        archs.into_iter().map(str::to_owned).collect(),
    ))
}

/// The cache of kernel builds.
#[interface(name = "io.gpuarch1.KernelCache")]
impl KernelCache {
    /// Every stored build: key, package, version, variant, dtype, arch,
    /// toolkit, bytes, files, pinned, in_use, last_used, built_at, path.
    /// in_use is as of a scan of the mounts at most 5 s old. A caller with 4
    /// such reads in progress, or 32 in all, is answered LimitsExceeded.
    #[zbus(out_args("kernels"))]
    async fn list_kernels(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> fdo::Result<Vec<KernelRecord>> {
        let _admitted = Admission::take(Some(&hdr), "ListKernels")?;
        let c = self.cache.clone();
        blocking(&READ_WORK, move || c.list())
            .await?
            .map_err(store_error)
    }

    /// Build `packages` (empty: all) for `archs` (`sm_86` or `8.6`; empty:
    /// the host's GPUs), pinning what is built. Returns the job at once.
    /// For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn prewarm(
        &self,
        packages: Vec<&str>,
        archs: Vec<&str>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        // Sizes first: cheap, and says nothing about who may call.
        let (packages, archs) = request_lists(packages, archs)?;
        authorize(conn, &hdr, "Prewarm").await?;
        self.start_tasks(&packages, &archs, Fetch::Build, true)
            .await
    }

    /// As Prewarm, but only from the registry (`kernels.remote`): nothing
    /// is built here. Pins what it pulls when `pin`. Returns the job at
    /// once. For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn pull(
        &self,
        packages: Vec<&str>,
        archs: Vec<&str>,
        pin: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        let (packages, archs) = request_lists(packages, archs)?;
        authorize(conn, &hdr, "Pull").await?;
        self.remote_configured()?;
        self.start_tasks(&packages, &archs, Fetch::Pull, pin).await
    }

    /// Push the stored builds of `packages` (empty: all) for `archs`
    /// (empty: every arch stored) to the registry. Returns the job at once.
    /// For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn push(
        &self,
        packages: Vec<&str>,
        archs: Vec<&str>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        let (packages, archs) = request_lists(packages, archs)?;
        authorize(conn, &hdr, "Push").await?;
        self.remote_configured()?;
        let c = self.cache.clone();
        let entries = blocking(&ROOT_WORK, move || c.stored(&packages, &archs))
            .await?
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let c = self.cache.clone();
        crate::cache::start_work(self.cache.clone(), entries.len(), move |state| async move {
            c.run_push(entries, state).await;
        })
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Import prebuilt files as package `name`: each `(file name, open
    /// file)` is read from the descriptor the caller passes (so gpuarchd
    /// reads only what the caller could open), stored by content, and
    /// served by the code the inspector finds in it. With `ldconfig`, one
    /// file serves all of a container's GPUs and goes into its loader
    /// cache. Replaces an earlier import of `name`, or, if a file fails,
    /// changes nothing. Returns the job at once. Imports run one at a
    /// time, each streamed to disk; past 8 accepted and unfinished, a call
    /// is answered LimitsExceeded. For root and group gpuarch.
    #[zbus(out_args("job"))]
    async fn import(
        &self,
        name: &str,
        files: Vec<(String, zbus::OwnedFd)>,
        ldconfig: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<zbus::OwnedObjectPath> {
        if files.is_empty() || files.len() > 64 {
            return Err(fdo::Error::InvalidArgs(format!(
                "{} files given; 1 to 64",
                files.len()
            )));
        }
        authorize(conn, &hdr, "Import").await?;
        gpuarch_kernels::import::check_name(name)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        if let Some((dup, _)) = files.iter().find(|(f, _)| !seen.insert(f.clone())) {
            return Err(fdo::Error::InvalidArgs(format!("{dup} given twice")));
        }
        let place = self.cache.import_place().ok_or_else(|| {
            fdo::Error::LimitsExceeded(format!(
                "{} imports are waiting already; import again when one has finished",
                crate::cache::MAX_PENDING_IMPORTS
            ))
        })?;
        let files: Vec<(String, std::fs::File)> = files
            .into_iter()
            .map(|(n, fd)| (n, std::fs::File::from(std::os::fd::OwnedFd::from(fd))))
            .collect();
        let (c, name) = (self.cache.clone(), name.to_owned());
        crate::cache::start_work(self.cache.clone(), files.len(), move |state| async move {
            c.run_import(name, files, ldconfig, state, place).await;
        })
        .await
        .map_err(|e| fdo::Error::Failed(e.to_string()))
    }

    /// Remove import `name`: containers started from now on no longer get
    /// it; those that mount it keep it. Its files are unpinned, for the
    /// LRU to take. Returns how many files it had. For root and group
    /// gpuarch.
    #[zbus(out_args("files"))]
    async fn remove_import(
        &self,
        name: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<u32> {
        authorize(conn, &hdr, "RemoveImport").await?;
        gpuarch_kernels::import::check_name(name)
            .map_err(|e| fdo::Error::InvalidArgs(e.to_string()))?;
        let (c, n) = (self.cache.clone(), name.to_owned());
        match blocking(&ROOT_WORK, move || c.remove_import(&n)).await? {
            Ok(Ok(files)) => Ok(u32::try_from(files).unwrap_or(u32::MAX)),
            Ok(Err(known)) => Err(fdo::Error::InvalidArgs(format!(
                "no import named {name} (imports: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))),
            Err(e) => Err(fdo::Error::Failed(format!("removing import {name}: {e}"))),
        }
    }

    /// Evict least recently used builds above LimitBytes (never pinned or
    /// mounted ones); returns the bytes freed. For root and group gpuarch.
    #[zbus(out_args("freed_bytes"))]
    async fn garbage_collect(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<u64> {
        authorize(conn, &hdr, "GarbageCollect").await?;
        let c = self.cache.clone();
        let r = blocking(&ROOT_WORK, move || c.gc())
            .await?
            .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        Ok(r.freed_bytes)
    }

    /// Check every stored file's sha256; a corrupt build is quarantined and
    /// rebuilt. One record per build: key, package, arch, variant, ok,
    /// problem. For root and group gpuarch (it reads the whole cache).
    #[zbus(out_args("results"))]
    async fn verify(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<Vec<VerifyRecord>> {
        authorize(conn, &hdr, "Verify").await?;
        let c = self.cache.clone();
        let (records, rebuild) = blocking(&ROOT_WORK, move || c.verify())
            .await?
            .map_err(store_error)?;
        if !rebuild.is_empty() {
            crate::cache::start_job(self.cache.clone(), rebuild, Fetch::Build, false)
                .await
                .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        }
        Ok(records)
    }

    /// Bytes the stored builds take (LimitsExceeded as for ListKernels).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn used_bytes(&self, #[zbus(header)] hdr: Option<Header<'_>>) -> fdo::Result<u64> {
        let _admitted = Admission::take(hdr.as_ref(), "UsedBytes")?;
        let c = self.cache.clone();
        blocking(&READ_WORK, move || c.used_bytes())
            .await?
            .map_err(store_error)
    }

    /// The size above which builds are evicted (kernels.max_bytes).
    #[zbus(property(emits_changed_signal = "const"))]
    fn limit_bytes(&self) -> u64 {
        self.cache.builder.store.max_bytes()
    }

    /// The compiler NVRTC packages are built with, `NVRTC 12.9 (PATH)`, or
    /// `none: REASON` when no NVRTC build is possible. NVRTC is loaded once
    /// (as the first build would), off the dispatcher.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn compiler(&self) -> fdo::Result<String> {
        let b = self.cache.builder.clone();
        blocking(&READ_WORK, move || compiler_line(b.nvrtc())).await
    }
}

/// [`KernelCache::compiler`]'s answer for a load of NVRTC.
pub fn compiler_line(
    loaded: Result<&gpuarch_kernels::toolchain::Nvrtc, gpuarch_kernels::store::BuildError>,
) -> String {
    match loaded {
        Ok(n) => format!("NVRTC {} ({})", n.version, n.library.display()),
        Err(e) => format!("none: {e}"),
    }
}

/// `io.gpuarch1.JitCache`.
#[derive(Debug)]
pub struct JitCache {
    pub shared: Arc<Shared>,
}

/// The per-architecture JIT caches (config `jit_cache`).
#[interface(name = "io.gpuarch1.JitCache")]
impl JitCache {
    /// Every cache: scope, kind, uid, image, namespace, targets, bytes,
    /// in_use, last_used, path (LimitsExceeded as for ListKernels).
    #[zbus(out_args("caches"))]
    async fn list_caches(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> fdo::Result<Vec<JitCacheRecord>> {
        let _admitted = Admission::take(Some(&hdr), "ListCaches")?;
        let cfg = self.shared.config().jit_cache.clone();
        blocking(&READ_WORK, move || {
            crate::jit::list(&cfg, &crate::jit::mounted(&cfg.dir))
        })
        .await?
        .map_err(|e| fdo::Error::IOError(format!("reading the JIT caches: {e}")))
    }

    /// Remove the least recently started caches above LimitBytes (never
    /// one mounted now or handed out in the last 10 minutes); returns the
    /// bytes freed. For root and group gpuarch.
    #[zbus(out_args("freed_bytes"))]
    async fn garbage_collect(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> fdo::Result<u64> {
        authorize(conn, &hdr, "GarbageCollect").await?;
        let cfg = self.shared.config().jit_cache.clone();
        let r = blocking(&ROOT_WORK, move || {
            crate::jit::gc(&cfg, &crate::jit::mounted(&cfg.dir))
        })
        .await?
        .map_err(|e| fdo::Error::Failed(e.to_string()))?;
        crate::jit::log_report(&r);
        if let Some(f) = r.failed.first() {
            return Err(fdo::Error::Failed(format!(
                "freed {} bytes; {} cache(s) set aside but not removed: {f}",
                r.freed_bytes,
                r.failed.len()
            )));
        }
        Ok(r.freed_bytes)
    }

    /// Bytes the caches take (LimitsExceeded as for ListKernels).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn used_bytes(&self, #[zbus(header)] hdr: Option<Header<'_>>) -> fdo::Result<u64> {
        let _admitted = Admission::take(hdr.as_ref(), "UsedBytes")?;
        let cfg = self.shared.config().jit_cache.clone();
        let caches = blocking(&READ_WORK, move || {
            crate::jit::list(&cfg, &Default::default())
        })
        .await?
        .map_err(|e| fdo::Error::IOError(format!("reading the JIT caches: {e}")))?;
        Ok(caches.iter().map(|c| c.bytes).sum())
    }

    /// The size above which caches are removed (jit_cache.max_bytes).
    #[zbus(property(emits_changed_signal = "false"))]
    fn limit_bytes(&self) -> u64 {
        self.shared.config().jit_cache.max_bytes
    }
}
