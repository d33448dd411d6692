//! gpuarchd, the node daemon.
//!
//! gpuarchd owns the GPU inventory: it reads NVML at start and on a timer,
//! serves it on the system bus as `io.gpuarch1`, and writes the snapshot the
//! hook reads. Modules:
//!
//! - [`state`]: the inventory and config in force, and what each update changed;
//! - [`refresh`]: NVML reads, backoff, snapshot writes, change signals;
//! - [`service`]: the D-Bus interfaces, a file each, and the caller checks;
//! - [`watch`]: config file watching;
//! - [`cache`]: the kernel cache: its front, jobs, imports and mounts;
//! - [`jit`]: the per-architecture JIT caches the hook hands out, sized and
//!   removed through [`tree`] (by handle: a container wrote them);
//! - [`nfd`]: Node Feature Discovery's labels file (`export.nfd`);
//! - [`nri`]: the Plan for every pod's containers, as an NRI plugin;
//! - [`handover`]: a restart without a gap (`SIGUSR2`);
//! - [`sdnotify`], [`logging`]: systemd citizenship.
//!
//! gpuarchctl, its CLI, is the crate `gpuarch-ctl`; the records both
//! exchange are `gpuarch-wire`'s.

pub mod audit;
pub mod cache;
pub mod handover;
pub mod jit;
pub mod logging;
pub mod nfd;
pub mod nri;
pub mod refresh;
pub mod sdnotify;
pub mod service;
pub mod state;
pub mod tree;
pub mod watch;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch as tokio_watch};
use tracing::{error, info, warn};

use crate::refresh::Refresher;
use crate::service::Request;
use crate::state::Shared;
use gpuarch_kernels::build::Fetch;

#[derive(Debug, Parser)]
#[command(
    name = "gpuarchd",
    version,
    about = "gpuarch's node daemon: the GPU inventory on D-Bus (io.gpuarch1) and in /run/gpuarch/inventory.json",
    after_help = "Config: --config, else GPUARCH_CONFIG, else /etc/gpuarch/config.yaml (absent: defaults); \
changes apply without restart, and on SIGHUP. SIGUSR2: hand over to the program at gpuarchd's own path (after an \
upgrade, the new one) without a gap, as the package's upgrades do. NVML: --nvml-lib, else GPUARCH_NVML_LIB, else libnvidia-ml.so.1. \
Bus: the system bus, or DBUS_SYSTEM_BUS_ADDRESS."
)]
pub struct Args {
    /// More log output: -v debug, -vv trace (default info, or RUST_LOG).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The config file (it must exist).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Where to write the inventory snapshot [default: the config's
    /// daemon.snapshot, /run/gpuarch/inventory.json unless set].
    #[arg(long, value_name = "PATH")]
    pub snapshot: Option<PathBuf>,
    /// The NVML library to load.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Check the config (PATH, else the one gpuarchd would read) and exit:
    /// 0 valid, 1 invalid.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    pub check_config: Option<Option<PathBuf>>,
    /// Run one build (NVRTC) as gpuarchd's worker: a request on standard
    /// input, the answer on standard output. gpuarchd starts these itself.
    #[arg(long, hide = true, exclusive = true)]
    pub build_worker: bool,
    /// Audit one image as gpuarchd's worker: a request on standard input,
    /// the audit on standard output. gpuarchd starts these itself.
    #[arg(long, hide = true, exclusive = true)]
    pub audit_worker: bool,
}

impl Args {
    fn config_file(&self) -> (PathBuf, bool) {
        match &self.config {
            Some(p) => (p.clone(), true),
            None => gpuarch_fs::config::config_path(),
        }
    }
}

/// `--check-config`: print the verdict; the exit status.
pub fn check_config(args: &Args, path: Option<PathBuf>) -> u8 {
    let (path, must) = match path {
        Some(p) => (p, true),
        None => args.config_file(),
    };
    match gpuarch_fs::config::read_config_at(&path, must) {
        Ok(_) if !path.exists() => {
            println!("{}: absent; the defaults apply", path.display());
            0
        }
        Ok(_) => {
            println!("{}: valid", path.display());
            0
        }
        Err(e) => {
            eprintln!("gpuarchd: {e}");
            1
        }
    }
}

/// Large allocations always from mmap, and back to the kernel when freed.
/// A D-Bus message may be 32 MiB and is held whole while it is handled;
/// glibc's default raises its mmap threshold after such a buffer is freed,
/// so later ones came from the heap and stayed (gpuarchd's RSS stayed
/// 27 MiB up after a flood of 32 MiB arguments). A fixed threshold turns
/// that adjustment off.
fn release_large_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter, before any thread.
    unsafe {
        nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Run the daemon until SIGTERM or SIGINT, or until a successor took
/// over (SIGUSR2, [`handover`]).
pub fn run(args: Args) -> Result<()> {
    release_large_buffers();
    if let Some(w) = logging::init(args.verbose) {
        warn!("{w}");
    }
    let (config_path, must_exist) = args.config_file();
    let config = gpuarch_fs::config::read_config_at(&config_path, must_exist)
        .context("refusing to start with an invalid config")?;
    let nvml_lib = args
        .nvml_lib
        .clone()
        .or_else(|| std::env::var_os("GPUARCH_NVML_LIB").map(PathBuf::from));
    let snapshot = args
        .snapshot
        .clone()
        .unwrap_or_else(|| config.daemon.snapshot.clone());
    let mut shared = Shared::new(config, snapshot, config_path, must_exist);
    if let Some(lib) = &nvml_lib {
        shared.nvml_library = lib.display().to_string();
    }
    let shared = Arc::new(shared);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(serve(shared, nvml_lib));
    // A hung NVML read must not hold up the exit.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    info!("stopped");
    result
}

/// gpuarchd itself: start, serve until stopped, shut down.
async fn serve(shared: Arc<Shared>, nvml_lib: Option<PathBuf>) -> Result<()> {
    let mut running = start(&shared, nvml_lib).await?;
    let outcome = serve_until_stopped(&shared, &mut running).await;
    shutdown(&shared, running, &outcome).await;
    outcome
}

/// gpuarchd started: what its loop serves and what shutdown stops.
struct Running {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    /// The program to start as a successor on `SIGUSR2` ([`handover`]).
    program: Option<PathBuf>,
    /// The successor started, once: this gpuarchd stops, exit 0, when it
    /// takes the bus name.
    successor: Option<u32>,
    cache: Option<Arc<cache::Cache>>,
    req_tx: mpsc::Sender<Request>,
    /// The bus's signals to gpuarchd's connection: its end, a lost name.
    lost: zbus::MessageStream,
    stop_tx: tokio_watch::Sender<bool>,
    refresh_task: tokio::task::JoinHandle<()>,
    nri_task: tokio::task::JoinHandle<()>,
    /// Kept for as long as gpuarchd runs: dropped, they stop watching.
    _watchers: [Option<notify::RecommendedWatcher>; 2],
}

/// The first inventory, the kernel cache, the bus name, every task, and
/// READY=1.
async fn start(shared: &Arc<Shared>, nvml_lib: Option<PathBuf>) -> Result<Running> {
    let term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let usr2 = signal(SignalKind::user_defined2()).context("SIGUSR2 handler")?;
    let program = handover::program_at_start();

    let mut refresher = Refresher::new(shared.clone(), nvml_lib);
    // The first read before the name is taken: READY=1 means "answering,
    // with an inventory" (or, if NVML is down, with the reason).
    let _ = refresher.refresh(true).await;
    // Beside the snapshot the first refresh wrote (and its directory).
    shared.publish_config();

    let (req_tx, req_rx) = mpsc::channel::<Request>(64);
    let (stop_tx, stop_rx) = tokio_watch::channel(false);
    // NRI first: it needs the inventory, not the bus. A successor
    // registers before it takes the bus name from the gpuarchd it
    // replaces, so that one of the two is always registered.
    let predecessor = handover::predecessor();
    // Registered beside the old one, this one claims before it adjusts.
    shared.set_claiming(predecessor.is_some());
    let nri_task = tokio::spawn(nri::run(shared.clone(), stop_rx.clone()));
    if let Some(old) = predecessor {
        wait_registered(shared, handover::REGISTER_WITHIN).await;
        let pid = old.pid;
        info!(
            "taking over from gpuarchd pid {pid} (NRI: {})",
            shared.nri().state
        );
        // The old one makes this process the unit's main one, then this
        // one takes the bus name (and with it, the old one's exit).
        tokio::task::spawn_blocking(move || old.ready())
            .await
            .context("the handover")?
            .with_context(|| format!("taking over from gpuarchd pid {pid}"))?;
        tokio::spawn(claim_until_gone(shared.clone(), pid));
    }
    let kcfg = shared.config().kernels.clone();
    let cache = match cache::Cache::open(kcfg.clone(), shared.clone()) {
        Ok(c) => Some(c),
        Err(e) => {
            error!(
                "kernel cache at {} unavailable: {e}; serving the inventory without it",
                kcfg.cache_dir.display()
            );
            None
        }
    };
    let (conns, lost) = connect(shared, cache.as_ref(), &req_tx)
        .await
        .with_context(|| format!("owning {} on the system bus", service::BUS_NAME))?;
    shared.set_buses(conns);
    info!(
        "serving {} at {} on the system bus",
        service::BUS_NAME,
        service::OBJECT_PATH
    );

    let refresh_task = tokio::spawn(refresher.run(req_rx, stop_rx.clone()));
    let config_watcher = watch::start(shared.clone(), req_tx.clone());
    tokio::spawn(jit_gc_every(shared.clone()));
    tokio::spawn(audit::run(shared.clone(), stop_rx.clone()));
    if let Some(every) = sdnotify::watchdog_interval() {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => { let _ = sdnotify::notify("WATCHDOG=1"); }
                    _ = stop.changed() => return,
                }
            }
        });
    }
    if let Err(e) = sdnotify::notify("READY=1") {
        warn!("cannot notify systemd: {e}");
    }
    let kernel_watcher = cache.as_ref().and_then(|c| start_kernels(c.clone()));
    Ok(Running {
        term,
        int,
        hup,
        usr2,
        program,
        successor: None,
        cache,
        req_tx,
        lost,
        stop_tx,
        refresh_task,
        nri_task,
        _watchers: [config_watcher, kernel_watcher],
    })
}

/// Serve until SIGTERM or SIGINT (Ok), or until the bus name is another
/// process's (Err: systemd restarts gpuarchd). SIGHUP reloads.
///
/// When the bus goes away (dbus-daemon restarted), everything but the
/// D-Bus API goes on: the snapshot the hook reads, the builds, the
/// watchers. Reconnect with backoff and take the name again; the objects,
/// and the jobs kept for late readers, are served anew.
async fn serve_until_stopped(shared: &Arc<Shared>, r: &mut Running) -> Result<()> {
    let mut down: Option<Reconnect> = None;
    loop {
        tokio::select! {
            _ = r.term.recv() => return Ok(()),
            _ = r.int.recv() => return Ok(()),
            m = next_signal(&mut r.lost), if down.is_none() => match m {
                None | Some(Err(_)) => {
                    warn!("lost the connection to the system bus; reconnecting");
                    shared.set_buses(Vec::new());
                    let _ = sdnotify::notify("STATUS=reconnecting to the system bus");
                    down = Some(Reconnect::new());
                }
                Some(Ok(msg)) => {
                    // Another owner took the name: a second gpuarchd
                    // allowed to replace us. It answers from now on.
                    if msg.body().deserialize::<&str>().ok() == Some(service::BUS_NAME) {
                        if let Some(pid) = r.successor {
                            info!("the successor (pid {pid}) took {}; handing over", service::BUS_NAME);
                            return Ok(());
                        }
                        return Err(anyhow::anyhow!("lost the bus name {}", service::BUS_NAME));
                    }
                }
            },
            _ = tokio::time::sleep_until(down.as_ref().map_or_else(tokio::time::Instant::now, |d| d.at)), if down.is_some() => {
                let Some(d) = down.as_mut() else { continue };
                match connect(shared, r.cache.as_ref(), &r.req_tx).await {
                    Ok((conns, stream)) => {
                        info!(
                            "back on the system bus as {} after {:.1?} and {} attempts",
                            service::BUS_NAME,
                            d.since.elapsed(),
                            d.attempts + 1
                        );
                        shared.set_buses(conns);
                        r.lost = stream;
                        down = None;
                        let _ = sdnotify::notify("STATUS=serving");
                    }
                    Err(e) if matches!(e.downcast_ref::<zbus::Error>(), Some(zbus::Error::NameTaken)) => {
                        return Err(anyhow::anyhow!(
                            "{} is owned by another process since the bus came back",
                            service::BUS_NAME
                        ));
                    }
                    Err(e) => {
                        tracing::debug!("reconnecting to the system bus: {e:#}");
                        d.failed();
                    }
                }
            }
            _ = r.usr2.recv() => match (&r.successor, &r.program) {
                (Some(pid), _) => warn!("SIGUSR2: already handing over to pid {pid}"),
                (None, None) => warn!("SIGUSR2: no successor: gpuarchd's own path is not known"),
                (None, Some(program)) => match handover::spawn(program, shared.clone()) {
                    Ok(pid) => r.successor = Some(pid),
                    Err(e) => warn!("SIGUSR2: cannot start {}: {e}; serving on", program.display()),
                },
            },
            _ = r.hup.recv() => {
                info!("SIGHUP: reloading the config and the inventory");
                let (tx, _rx) = tokio::sync::oneshot::channel();
                let _ = r.req_tx.send(Request::Reload(tx)).await;
            }
        }
    }
}

/// Say why gpuarchd stops, stop every task, and leave the bus.
async fn shutdown(shared: &Arc<Shared>, r: Running, outcome: &Result<()>) {
    match outcome {
        Ok(()) => info!("stopping"),
        Err(e) => error!("{e}; stopping so that systemd restarts gpuarchd"),
    }
    // Handed over, the service is not stopping: the successor is its main
    // process, and STOPPING=1 is not this one's to say.
    if r.successor.is_none() {
        let _ = sdnotify::notify("STOPPING=1\nSTATUS=stopping");
    }
    let _ = r.stop_tx.send(true);
    // The refresher stops between steps; a snapshot write in progress
    // finishes (it is a rename, so the file is whole either way).
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), r.refresh_task).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), r.nri_task).await;
    shared.set_buses(Vec::new());
}

/// Claim NRI adjustments until the old gpuarchd, this one's parent, has
/// exited (this process is then another's child): from then on this one
/// is the only one registered.
async fn claim_until_gone(shared: Arc<Shared>, old: u32) {
    let old = nix::unistd::Pid::from_raw(old as i32);
    while nix::unistd::getppid() == old {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    shared.set_claiming(false);
    info!("gpuarchd pid {old} has exited; NRI adjustments are no longer claimed");
}

/// Until NRI is registered, off, or `limit` has passed.
async fn wait_registered(shared: &Shared, limit: std::time::Duration) {
    let until = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < until {
        let state = shared.nri().state;
        if state.starts_with("registered") || state.starts_with("off") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    warn!("not registered with NRI {limit:?} after start; taking over all the same");
}

/// How many incoming messages gpuarchd holds before it has handled them;
/// past that it stops reading, and the bus keeps the rest.
const MAX_QUEUED: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(2) {
    Some(n) => n,
    None => unreachable!(),
};

/// Connect to the system bus, serve gpuarchd's objects (and the jobs the
/// cache keeps) and take the name, then do the same as the admins' name
/// on a second connection (`ADMIN_BUS_NAME`: the bus queues calls per
/// connection, so there an admin's call does not wait behind a flood of
/// everyone's); with the stream of `NameLost` signals, which ends when
/// the first connection does.
async fn connect(
    shared: &Arc<Shared>,
    cache: Option<&Arc<cache::Cache>>,
    req_tx: &mpsc::Sender<Request>,
) -> Result<(Vec<zbus::Connection>, zbus::MessageStream)> {
    let conn = serve_as(shared, cache, req_tx, service::BUS_NAME).await?;
    let mut conns = vec![conn.clone()];
    match serve_as(shared, cache, req_tx, service::ADMIN_BUS_NAME).await {
        Ok(admin) => conns.push(admin),
        // A bus policy of an older release (not reloaded since the
        // upgrade): admins' calls then wait in line with everyone's.
        Err(e) => warn!(
            "not serving {}: {e:#}; root's and group gpuarch's calls go to {} with everyone's",
            service::ADMIN_BUS_NAME,
            service::BUS_NAME
        ),
    }
    service::open_side_connection().await;
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender("org.freedesktop.DBus")
        .interface("org.freedesktop.DBus")
        .member("NameLost")
        .build()?;
    let lost = zbus::MessageStream::for_match_rule(rule, &conn, None).await?;
    Ok((conns, lost))
}

/// One connection to the system bus serving gpuarchd's objects and the
/// jobs the cache keeps, owning `name`.
async fn serve_as(
    shared: &Arc<Shared>,
    cache: Option<&Arc<cache::Cache>>,
    req_tx: &mpsc::Sender<Request>,
    name: &'static str,
) -> Result<zbus::Connection> {
    // Read ahead at most MAX_QUEUED messages: each may be 32 MiB (the
    // bus's limit), and one not yet handled is held whole.
    let mut builder = zbus::connection::Builder::system().max_queued(MAX_QUEUED);
    if let Some(c) = cache {
        builder = builder.serve_at(
            service::OBJECT_PATH,
            service::KernelCache { cache: c.clone() },
        );
    }
    let conn = builder
        .serve_at(
            service::OBJECT_PATH,
            service::Inventory {
                shared: shared.clone(),
            },
        )
        .serve_at(
            service::OBJECT_PATH,
            service::JitCache {
                shared: shared.clone(),
            },
        )
        .serve_at(
            service::OBJECT_PATH,
            service::Daemon {
                shared: shared.clone(),
                requests: req_tx.clone(),
            },
        )
        .name(name)
        .build()
        .await?;
    if let Some(c) = cache {
        c.serve_jobs(&conn).await?;
    }
    Ok(conn)
}

async fn next_signal(s: &mut zbus::MessageStream) -> Option<zbus::Result<zbus::Message>> {
    futures_util::StreamExt::next(s).await
}

/// Backoff between attempts to get back on the bus: 50 ms, doubling, at
/// most 2 s, so that gpuarchd is back within 2 s of the bus.
struct Reconnect {
    since: std::time::Instant,
    at: tokio::time::Instant,
    attempts: u32,
}

impl Reconnect {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(50);
    const MOST: std::time::Duration = std::time::Duration::from_secs(2);

    fn new() -> Self {
        Self {
            since: std::time::Instant::now(),
            at: tokio::time::Instant::now() + Self::FIRST,
            attempts: 0,
        }
    }

    fn failed(&mut self) {
        self.attempts += 1;
        let wait = Self::FIRST
            .saturating_mul(1 << self.attempts.min(10))
            .min(Self::MOST);
        self.at = tokio::time::Instant::now() + wait;
    }
}

/// Keep the JIT caches under `jit_cache.max_bytes`, at start and every
/// [`jit::INTERVAL`], with the config in force then.
async fn jit_gc_every(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(jit::INTERVAL);
    loop {
        tick.tick().await;
        let cfg = shared.config().jit_cache.clone();
        let r = tokio::task::spawn_blocking(move || jit::gc(&cfg, &jit::mounted(&cfg.dir))).await;
        match r {
            Ok(Ok(r)) => jit::log_report(&r),
            Ok(Err(e)) => warn!("JIT caches: {e}"),
            Err(_) => {}
        }
    }
}

/// After READY: publish what the store holds, pre-warm for the host's GPUs
/// (config `kernels.prewarm`), take the hook's requests, and follow the
/// package directories and the spool.
fn start_kernels(cache: Arc<cache::Cache>) -> Option<notify::RecommendedWatcher> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let watcher = cache::watch(&cache.cfg, tx);
    // What an earlier run could not build may build now (a restart is what
    // applies a newly installed NVRTC): containers ask again.
    let _ = std::fs::remove_file(gpuarch_wire::spool::unbuildable_path(&cache.cfg.spool_dir));
    tokio::spawn(async move {
        let c = cache.clone();
        let _ = tokio::task::spawn_blocking(move || {
            c.publish(None);
            c.sweep_views(&c.mounted().views);
        })
        .await;
        if cache.cfg.prewarm {
            match cache.tasks(&[], &[]) {
                Ok(t) if !t.is_empty() => {
                    info!("pre-warming {} kernel builds for the host's GPUs", t.len());
                    if let Err(e) = cache::start_job(cache.clone(), t, Fetch::Build, false).await {
                        warn!("cannot start the pre-warm: {e}");
                    }
                }
                Ok(_) => {}
                Err(e) => info!("no pre-warm at start: {e}"),
            }
        }
        loop {
            let requests = cache.take_requests();
            if !requests.is_empty() {
                info!("{} kernel build requests from containers", requests.len());
                if let Err(e) = cache::start_job(cache.clone(), requests, Fetch::Build, false).await
                {
                    warn!("cannot start the requested builds: {e}");
                }
            }
            if rx.recv().await.is_none() {
                return;
            }
            let c = cache.clone();
            let changed = tokio::task::spawn_blocking(move || {
                let changed = c.reload_packages();
                c.publish(None);
                changed
            })
            .await
            .unwrap_or_default();
            if cache.cfg.prewarm
                && !changed.is_empty()
                && let Ok(t) = cache.tasks(&changed, &[])
                && let Err(e) = cache::start_job(cache.clone(), t, Fetch::Build, false).await
            {
                warn!("cannot start the pre-warm of changed packages: {e}");
            }
        }
    });
    watcher
}
