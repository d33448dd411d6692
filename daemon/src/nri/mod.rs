//! gpuarchd as an NRI plugin (`nri:` in the config). It connects to the
//! runtime's NRI socket, registers, subscribes to container creation, and
//! answers each container of a pod with its Plan as an adjustment
//! ([`adjust`]): no runtime handler, and the runtime is not replaced.
//!
//! Fail open: while gpuarchd is down or not registered, the runtime starts
//! pods unchanged. When the runtime goes away (a restart), gpuarchd
//! connects again as soon as its socket is back ([`run`]).
//!
//! NRI holds the runtime's lock across each call to a plugin, for every
//! pod of the node, CPU pods included, and drops a plugin that has not
//! answered in 2 s. So the answer waits on nothing slow: no bus round
//! trip, no build, the image read within its own bounds, and a watchdog
//! that answers without an adjustment (or refuses, under `strict`) at
//! [`ANSWER_WITHIN`].

mod adjust;
pub mod claims;
pub mod image;
pub mod mux;
pub mod storage;

/// The NRI messages and services, generated from `proto/nri.proto`.
pub mod proto {
    #[allow(
        dead_code,
        missing_docs,
        missing_debug_implementations,
        non_camel_case_types,
        non_snake_case,
        non_upper_case_globals,
        trivial_casts,
        unused_imports,
        unused_results,
        unused_mut,
        clippy::all,
        clippy::pedantic,
        clippy::restriction
    )]
    pub mod nri {
        include!(concat!(env!("OUT_DIR"), "/nri.rs"));
    }

    #[allow(
        dead_code,
        missing_docs,
        missing_debug_implementations,
        non_camel_case_types,
        non_snake_case,
        unused_imports,
        clippy::all,
        clippy::pedantic,
        clippy::restriction
    )]
    pub mod nri_ttrpc {
        include!(concat!(env!("OUT_DIR"), "/nri_ttrpc.rs"));
    }
}
#[cfg(any(test, feature = "fake-runtime"))]
pub mod fake_runtime;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuarch_container::Context;
use gpuarch_container::edit::Image;
use gpuarch_container::run::{self, StartError, Verdict};
use gpuarch_core::config::NriConfig;
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub use adjust::{CDI_ANNOTATION, Outcome, adjust};
use proto::nri::{
    ConfigureRequest, ConfigureResponse, CreateContainerRequest, CreateContainerResponse, Empty,
    RegisterPluginRequest, SynchronizeRequest, SynchronizeResponse,
};

use crate::state::Shared;

/// The name gpuarchd registers under.
pub const PLUGIN_NAME: &str = "gpuarch";
/// Between attempts to reach the runtime's socket.
pub const RETRY: Duration = Duration::from_secs(1);
/// NRI's event numbers start at 1; a subscription sets bit (event - 1).
const CREATE_CONTAINER: i32 = 4;
/// The latest CreateContainer is answered where the runtime does not say
/// how long it waits: three quarters of NRI's 2 s, after which containerd
/// drops the plugin. Where Configure gives the runtime's wait
/// (containerd's `plugin_request_timeout`), three quarters of that.
pub const ANSWER_WITHIN: Duration = Duration::from_millis(1500);

/// The watchdog's limit for a runtime that waits `request_timeout_ms` for
/// an answer (0 or less: not said).
pub fn answer_within(request_timeout_ms: i64) -> Duration {
    match u64::try_from(request_timeout_ms) {
        Ok(ms) if ms > 0 => Duration::from_millis(ms.saturating_mul(3) / 4),
        _ => ANSWER_WITHIN,
    }
}
/// How long the runtime has to call Configure after registration.
const CONFIGURE_WITHIN: Duration = Duration::from_secs(5);

/// The first wait after a failed connection; each next doubles, up to
/// [`RETRY`]. The socket's return wakes gpuarchd before that.
pub const RETRY_FIRST: Duration = Duration::from_millis(50);

/// Keep gpuarchd registered with the runtime while `nri.enable` is set,
/// until `stop`.
///
/// - A session that ends (the runtime restarting) is followed by a new
///   connection when the socket is back, or after [`RETRY_FIRST`].
/// - While the runtime's socket is absent or refuses, gpuarchd waits for
///   it to appear (inotify on its directory), and tries again after a
///   backoff of [`RETRY_FIRST`] doubling to [`RETRY`] in case the watch
///   missed it.
/// - `stop` ends the session and this loop at once.
pub async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut last_failure: Option<String> = None;
    let say = |state: String| shared.set_nri_state(state);
    let (appeared_tx, mut appeared) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watched: Option<SocketWatch> = None;
    let mut backoff = RETRY_FIRST;
    loop {
        if *stop.borrow() {
            return;
        }
        let cfg = shared.config().nri.clone();
        if watched.as_ref().map(|w| &w.socket) != Some(&cfg.socket) {
            watched = SocketWatch::new(&cfg.socket, appeared_tx.clone());
        }
        // What appeared before this attempt is seen by it.
        while appeared.try_recv().is_ok() {}
        if !cfg.enable {
            say("off (nri.enable)".to_owned());
            backoff = RETRY;
        } else {
            match session(&shared, &cfg, &mut stop).await {
                Ok(why) => {
                    if *stop.borrow() {
                        return;
                    }
                    info!(
                        "NRI: the connection to {} ended ({why}); connecting again",
                        cfg.socket.display()
                    );
                    say(format!(
                        "not registered: the connection to {} ended ({why}); connecting again",
                        cfg.socket.display()
                    ));
                    last_failure = None;
                    // Not at once: a runtime that ends each session as it
                    // starts is not answered by a busy loop.
                    backoff = RETRY_FIRST;
                }
                Err(e) => {
                    let e = e.to_string();
                    say(format!(
                        "not registered: {e}; trying again when the socket appears, and every {} s",
                        RETRY.as_secs()
                    ));
                    // Said once, not on every try while the runtime is down.
                    if last_failure.as_deref() != Some(&e) {
                        warn!("NRI: {e}; trying again when the socket appears");
                        last_failure = Some(e);
                    }
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(RETRY),
            Some(()) = appeared.recv() => backoff = RETRY_FIRST,
            r = stop.changed() => if r.is_err() || *stop.borrow() {
                return;
            },
        }
    }
}

/// A watch on the directory of the runtime's NRI socket, telling when an
/// entry of the socket's name appears there (the runtime listening again).
struct SocketWatch {
    socket: PathBuf,
    _watcher: notify::RecommendedWatcher,
}

impl SocketWatch {
    /// `None` where the directory cannot be watched (absent, or no inotify
    /// left): the backoff alone then finds the socket.
    fn new(socket: &std::path::Path, tx: tokio::sync::mpsc::UnboundedSender<()>) -> Option<Self> {
        use notify::{EventKind, RecursiveMode, Watcher};
        let dir = socket.parent()?;
        let name = socket.file_name()?.to_owned();
        let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            let Ok(ev) = ev else { return };
            if matches!(ev.kind, EventKind::Create(_) | EventKind::Modify(_))
                && ev.paths.iter().any(|p| p.file_name() == Some(&name))
            {
                let _ = tx.send(());
            }
        })
        .ok()?;
        if let Err(e) = w.watch(dir, RecursiveMode::NonRecursive) {
            debug!(
                "NRI: cannot watch {} ({e}); the socket is looked for every {} s",
                dir.display(),
                RETRY.as_secs()
            );
            return None;
        }
        Some(Self {
            socket: socket.to_owned(),
            _watcher: w,
        })
    }
}

/// Why no NRI session came up.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("cannot connect to {}: {error}", socket.display())]
    Connect {
        socket: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("cannot serve the plugin API: {0}")]
    Serve(ttrpc::Error),
    #[error("{} refused the registration: {error}", socket.display())]
    Refused {
        socket: std::path::PathBuf,
        error: ttrpc::Error,
    },
    #[error("{} did not answer the registration", .0.display())]
    NoAnswer(std::path::PathBuf),
    #[error("{} registered gpuarchd but never configured it", .0.display())]
    NotConfigured(std::path::PathBuf),
}

/// One connection: register, then serve until the runtime goes, the
/// config changes what it connects to, or gpuarchd stops. `Ok` is why a
/// session that was up ended; `Err`, why none came up.
async fn session(
    shared: &Arc<Shared>,
    cfg: &NriConfig,
    stop: &mut watch::Receiver<bool>,
) -> Result<String, SessionError> {
    let socket = cfg.socket.clone();
    let stream = tokio::net::UnixStream::connect(&cfg.socket)
        .await
        .map_err(|error| SessionError::Connect {
            socket: socket.clone(),
            error,
        })?;
    debug!("NRI: connected to {}; registering", cfg.socket.display());
    let mut m = mux::split(stream);
    let (configured_tx, configured) = tokio::sync::oneshot::channel();
    let plugin = Plugin {
        shared: shared.clone(),
        configured: std::sync::Mutex::new(Some(configured_tx)),
        runtime: std::sync::Mutex::new(String::new()),
        answer_within: std::sync::Mutex::new(ANSWER_WITHIN),
        hook_path: hook_path(),
        images: Arc::new(image::Images::new(cfg)),
        claims: claims::path_beside(&shared.snapshot_path),
    };
    let service = proto::nri_ttrpc::create_plugin(Arc::new(plugin));
    let mut server = ttrpc::r#async::Server::new()
        .register_service(service)
        .add_listener(one_connection(m.plugin));
    server.start().await.map_err(SessionError::Serve)?;
    let client = proto::nri_ttrpc::RuntimeClient::new(ttrpc::r#async::Client::new(
        ttrpc::r#async::transport::Socket::new(m.runtime),
    ));
    let mut req = RegisterPluginRequest::new();
    req.plugin_name = PLUGIN_NAME.to_owned();
    req.plugin_idx.clone_from(&cfg.index);
    let registered = tokio::time::timeout(
        CONFIGURE_WITHIN,
        client.register_plugin(ttrpc::context::with_duration(CONFIGURE_WITHIN), &req),
    )
    .await;
    match registered {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            let _ = server.shutdown().await;
            return Err(SessionError::Refused { socket, error });
        }
        Err(_) => {
            let _ = server.shutdown().await;
            return Err(SessionError::NoAnswer(socket));
        }
    }
    let runtime = match tokio::time::timeout(CONFIGURE_WITHIN, configured).await {
        Ok(Ok(r)) => r,
        _ => {
            let _ = server.shutdown().await;
            return Err(SessionError::NotConfigured(socket));
        }
    };
    info!(
        "NRI: registered with {runtime} at {} as plugin {}-{PLUGIN_NAME}",
        cfg.socket.display(),
        cfg.index
    );
    shared.set_nri_state(format!(
        "registered with {runtime} at {} as plugin {}-{PLUGIN_NAME} since {}",
        cfg.socket.display(),
        cfg.index,
        gpuarch_inventory::now_rfc3339()
    ));
    let why = loop {
        tokio::select! {
            r = &mut m.done => break match r {
                Ok(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => "the runtime closed it".to_owned(),
                Ok(e) => e.to_string(),
                Err(e) => e.to_string(),
            },
            _ = stop.changed() => {
                if *stop.borrow() {
                    break "gpuarchd is stopping".to_owned();
                }
            }
            _ = tokio::time::sleep(RETRY) => {
                let now = shared.config().nri.clone();
                if now != *cfg {
                    break "the nri config changed".to_owned();
                }
            }
        }
    };
    m.done.abort();
    let _ = server.shutdown().await;
    drop(client);
    Ok(why)
}

/// A ttrpc listener that accepts `stream`, one multiplexed connection, and
/// then nothing: a listener that ended would end ttrpc's accept task, and
/// the server's shutdown then panics on the channel to it.
fn one_connection(stream: tokio::io::DuplexStream) -> ttrpc::r#async::transport::Listener {
    let mut one = Some(stream);
    ttrpc::r#async::transport::Listener::new(futures_util::stream::poll_fn(move |_| {
        match one.take() {
            Some(s) => std::task::Poll::Ready(Some(Ok::<_, std::io::Error>(s))),
            None => std::task::Poll::Pending,
        }
    }))
}

/// The `gpuarch-hook` beside gpuarchd, for the `createContainer` entry.
fn hook_path() -> Option<PathBuf> {
    let hook = std::env::current_exe().ok()?.parent()?.join("gpuarch-hook");
    hook.is_file().then_some(hook)
}

/// The plugin's side of NRI.
struct Plugin {
    shared: Arc<Shared>,
    /// Told the runtime's name and version when it calls Configure.
    configured: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<String>>>,
    /// The runtime's name, as Configure gave it.
    runtime: std::sync::Mutex<String>,
    /// The watchdog's limit, from the runtime's wait ([`answer_within`]).
    answer_within: std::sync::Mutex<Duration>,
    hook_path: Option<PathBuf>,
    /// Where the containers' images are read from.
    images: Arc<image::Images>,
    /// The claims file ([`claims`]).
    claims: PathBuf,
}

#[async_trait::async_trait]
impl proto::nri_ttrpc::Plugin for Plugin {
    async fn configure(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: ConfigureRequest,
    ) -> ttrpc::Result<ConfigureResponse> {
        let runtime = format!("{} {}", req.runtime_name, req.runtime_version);
        req.runtime_name
            .clone_into(&mut self.runtime.lock().unwrap_or_else(|p| p.into_inner()));
        *self.answer_within.lock().unwrap_or_else(|p| p.into_inner()) =
            answer_within(req.request_timeout);
        if let Some(tx) = self
            .configured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = tx.send(runtime.trim().to_owned());
        }
        let mut resp = ConfigureResponse::new();
        resp.events = 1 << (CREATE_CONTAINER - 1);
        Ok(resp)
    }

    async fn synchronize(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: SynchronizeRequest,
    ) -> ttrpc::Result<SynchronizeResponse> {
        // Running containers keep what they started with.
        let mut resp = SynchronizeResponse::new();
        resp.more = req.more;
        Ok(resp)
    }

    async fn shutdown(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        _req: Empty,
    ) -> ttrpc::Result<Empty> {
        info!("NRI: the runtime is shutting down");
        Ok(Empty::new())
    }

    async fn create_container(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: CreateContainerRequest,
    ) -> ttrpc::Result<CreateContainerResponse> {
        let t = Instant::now();
        let mut resp = CreateContainerResponse::new();
        let Some(snapshot) = self.shared.snapshot() else {
            debug!(
                "NRI: no inventory yet; container {} starts unchanged",
                req.container.id
            );
            return Ok(resp);
        };
        let config = (*self.shared.config()).clone();
        let record_dir = config.hook.record_dir.clone();
        let strict = config.strict;
        let mut ctx = Context::new((*snapshot).clone(), config, self.hook_path.clone());
        ctx.env_files = false;
        let pod = req.pod.as_ref().cloned().unwrap_or_default();
        let container = req.container.as_ref().cloned().unwrap_or_default();
        let who = who(&pod, &container);
        // Whether the runtime injected CDI devices before NRI, or lists them.
        debug!(
            "NRI: {who}: {} device nodes, CDI devices [{}], {} annotations, user {}",
            container.linux.devices.len(),
            container
                .CDI_devices
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            container.annotations.len(),
            container
                .user
                .as_ref()
                .map_or("not given".to_owned(), |u| format!("{}:{}", u.uid, u.gid))
        );
        // The image is read (containerd asked, the layers read) only for a
        // container that gets a Plan, on a thread of its own: the read may
        // take its whole bound.
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let images = self.images.clone();
        let handle = tokio::runtime::Handle::current();
        // The plan's own bounds keep it well under the limit; the
        // watchdog answers where something unforeseen does not (the plan
        // then finishes on its thread, unused).
        let limit = *self.answer_within.lock().unwrap_or_else(|p| p.into_inner());
        // A wait for the image's audit (audit.wait_ms) takes at most half
        // of the answer's time: past it the pod would start unplanned.
        let half = u64::try_from(limit.as_millis() / 2).unwrap_or(u64::MAX);
        ctx.config.audit.wait_ms = ctx.config.audit.wait_ms.min(half);
        let planned = tokio::time::timeout(
            limit,
            tokio::task::spawn_blocking(move || {
                let cache = ctx.config.hook.image_cache.clone();
                let id = container.id.clone();
                let read = |view: &gpuarch_core::oci::ContainerView| {
                    let dirs = handle.block_on(images.layers_under(&runtime, &id));
                    let (software, notes) =
                        images.read(&dirs, view, cache.is_dir().then_some(cache.as_path()));
                    // The image's audit reads the same layers.
                    let source = dirs.ok().map(gpuarch_container::audit::Source::Layers);
                    gpuarch_container::edit::Read {
                        software,
                        notes,
                        source,
                    }
                };
                let outcome = adjust(&pod, &container, &ctx, Image::Read(&read));
                (outcome, container)
            }),
        )
        .await;
        let (outcome, container) = match planned {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                warn!("NRI: {who}: planning failed ({e}); it starts unchanged");
                return Ok(resp);
            }
            Err(_) => return unplanned(&who, &StartError::Late(limit), strict).map(|()| resp),
        };
        match outcome {
            Ok(Outcome::Adjust(adj, mut plan)) => {
                // While another gpuarchd may be registered (a handover),
                // the first to claim the container plans it.
                if self.shared.claiming() {
                    match claims::claim(&self.claims, &container.id) {
                        Ok(true) => {}
                        Ok(false) => {
                            debug!("NRI: {who}: planned by the other gpuarchd (a handover)");
                            return Ok(resp);
                        }
                        Err(e) => warn!(
                            "NRI: {who}: cannot claim it in {} ({e}); planning it all the same",
                            self.claims.display()
                        ),
                    }
                }
                plan.container.id = Some(container.id.clone());
                info!(
                    "NRI: {who}: {} ({} µs)",
                    plan.env
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    t.elapsed().as_micros()
                );
                for n in &plan.notes {
                    info!("NRI: {who}: {n}");
                }
                keep_record(&record_dir, &container.id, &plan);
                self.shared.nri_planned(&who);
                resp.adjust = protobuf::MessageField::some(*adj);
            }
            Ok(Outcome::Nothing(plan)) => {
                if plan.source.is_some() || !plan.blocking.is_empty() {
                    keep_record(&record_dir, &container.id, &plan);
                }
                debug!("NRI: {who}: nothing to change");
            }
            Ok(Outcome::Skipped(handler)) => {
                debug!("NRI: {who}: runtime handler {handler} plans it itself");
            }
            Err(e) => unplanned(&who, &StartError::from(e), strict)?,
        }
        Ok(resp)
    }
}

/// A start that `e` kept from being planned: by the runner's policy
/// ([`run::verdict`]), it goes on unchanged (`Ok`) or is refused with
/// gpuarch's reason, as kubelet shows it; said in the log either way.
fn unplanned(who: &str, e: &StartError, strict: bool) -> ttrpc::Result<()> {
    let why = match run::verdict(e, strict) {
        Verdict::Unchanged => {
            warn!("NRI: {who}: cannot plan: {e}; it starts unchanged");
            return Ok(());
        }
        Verdict::Strict => "strict: ",
        Verdict::Refused => "",
    };
    warn!("NRI: {who}: {why}refusing the start: {e}");
    Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
        ttrpc::Code::FAILED_PRECONDITION,
        format!("gpuarch: {e}"),
    )))
}

/// How a container is named in gpuarchd's lines.
fn who(pod: &proto::nri::PodSandbox, c: &proto::nri::Container) -> String {
    let id: String = c.id.chars().take(12).collect();
    let name = gpuarch_core::text::clean(&c.name);
    let pod = format!("{}/{}", pod.namespace, pod.name);
    format!(
        "container={id} name={name} pod={}",
        gpuarch_core::text::clean(&pod)
    )
}

/// Keep the container's Plan for `gpuarchctl why`, where the directory
/// exists.
fn keep_record(dir: &std::path::Path, id: &str, plan: &gpuarch_core::plan::Plan) {
    use gpuarch_core::record;
    if id.is_empty() || !dir.is_dir() {
        return;
    }
    if let Err(e) = gpuarch_fs::record::keep(dir, &record::Record::new(id, "nri", plan), false) {
        warn!(
            "{}: {e}; gpuarchctl why will not know this container",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests;
