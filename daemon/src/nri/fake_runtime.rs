//! The runtime's side of NRI, played as containerd plays it, for gpuarchd's
//! tests and its benchmark: listen on a socket, take a plugin's
//! registration, configure it, synchronize it, then call it.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::oneshot;

use super::mux;
use super::proto::nri::{
    ConfigureRequest, Container, CreateContainerRequest, Empty, PodSandbox, RegisterPluginRequest,
    SynchronizeRequest,
};
use super::proto::nri_ttrpc::{PluginClient, Runtime, create_runtime};

/// A runtime's NRI socket.
#[derive(Debug)]
pub struct FakeRuntime {
    listener: UnixListener,
    name: String,
    /// What Configure says of the runtime's wait for a plugin (NRI's 2 s).
    request_timeout: Duration,
}

/// A plugin that registered and was configured.
#[allow(missing_debug_implementations)] // ttrpc's client and server have none
pub struct Plugin {
    /// Calls the plugin.
    pub client: PluginClient,
    /// What the plugin registered as.
    pub registered: RegisterPluginRequest,
    /// The events it subscribed to.
    pub events: i32,
    _server: ttrpc::r#async::Server,
    /// The connection's tasks: dropped with the plugin, they close the
    /// connection, as a runtime going away does.
    _tasks: mux::Tasks,
}

struct Registrar(Mutex<Option<oneshot::Sender<RegisterPluginRequest>>>);

#[async_trait::async_trait]
impl Runtime for Registrar {
    async fn register_plugin(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: RegisterPluginRequest,
    ) -> ttrpc::Result<Empty> {
        if let Some(tx) = self.0.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(req);
        }
        Ok(Empty::new())
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("no {what} within 5 s"))
}

fn rpc(e: ttrpc::Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl FakeRuntime {
    pub fn bind(path: &Path) -> io::Result<Self> {
        Self::bind_as(path, "fake-runtime")
    }

    /// A runtime that calls itself `name` in Configure (`containerd`: the
    /// plugin then asks containerd for the images).
    pub fn bind_as(path: &Path, name: &str) -> io::Result<Self> {
        Ok(Self {
            listener: UnixListener::bind(path)?,
            name: name.to_owned(),
            request_timeout: Duration::from_secs(2),
        })
    }

    /// This runtime waiting `t` for a plugin's answer (containerd's
    /// `plugin_request_timeout`), as Configure tells the plugin.
    pub fn waiting(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// The next plugin to connect, registered, configured and synchronized.
    pub async fn accept(&self) -> io::Result<Plugin> {
        let wait = Duration::from_secs(5);
        let (stream, _) = tokio::time::timeout(wait, self.listener.accept())
            .await
            .map_err(|_| timed_out("plugin connection"))??;
        let m = mux::split(stream);
        let (tx, rx) = oneshot::channel();
        let service = create_runtime(Arc::new(Registrar(Mutex::new(Some(tx)))));
        let mut server = ttrpc::r#async::Server::new()
            .register_service(service)
            .add_listener(super::one_connection(m.runtime));
        server.start().await.map_err(rpc)?;
        let client = PluginClient::new(ttrpc::r#async::Client::new(
            ttrpc::r#async::transport::Socket::new(m.plugin),
        ));
        let registered = tokio::time::timeout(wait, rx)
            .await
            .map_err(|_| timed_out("registration"))?
            .map_err(|_| timed_out("registration"))?;
        let mut cfg = ConfigureRequest::new();
        cfg.runtime_name.clone_from(&self.name);
        cfg.runtime_version = "1.0".to_owned();
        cfg.request_timeout = i64::try_from(self.request_timeout.as_millis()).unwrap_or(i64::MAX);
        let ctx = || ttrpc::context::with_duration(wait);
        let events = client.configure(ctx(), &cfg).await.map_err(rpc)?.events;
        client
            .synchronize(ctx(), &SynchronizeRequest::new())
            .await
            .map_err(rpc)?;
        Ok(Plugin {
            client,
            registered,
            events,
            _server: server,
            _tasks: m.tasks,
        })
    }
}

impl Plugin {
    /// CreateContainer for `container` of `pod`, with NRI's 2 s timeout.
    pub async fn create(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> ttrpc::Result<super::proto::nri::CreateContainerResponse> {
        let mut req = CreateContainerRequest::new();
        req.pod = protobuf::MessageField::some(pod.clone());
        req.container = protobuf::MessageField::some(container.clone());
        self.client
            .create_container(ttrpc::context::with_duration(Duration::from_secs(2)), &req)
            .await
    }

    /// An empty Synchronize: a round trip that plans nothing.
    pub async fn sync(&self) -> ttrpc::Result<()> {
        self.client
            .synchronize(
                ttrpc::context::with_duration(Duration::from_secs(2)),
                &SynchronizeRequest::new(),
            )
            .await
            .map(drop)
    }
}

/// A pod and its container as CRI creates them: `env`, and `devices`
/// (path, major, minor).
pub fn container(env: &[&str], devices: &[(&str, i64, i64)]) -> (PodSandbox, Container) {
    let mut pod = PodSandbox::new();
    pod.id = "pod0".to_owned();
    pod.name = "trainer".to_owned();
    pod.namespace = "ml".to_owned();
    let mut c = Container::new();
    c.id = "0123456789abcdef".repeat(4);
    c.name = "main".to_owned();
    c.env = env.iter().map(|s| (*s).to_owned()).collect();
    let mut linux = super::proto::nri::LinuxContainer::new();
    linux.devices = devices
        .iter()
        .map(|(path, major, minor)| {
            let mut d = super::proto::nri::LinuxDevice::new();
            d.path = (*path).to_owned();
            d.type_ = "c".to_owned();
            d.major = *major;
            d.minor = *minor;
            d
        })
        .collect();
    c.linux = protobuf::MessageField::some(linux);
    (pod, c)
}
