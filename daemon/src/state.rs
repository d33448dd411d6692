//! What the daemon knows: the last good inventory, whether it is stale, and
//! the config in force. Plain data behind short locks; the D-Bus methods read
//! it, the refresher and the config watcher write it. Every write returns
//! what changed, so signals go out only on real change.

use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use gpuarch_core::config::Config;
use gpuarch_core::snapshot::Snapshot;

/// A config file that could not be put in force; the one in force stays.
/// Shared (`Arc`) because one failed reload answers every caller waiting.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}; the previous config stays in force")]
pub struct ConfigRejected(pub Arc<gpuarch_fs::config::ConfigFileError>);

/// Why NVML gave no inventory this time. Clone, and the NVML error shared,
/// because one read answers every Reload waiting on it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RefreshError {
    #[error("the previous NVML read has still not returned")]
    StillHung,
    #[error(transparent)]
    Nvml(Arc<gpuarch_inventory::InventoryError>),
    /// The blocking read panicked or was cancelled.
    #[error("the NVML read failed: {0}")]
    Died(String),
    #[error("NVML did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
}

/// What a `Reload` answers when it did not all work.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(ConfigRejected),
    #[error(transparent)]
    Refresh(RefreshError),
    #[error("{0}; and {1}")]
    Both(ConfigRejected, RefreshError),
}

/// The inventory as the daemon serves it.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    /// The last inventory read successfully (or adopted from an earlier
    /// snapshot at start), with `stale` set when the last refresh failed.
    /// `None` until NVML has answered once.
    pub snapshot: Option<Arc<Snapshot>>,
    /// Why the last refresh failed; `None` after a success.
    pub last_error: Option<String>,
    /// When NVML last answered (the content may be older: `generated_at`
    /// says when it last changed).
    pub last_success: Option<SystemTime>,
}

/// What one update changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// The devices (identity, capability, memory, MIG layout) changed.
    pub devices: bool,
    /// The driver or its CUDA version changed.
    pub driver: bool,
    /// Staleness flipped.
    pub stale: bool,
}

impl Change {
    /// Anything a snapshot reader would see.
    pub fn any(self) -> bool {
        self.devices || self.driver || self.stale
    }
}

/// The NRI plugin as an admin sees it (`gpuarchctl status`, doctor).
#[derive(Debug, Clone, Default)]
pub struct NriStatus {
    /// "off (nri.enable)", "registered with RUNTIME at SOCKET since T",
    /// or "not registered: WHY".
    pub state: String,
    /// Containers given a Plan since gpuarchd started.
    pub planned: u64,
    /// The last of them ("ns/pod container at T"), or "".
    pub last: String,
}

/// Everything shared between the tasks of the daemon.
#[derive(Debug)]
pub struct Shared {
    /// What the NRI plugin is doing, for `status` and doctor.
    nri: RwLock<NriStatus>,
    inventory: RwLock<Inventory>,
    config: RwLock<Arc<Config>>,
    pub started: SystemTime,
    pub snapshot_path: PathBuf,
    /// The config file and whether it must exist (named explicitly).
    pub config_path: PathBuf,
    pub config_must_exist: bool,
    /// The NVML library gpuarchd loads, as named (`--nvml-lib`,
    /// `GPUARCH_NVML_LIB`, else the driver's soname), for `doctor`.
    pub nvml_library: String,
    /// The system bus connections serving gpuarchd's objects: the one
    /// owning `io.gpuarch1` first, then the admins' (`io.gpuarch1.Admin`)
    /// where it could be made; empty while the bus is down. Replaced when
    /// gpuarchd reconnects after a dbus-daemon restart.
    bus: RwLock<Vec<zbus::Connection>>,
    /// While two gpuarchds may both be registered with NRI (a handover,
    /// [`crate::handover`]): each adjustment is claimed first
    /// ([`crate::nri::claims`]).
    claiming: std::sync::atomic::AtomicBool,
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(
        config: Config,
        snapshot_path: PathBuf,
        config_path: PathBuf,
        config_must_exist: bool,
    ) -> Self {
        Self {
            inventory: RwLock::new(Inventory::default()),
            config: RwLock::new(Arc::new(config)),
            started: SystemTime::now(),
            snapshot_path,
            config_path,
            config_must_exist,
            nvml_library: gpuarch_inventory::DEFAULT_NVML_LIB.to_owned(),
            bus: RwLock::new(Vec::new()),
            nri: RwLock::new(NriStatus::default()),
            claiming: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// What the NRI plugin is doing now.
    pub fn nri(&self) -> NriStatus {
        read(&self.nri).clone()
    }

    /// Whether NRI adjustments are claimed first (a handover is under way).
    pub fn claiming(&self) -> bool {
        self.claiming.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn set_claiming(&self, on: bool) {
        self.claiming.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// The NRI plugin's state changed ([`NriStatus::state`]).
    pub fn set_nri_state(&self, state: String) {
        write(&self.nri).state = state;
    }

    /// The NRI plugin planned container `who`.
    pub fn nri_planned(&self, who: &str) {
        let mut n = write(&self.nri);
        n.planned += 1;
        n.last = format!("{who} at {}", gpuarch_inventory::now_rfc3339());
    }

    /// Every serving connection, if gpuarchd is on the bus now: a job or
    /// a signal is served on each, so that a client sees it on the name it
    /// called.
    pub fn buses(&self) -> Vec<zbus::Connection> {
        read(&self.bus).clone()
    }

    pub fn set_buses(&self, conns: Vec<zbus::Connection>) {
        *write(&self.bus) = conns;
    }

    pub fn inventory(&self) -> Inventory {
        read(&self.inventory).clone()
    }

    /// The snapshot being served, if any.
    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        read(&self.inventory).snapshot.clone()
    }

    pub fn config(&self) -> Arc<Config> {
        read(&self.config).clone()
    }

    /// Put a new config in force; true if it differs from the old one.
    pub fn set_config(&self, cfg: Config) -> bool {
        let mut c = write(&self.config);
        if **c == cfg {
            return false;
        }
        *c = Arc::new(cfg);
        true
    }

    /// Publish the config in force beside the snapshot, for the hook and
    /// the shim to plan with while the file is invalid
    /// ([`gpuarch_fs::config::read_config_or_last_good`]).
    pub fn publish_config(&self) {
        let cfg = self.config();
        if let Err(e) =
            gpuarch_fs::config::publish_last_good(&self.snapshot_path, &cfg, &self.config_path)
        {
            tracing::warn!(
                "cannot publish the config in force at {}: {e}; while {} is invalid, new \
                 containers are not planned",
                gpuarch_fs::config::last_good_path(&self.snapshot_path).display(),
                self.config_path.display()
            );
        }
    }

    /// Re-read the config file; put it in force if valid. Ok(true) when it
    /// changed. An invalid file is logged with its line and reason, and the
    /// config in force stays. (Here, not in the crate root, so that the
    /// refresher and the watcher need nothing of the root that runs them.)
    pub fn reload_config(&self) -> Result<bool, ConfigRejected> {
        match gpuarch_fs::config::read_config_at(&self.config_path, self.config_must_exist) {
            Ok(cfg) => {
                let changed = self.set_config(cfg);
                if changed {
                    tracing::info!("config {} reloaded", self.config_path.display());
                    self.publish_config();
                }
                Ok(changed)
            }
            Err(e) => {
                let e = ConfigRejected(Arc::new(e));
                tracing::error!("{e}");
                Err(e)
            }
        }
    }

    /// NVML answered with `snap`. Returns what changed; the snapshot keeps its
    /// old `generated_at` when nothing did, so the file's time says when the
    /// content was first seen.
    pub fn refreshed(&self, snap: Snapshot) -> Change {
        let mut inv = write(&self.inventory);
        inv.last_error = None;
        inv.last_success = Some(SystemTime::now());
        let change = match &inv.snapshot {
            None => Change {
                devices: true,
                driver: true,
                stale: false,
            },
            Some(old) => Change {
                devices: old.devices != snap.devices,
                driver: old.driver_version != snap.driver_version
                    || old.cuda_driver_version != snap.cuda_driver_version,
                stale: old.stale,
            },
        };
        if change.any() {
            inv.snapshot = Some(Arc::new(snap));
        }
        change
    }

    /// A refresh failed: keep the last good inventory, marked stale.
    pub fn failed(&self, reason: String) -> Change {
        let mut inv = write(&self.inventory);
        inv.last_error = Some(reason);
        match &mut inv.snapshot {
            Some(s) if !s.stale => {
                Arc::make_mut(s).stale = true;
                Change {
                    stale: true,
                    ..Change::default()
                }
            }
            _ => Change::default(),
        }
    }

    /// Serve `snap` (a snapshot left by an earlier run, read at start when
    /// NVML does not answer) as the last good inventory; the failure that
    /// follows marks it stale.
    pub fn adopt(&self, snap: Snapshot, reason: String) {
        let mut inv = write(&self.inventory);
        inv.snapshot = Some(Arc::new(snap));
        inv.last_error = Some(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuarch_core::arch::ComputeCapability;
    use gpuarch_core::snapshot::Device;

    fn snap(caps: &[(u8, u8)], at: &str) -> Snapshot {
        Snapshot {
            schema: 1,
            source: "nvml".into(),
            generated_at: at.into(),
            driver_version: "580.95.05".into(),
            cuda_driver_version: "13.0".into(),
            stale: false,
            devices: caps
                .iter()
                .enumerate()
                .map(|(i, (ma, mi))| Device {
                    index: i as u32,
                    minor: i as u32,
                    uuid: format!("GPU-{i}"),
                    name: "gpu".into(),
                    compute_capability: ComputeCapability::new(*ma, *mi),
                    pci_bus_id: format!("00000000:0{i}:00.0"),
                    memory_bytes: 1 << 30,
                    brand: None,
                    mig: vec![],
                })
                .collect(),
        }
    }

    fn shared() -> Shared {
        Shared::new(Config::default(), "/x".into(), "/y".into(), false)
    }

    #[test]
    fn only_real_changes_count() {
        let s = shared();
        assert!(s.refreshed(snap(&[(7, 5), (8, 6)], "t1")).devices);
        // Same devices read later: no change, and the first time is kept.
        assert_eq!(
            s.refreshed(snap(&[(7, 5), (8, 6)], "t2")),
            Change::default()
        );
        assert_eq!(s.snapshot().unwrap().generated_at, "t1");
        let c = s.refreshed(snap(&[(7, 5), (9, 0)], "t3"));
        assert!(c.devices && !c.driver && !c.stale);
        assert_eq!(s.snapshot().unwrap().generated_at, "t3");
    }

    #[test]
    fn failure_keeps_the_last_inventory_marked_stale_once() {
        let s = shared();
        // No inventory yet: nothing to mark.
        assert_eq!(s.failed("no driver".into()), Change::default());
        assert!(s.snapshot().is_none());
        s.refreshed(snap(&[(8, 0)], "t1"));
        let c = s.failed("NVML gone".into());
        assert!(c.stale && !c.devices);
        assert!(s.snapshot().unwrap().stale);
        assert_eq!(s.snapshot().unwrap().devices.len(), 1);
        assert_eq!(s.inventory().last_error.as_deref(), Some("NVML gone"));
        assert_eq!(s.failed("still gone".into()), Change::default());
        // Recovery with the same devices: only staleness changes.
        let c = s.refreshed(snap(&[(8, 0)], "t2"));
        assert_eq!(
            c,
            Change {
                stale: true,
                ..Change::default()
            }
        );
        assert!(!s.snapshot().unwrap().stale);
        assert!(s.inventory().last_error.is_none());
    }

    #[test]
    fn config_changes_are_detected() {
        let s = shared();
        assert!(!s.set_config(Config::default()));
        assert!(s.set_config(Config {
            strict: true,
            ..Config::default()
        }));
        assert!(s.config().strict);
    }
}
