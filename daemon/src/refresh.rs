//! The refresher: reads NVML on a timer and on request, keeps the last good
//! inventory when NVML fails, writes the snapshot when what it says changes,
//! and tells the bus.
//!
//! Each read opens NVML, reads it and closes it again, so a driver upgrade,
//! a GPU that fell off the bus or a new MIG layout is seen on the next read,
//! and nothing is held open between reads. A read runs on a blocking thread
//! under `daemon.nvml_timeout_ms`; a read that hangs past it is left to
//! finish on its own and no second one is started until it has.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpuarch_core::snapshot::Snapshot;
use gpuarch_inventory::{GpuInventory, NvmlInventory, read_snapshot, write_snapshot};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::sdnotify;
use crate::service::{self, Request};
use crate::state::{Change, RefreshError, ReloadError, Shared};

type Read = Result<Snapshot, gpuarch_inventory::InventoryError>;

#[derive(Debug)]
pub struct Refresher {
    shared: Arc<Shared>,
    nvml_lib: Option<PathBuf>,
    /// A read that ran past its budget and has not returned yet.
    hung: Option<JoinHandle<Read>>,
    /// The snapshot file is behind the state (its last write failed).
    dirty: bool,
    /// Refreshes that failed in a row, for the backoff.
    failures: u32,
    /// Where the NFD labels were last kept, to remove them if moved.
    nfd_written: Option<PathBuf>,
    /// The last NFD write's error, logged once.
    nfd_error: Option<String>,
}

impl Refresher {
    pub fn new(shared: Arc<Shared>, nvml_lib: Option<PathBuf>) -> Self {
        Self {
            shared,
            nvml_lib,
            hung: None,
            dirty: false,
            failures: 0,
            nfd_written: None,
            nfd_error: None,
        }
    }

    async fn read_nvml(&mut self) -> Result<Snapshot, RefreshError> {
        if let Some(h) = &self.hung {
            if !h.is_finished() {
                return Err(RefreshError::StillHung);
            }
            self.hung = None;
        }
        let budget = Duration::from_millis(self.shared.config().daemon.nvml_timeout_ms);
        let lib = self.nvml_lib.clone();
        let mut task = tokio::task::spawn_blocking(move || {
            NvmlInventory::open(lib.as_deref()).and_then(|n| n.snapshot())
        });
        match tokio::time::timeout(budget, &mut task).await {
            Ok(Ok(read)) => read.map_err(|e| RefreshError::Nvml(Arc::new(e))),
            Ok(Err(join)) => Err(RefreshError::Died(join.to_string())),
            Err(_) => {
                self.hung = Some(task);
                Err(RefreshError::Timeout(budget))
            }
        }
    }

    /// Read NVML once and apply the result. At start (`first`), a failed
    /// read adopts the snapshot an earlier run left, as stale.
    pub async fn refresh(&mut self, first: bool) -> Result<(), RefreshError> {
        let outcome = match self.read_nvml().await {
            Ok(snap) => {
                let n = snap.devices.len();
                let change = self.shared.refreshed(snap);
                if change.devices {
                    info!(devices = n, "GPU inventory read from NVML");
                } else {
                    debug!(devices = n, "GPU inventory unchanged");
                }
                self.failures = 0;
                self.apply(change).await;
                Ok(())
            }
            Err(why) => {
                self.failures = self.failures.saturating_add(1);
                if first && self.shared.snapshot().is_none() {
                    self.adopt_previous(&why.to_string());
                }
                let change = self.shared.failed(why.to_string());
                warn!(
                    "inventory refresh failed: {why}; {}",
                    if self.shared.snapshot().is_some() {
                        "serving the last good inventory, marked stale"
                    } else {
                        "no inventory to serve yet"
                    }
                );
                self.apply(change).await;
                Err(why)
            }
        };
        self.status();
        outcome
    }

    fn adopt_previous(&self, why: &str) {
        let path = &self.shared.snapshot_path;
        match read_snapshot(path) {
            Ok(s) => {
                info!(
                    "NVML did not answer at start; serving the snapshot left at {} (stale)",
                    path.display()
                );
                self.shared.adopt(s, why.to_owned());
            }
            Err(e) => debug!("no earlier snapshot to serve: {e}"),
        }
    }

    async fn apply(&mut self, change: Change) {
        if change.any() || self.dirty || self.file_missing() {
            self.write().await;
        }
        self.export_nfd().await;
        self.announce(change).await;
    }

    /// Keep NFD's feature file (`export.nfd`) equal to the inventory's
    /// labels; take it away when the export is turned off or moved. A
    /// failure is logged once until it changes or clears.
    async fn export_nfd(&mut self) {
        let cfg = self.shared.config().export.clone();
        let text = match (cfg.nfd, self.shared.snapshot()) {
            (true, Some(snap)) => {
                Some(gpuarch_core::nfd::render(&gpuarch_core::nfd::labels(&snap)))
            }
            // No inventory yet: leave whatever is there.
            (true, None) => return,
            (false, _) => None,
        };
        let old = self.nfd_written.clone();
        let path = cfg.nfd_file.clone();
        let r = tokio::task::spawn_blocking(move || {
            crate::nfd::sync(&path, text.as_deref(), old.as_deref())
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match r {
            Ok(done) => {
                for d in done {
                    match d {
                        crate::nfd::Done::Written(p) => {
                            info!("Node Feature Discovery labels written to {}", p.display())
                        }
                        crate::nfd::Done::Removed(p) => {
                            info!("Node Feature Discovery labels removed from {}", p.display())
                        }
                    }
                }
                self.nfd_written = cfg.nfd.then_some(cfg.nfd_file);
                self.nfd_error = None;
            }
            Err(e) => {
                let e = e.to_string();
                if self.nfd_error.as_ref() != Some(&e) {
                    warn!(
                        "cannot keep the Node Feature Discovery labels in {}: {e}; retrying at each refresh",
                        cfg.nfd_file.display()
                    );
                }
                self.nfd_error = Some(e);
            }
        }
    }

    /// Someone removed the snapshot file: put it back.
    fn file_missing(&self) -> bool {
        self.shared.snapshot().is_some() && !self.shared.snapshot_path.exists()
    }

    async fn write(&mut self) {
        let Some(snap) = self.shared.snapshot() else {
            return;
        };
        let path = self.shared.snapshot_path.clone();
        let result = tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            write_snapshot(&path, &snap)
        })
        .await;
        match result {
            Ok(Ok(())) => {
                self.dirty = false;
                debug!(
                    "snapshot written to {}",
                    self.shared.snapshot_path.display()
                );
            }
            Ok(Err(e)) => {
                self.dirty = true;
                error!("{e}; the old snapshot stays in place, retrying at the next refresh");
            }
            Err(e) => {
                self.dirty = true;
                error!("writing the snapshot failed: {e}");
            }
        }
    }

    async fn announce(&self, change: Change) {
        // While the bus is down nobody can hear a signal; a client that
        // reconnects reads the properties afresh.
        if !change.any() {
            return;
        }
        for conn in self.shared.buses() {
            let r: zbus::Result<()> = async {
                let iface = conn
                    .object_server()
                    .interface::<_, service::Inventory>(service::OBJECT_PATH)
                    .await?;
                let em = iface.signal_emitter();
                let i = iface.get().await;
                if change.devices {
                    i.compute_capabilities_changed(em).await?;
                }
                if change.driver {
                    i.driver_version_changed(em).await?;
                    i.cuda_driver_version_changed(em).await?;
                }
                if change.stale {
                    i.stale_changed(em).await?;
                    i.last_error_changed(em).await?;
                }
                if change.devices || change.driver {
                    i.generated_at_changed(em).await?;
                }
                if change.devices {
                    service::Inventory::devices_changed(em).await?;
                }
                Ok(())
            }
            .await;
            if let Err(e) = r {
                warn!("could not signal the change on the bus: {e}");
            }
        }
    }

    /// One `STATUS=` line for systemctl status.
    fn status(&self) {
        let inv = self.shared.inventory();
        let line = match (&inv.snapshot, &inv.last_error) {
            (Some(s), None) => format!("serving {} GPU(s)", s.devices.len()),
            (Some(s), Some(e)) => format!(
                "serving {} GPU(s), STALE: {}",
                s.devices.len(),
                gpuarch_core::text::first_line(e)
            ),
            (None, Some(e)) => format!("no GPU inventory: {}", gpuarch_core::text::first_line(e)),
            (None, None) => "starting".to_owned(),
        };
        let _ = sdnotify::notify(&format!("STATUS={line}"));
    }

    /// The wait before the next refresh: the interval, or after failures
    /// 1 s, 2 s, 4 s, ... up to it.
    pub fn next_delay(&self) -> Duration {
        let interval = Duration::from_secs(self.shared.config().daemon.refresh_interval_s);
        if self.failures == 0 {
            return interval;
        }
        let backoff = Duration::from_secs(1u64 << (self.failures - 1).min(16));
        backoff.min(interval)
    }

    /// Serve requests and the timer until `stop` turns true.
    pub async fn run(
        mut self,
        mut requests: mpsc::Receiver<Request>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut deadline = tokio::time::Instant::now() + self.next_delay();
        loop {
            let mut waiters: Vec<oneshot::Sender<Result<(), ReloadError>>> = Vec::new();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                req = requests.recv() => match req {
                    None => return,
                    Some(Request::ConfigChanged) => {
                        deadline = tokio::time::Instant::now() + self.next_delay();
                        continue;
                    }
                    Some(Request::Reload(tx)) => waiters.push(tx),
                },
                _ = stop.changed() => return,
            }
            // Coalesce Reloads that arrived together into one read.
            let mut config_result = Ok(());
            if !waiters.is_empty() {
                while let Ok(Request::Reload(tx)) = requests.try_recv() {
                    waiters.push(tx);
                }
                config_result = self.shared.reload_config().map(|_| ());
            }
            let result = tokio::select! {
                r = self.refresh(false) => r,
                _ = stop.changed() => return,
            };
            let answer = match (config_result, result) {
                (Ok(()), Ok(())) => Ok(()),
                (Ok(()), Err(r)) => Err(ReloadError::Refresh(r)),
                (Err(c), Ok(())) => Err(ReloadError::Config(c)),
                (Err(c), Err(r)) => Err(ReloadError::Both(c, r)),
            };
            for w in waiters {
                let _ = w.send(answer.clone());
            }
            deadline = tokio::time::Instant::now() + self.next_delay();
        }
    }
}
