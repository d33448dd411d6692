//! Where gpuarchctl's answers come from: gpuarchd on the system bus, or,
//! offline, the inventory snapshot or NVML read by gpuarchctl itself.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow};
use gpuarch_core::snapshot::Snapshot;
use gpuarch_wire::dbus::{ADMIN_BUS_NAME, BUS_NAME, InventoryProxy};
use zbus::Connection;

use crate::cli::Cli;

/// How long gpuarchctl waits for the daemon (Reload waits for NVML, whose
/// own budget is at most this long by default).
pub const PATIENCE: Duration = Duration::from_secs(30);
const HINT: &str = "use --offline to read NVML or the snapshot directly";

/// Why gpuarchd did not answer, as a person can act on it.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("gpuarchd is not running here: cannot reach the system bus ({0}); {HINT}")]
    NoBus(zbus::Error),
    #[error("gpuarchd is not running (nothing owns {BUS_NAME} on the system bus); {HINT}")]
    NotRunning,
    #[error(
        "{what}: permission denied by the bus policy (io.gpuarch1.conf: root and group gpuarch only)"
    )]
    Policy { what: &'static str },
    #[error("{what}: permission denied: {message}")]
    Denied { what: &'static str, message: String },
    /// gpuarchd answered with an error of its own.
    #[error("{what}: {message}")]
    Refused {
        what: &'static str,
        name: String,
        message: String,
    },
    #[error(
        "gpuarchd did not answer within {0} s (is it hung? see journalctl -u gpuarchd); {HINT}"
    )]
    Timeout(u64),
    /// An answer that does not make a device.
    #[error("gpuarchd answered oddly: {0}")]
    BadDevice(gpuarch_wire::dbus::BadDevice),
    /// Anything else: a broken connection, an answer of the wrong type.
    #[error("{what}: {error}")]
    Other {
        what: &'static str,
        error: zbus::Error,
    },
}

impl BusError {
    /// Classify a failed call of `what`.
    pub fn of(what: &'static str, e: zbus::Error) -> BusError {
        let (name, message) = match &e {
            zbus::Error::MethodError(name, msg, _) => {
                (name.as_str().to_owned(), msg.clone().unwrap_or_default())
            }
            zbus::Error::FDO(f) => (
                zbus::DBusError::name(f.as_ref()).as_str().to_owned(),
                zbus::DBusError::description(f.as_ref())
                    .unwrap_or_default()
                    .to_owned(),
            ),
            _ => return BusError::Other { what, error: e },
        };
        match name.as_str() {
            "org.freedesktop.DBus.Error.ServiceUnknown"
            | "org.freedesktop.DBus.Error.NameHasNoOwner" => BusError::NotRunning,
            "org.freedesktop.DBus.Error.AccessDenied"
                if message.starts_with("Rejected send message") =>
            {
                BusError::Policy { what }
            }
            "org.freedesktop.DBus.Error.AccessDenied" => BusError::Denied { what, message },
            _ => BusError::Refused {
                what,
                name,
                message,
            },
        }
    }
}

/// A connection to gpuarchd, with the runtime its calls run on.
#[derive(Debug)]
pub struct Daemon {
    rt: tokio::runtime::Runtime,
    pub conn: Connection,
    /// The name called: [`ADMIN_BUS_NAME`] for root and group gpuarch
    /// where gpuarchd serves it (their calls then never wait behind
    /// everyone else's), else [`BUS_NAME`].
    pub dest: &'static str,
}

impl Daemon {
    /// Connect to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` names another).
    pub fn connect() -> Result<Daemon> {
        Self::connect_within(PATIENCE)
    }

    /// [`Daemon::connect`], giving up after `limit`.
    pub fn connect_within(limit: Duration) -> Result<Daemon> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (conn, dest) = rt
            .block_on(async {
                tokio::time::timeout(limit, async {
                    let conn = Connection::system().await?;
                    let dest = destination(&conn).await;
                    Ok::<_, zbus::Error>((conn, dest))
                })
                .await
            })
            .map_err(|_| BusError::Timeout(limit.as_secs()))?
            .map_err(BusError::NoBus)?;
        Ok(Daemon { rt, conn, dest })
    }

    /// A proxy of interface `P` of gpuarchd's object, on [`Daemon::dest`].
    pub async fn proxy<'a, P>(&'a self) -> zbus::Result<P>
    where
        P: zbus::proxy::Defaults + From<zbus::Proxy<'a>>,
    {
        zbus::proxy::Builder::<P>::new(&self.conn)
            .destination(self.dest)
            .build()
            .await
    }

    /// Run `work` against the daemon, giving up after [`PATIENCE`].
    pub fn ask<T>(&self, work: impl Future<Output = Result<T, BusError>>) -> Result<T, BusError> {
        self.ask_within(PATIENCE, work)
    }

    /// Run `work` against the daemon, giving up after `limit`.
    pub fn ask_within<T>(
        &self,
        limit: Duration,
        work: impl Future<Output = Result<T, BusError>>,
    ) -> Result<T, BusError> {
        self.rt.block_on(async {
            tokio::time::timeout(limit, work)
                .await
                .map_err(|_| BusError::Timeout(limit.as_secs()))?
        })
    }

    /// Run `work` for as long as it takes (a pre-warm reports progress).
    pub fn wait<T>(&self, work: impl Future<Output = T>) -> T {
        self.rt.block_on(work)
    }

    /// The inventory as gpuarchd serves it, with what it was read from.
    pub fn inventory(&self) -> Result<Snapshot> {
        self.inventory_within(PATIENCE)
    }

    /// [`Daemon::inventory`], giving up after `limit`.
    pub fn inventory_within(&self, limit: Duration) -> Result<Snapshot> {
        self.ask_within(limit, async {
            let e = |e| BusError::of("devices", e);
            let inv: InventoryProxy = self.proxy().await.map_err(e)?;
            let list = inv.list_devices().await.map_err(e)?;
            Ok(Snapshot {
                schema: gpuarch_core::snapshot::SCHEMA,
                source: inv.source().await.map_err(e)?,
                generated_at: inv.generated_at().await.map_err(e)?,
                driver_version: inv.driver_version().await.map_err(e)?,
                cuda_driver_version: inv.cuda_driver_version().await.map_err(e)?,
                stale: inv.stale().await.map_err(e)?,
                devices: list
                    .into_iter()
                    .map(TryInto::try_into)
                    .collect::<Result<_, _>>()
                    .map_err(BusError::BadDevice)?,
            })
        })
        .map_err(Into::into)
    }
}

/// The name an admin's calls go to: [`ADMIN_BUS_NAME`] when this process
/// is root or in group gpuarch (the bus policy lets no one else call it)
/// and gpuarchd owns it; else [`BUS_NAME`]. Asking the bus costs one round
/// trip to the bus itself, never one queued behind calls to gpuarchd.
async fn destination(conn: &Connection) -> &'static str {
    if !admin_here() {
        return BUS_NAME;
    }
    let owned = async {
        zbus::fdo::DBusProxy::builder(conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?
            .name_has_owner(zbus::names::BusName::try_from(ADMIN_BUS_NAME)?)
            .await
    };
    match owned.await {
        Ok(true) => ADMIN_BUS_NAME,
        _ => BUS_NAME,
    }
}

/// Whether this process is root or in group gpuarch.
fn admin_here() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let Ok(Some(g)) = nix::unistd::Group::from_name(gpuarch_wire::dbus::ADMIN_GROUP) else {
        return false;
    };
    nix::unistd::getegid() == g.gid || nix::unistd::getgroups().is_ok_and(|gs| gs.contains(&g.gid))
}

/// The snapshot or NVML gpuarchctl reads itself.
#[derive(Debug, Clone, Default)]
pub struct Offline {
    pub nvml_lib: Option<PathBuf>,
    pub inventory: Option<PathBuf>,
}

impl Offline {
    pub fn of(cli: &Cli) -> Offline {
        Offline {
            nvml_lib: cli.nvml_lib.clone(),
            inventory: cli.inventory.clone(),
        }
    }

    /// Whether the caller named the source (then its absence is an error
    /// even where a command could answer without one).
    pub fn named(&self) -> bool {
        self.nvml_lib.is_some() || self.inventory.is_some()
    }

    /// The inventory for a command that plans here (plan --config or -e,
    /// inspect): gpuarchd's, when it runs and neither --offline nor a
    /// source (flags, GPUARCH_INVENTORY) was given (its snapshot may be
    /// anywhere its config says);
    /// else as [`Offline::inventory`].
    pub fn inventory_live(&self, offline: bool) -> Result<(Snapshot, String)> {
        const LIVE_PATIENCE: Duration = Duration::from_secs(3);
        if !offline && !self.named() && gpuarch_inventory::inventory_env().is_none() {
            let live = Daemon::connect_within(LIVE_PATIENCE).and_then(|d| {
                let snap = d.inventory_within(LIVE_PATIENCE)?;
                Ok((snap, format!("gpuarchd ({})", d.dest)))
            });
            if let Ok(found) = live {
                return Ok(found);
            }
        }
        self.inventory()
    }

    /// The inventory and a phrase saying where it came from: `--nvml-lib`,
    /// else `--inventory` or `GPUARCH_INVENTORY`, else the snapshot the
    /// config names, else NVML.
    pub fn inventory(&self) -> Result<(Snapshot, String)> {
        // The config names the snapshot; a config that cannot be read leaves
        // the default (its own error is for the commands that use it).
        let configured = gpuarch_fs::config::read_config()
            .map(|c| c.daemon.snapshot)
            .unwrap_or_else(|_| PathBuf::from(gpuarch_inventory::DEFAULT_SNAPSHOT));
        Ok(gpuarch_inventory::read_inventory(
            self.nvml_lib.as_deref(),
            self.inventory.as_deref(),
            &configured,
        )?)
    }
}

/// The source a command asks.
#[derive(Debug)]
pub enum Source {
    Daemon(Daemon),
    Offline(Offline),
}

impl Source {
    /// gpuarchd, unless `--offline`, `--inventory` or `--nvml-lib`.
    pub fn of(cli: &Cli) -> Result<Source> {
        let offline = Offline::of(cli);
        if cli.offline || offline.named() {
            Ok(Source::Offline(offline))
        } else {
            Ok(Source::Daemon(Daemon::connect()?))
        }
    }

    /// gpuarchd, for a command that only it can answer; `offline` says why
    /// there is no `--offline` form.
    pub fn daemon(cli: &Cli, offline: &str) -> Result<Daemon> {
        if cli.offline || cli.nvml_lib.is_some() || cli.inventory.is_some() {
            return Err(anyhow!("{offline}"));
        }
        Daemon::connect()
    }

    /// The inventory and where it came from, for display.
    pub fn inventory(&self) -> Result<(Snapshot, String)> {
        match self {
            Source::Daemon(d) => Ok((d.inventory()?, format!("gpuarchd ({})", d.dest))),
            Source::Offline(o) => o.inventory(),
        }
    }
}
