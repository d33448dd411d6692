//! gpuarchd as an NRI plugin (`nri:` in the config). It connects to the
//! runtime's NRI socket, registers, subscribes to container creation, and
//! answers each container of a pod with its Plan as an adjustment
//! ([`adjust`]): no runtime handler, and the runtime is not replaced.
//!
//! Fail open: while gpuarchd is down or not registered, the runtime starts
//! pods unchanged. When the runtime goes away (a restart), gpuarchd
//! connects again within [`RETRY`] of its socket being back.

mod adjust;
pub mod mux;

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
mod nri {
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
mod nri_ttrpc {
    include!(concat!(env!("OUT_DIR"), "/nri_ttrpc.rs"));
}

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpuarch_core::config::NriConfig;
use gpuarch_hook::Context;
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub use adjust::{CDI_ANNOTATION, Outcome, adjust};
use nri::{
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
/// How long the runtime has to call Configure after registration.
const CONFIGURE_WITHIN: Duration = Duration::from_secs(5);

/// Keep gpuarchd registered with the runtime while `nri.enable` is set,
/// until `stop`.
pub async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut last_failure: Option<String> = None;
    loop {
        let cfg = shared.config().nri.clone();
        if cfg.enable {
            match session(&shared, &cfg, &mut stop).await {
                Ok(why) => {
                    info!(
                        "NRI: the connection to {} ended ({why}); connecting again",
                        cfg.socket.display()
                    );
                    last_failure = None;
                }
                Err(e) => {
                    // Said once, not every second while the runtime is down.
                    if last_failure.as_deref() != Some(&e) {
                        warn!("NRI: {e}; trying again every {} s", RETRY.as_secs());
                        last_failure = Some(e);
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// One connection: register, then serve until the runtime goes, the
/// config changes what it connects to, or gpuarchd stops. `Ok` is why a
/// session that was up ended; `Err`, why none came up.
async fn session(
    shared: &Arc<Shared>,
    cfg: &NriConfig,
    stop: &mut watch::Receiver<bool>,
) -> Result<String, String> {
    let stream = tokio::net::UnixStream::connect(&cfg.socket)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", cfg.socket.display()))?;
    let mut m = mux::split(stream);
    let (configured_tx, configured) = tokio::sync::oneshot::channel();
    let plugin = Plugin {
        shared: shared.clone(),
        configured: std::sync::Mutex::new(Some(configured_tx)),
        hook_path: hook_path(),
    };
    let service = nri_ttrpc::create_plugin(Arc::new(plugin));
    // The one connection the runtime makes to the plugin's service, then
    // nothing: a listener that ended would end ttrpc's accept task, and its
    // shutdown then panics on the channel to it.
    let mut one = Some(m.plugin);
    let listener =
        ttrpc::r#async::transport::Listener::new(futures_util::stream::poll_fn(move |_| match one
            .take()
        {
            Some(s) => std::task::Poll::Ready(Some(Ok::<_, std::io::Error>(s))),
            None => std::task::Poll::Pending,
        }));
    let mut server = ttrpc::r#async::Server::new()
        .register_service(service)
        .add_listener(listener);
    server
        .start()
        .await
        .map_err(|e| format!("cannot serve the plugin API: {e}"))?;
    let client = nri_ttrpc::RuntimeClient::new(ttrpc::r#async::Client::new(
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
        Ok(Err(e)) => {
            let _ = server.shutdown().await;
            return Err(format!(
                "{} refused the registration: {e}",
                cfg.socket.display()
            ));
        }
        Err(_) => {
            let _ = server.shutdown().await;
            return Err(format!(
                "{} did not answer the registration",
                cfg.socket.display()
            ));
        }
    }
    let runtime = match tokio::time::timeout(CONFIGURE_WITHIN, configured).await {
        Ok(Ok(r)) => r,
        _ => {
            let _ = server.shutdown().await;
            return Err(format!(
                "{} registered gpuarchd but never configured it",
                cfg.socket.display()
            ));
        }
    };
    info!(
        "NRI: registered with {runtime} at {} as plugin {}-{PLUGIN_NAME}",
        cfg.socket.display(),
        cfg.index
    );
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
    hook_path: Option<PathBuf>,
}

#[async_trait::async_trait]
impl nri_ttrpc::Plugin for Plugin {
    async fn configure(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: ConfigureRequest,
    ) -> ttrpc::Result<ConfigureResponse> {
        let runtime = format!("{} {}", req.runtime_name, req.runtime_version);
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
        let mut ctx = Context::new((*snapshot).clone(), config, self.hook_path.clone());
        ctx.env_files = false;
        let pod = req.pod.as_ref().cloned().unwrap_or_default();
        let container = req.container.as_ref().cloned().unwrap_or_default();
        let who = who(&pod, &container);
        match adjust(&pod, &container, &ctx) {
            Ok(Outcome::Adjust(adj, mut plan)) => {
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
            Err(why) => {
                warn!("NRI: {who}: refusing the start: {why}");
                return Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                    ttrpc::Code::FAILED_PRECONDITION,
                    format!("gpuarch: {why}"),
                )));
            }
        }
        Ok(resp)
    }
}

/// How a container is named in gpuarchd's lines.
fn who(pod: &nri::PodSandbox, c: &nri::Container) -> String {
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
    if let Err(e) = record::keep(dir, &record::Record::new(id, "nri", plan), false) {
        warn!(
            "{}: {e}; gpuarchctl why will not know this container",
            dir.display()
        );
    }
}
