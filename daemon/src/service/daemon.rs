//! `io.gpuarch1.Daemon`: the daemon itself (its state, and `Reload`).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use zbus::message::Header;
use zbus::{Connection, fdo, interface};

use super::{Request, authorize, usec};
use crate::state::Shared;

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

    /// The NRI plugin: "off (nri.enable)", "registered with RUNTIME at
    /// SOCKET as plugin IDX-gpuarch since T", or "not registered: WHY".
    /// Read it fresh: no change signal.
    #[zbus(property(emits_changed_signal = "false"))]
    fn nri_state(&self) -> String {
        self.shared.nri().state
    }

    /// Containers the NRI plugin gave a Plan since gpuarchd started.
    #[zbus(property(emits_changed_signal = "false"))]
    fn nri_planned(&self) -> u64 {
        self.shared.nri().planned
    }

    /// The last of them, "NAMESPACE/POD CONTAINER at T", or "".
    #[zbus(property(emits_changed_signal = "false"))]
    fn nri_last(&self) -> String {
        self.shared.nri().last
    }

    /// When gpuarchd started, in microseconds since the epoch.
    #[zbus(property(emits_changed_signal = "const"))]
    fn started_at(&self) -> u64 {
        usec(Some(self.shared.started))
    }
}
