//! The D-Bus service at `/io/gpuarch1`, one file per interface:
//! `io.gpuarch1.Inventory` (`inventory`), `io.gpuarch1.Daemon`
//! (`daemon`), `io.gpuarch1.KernelCache` (`kernel_cache`) and
//! `io.gpuarch1.JitCache` (`jit_cache`). Reads are open to everyone;
//! privileged methods check the caller's credentials as the bus reports
//! them (`auth`), after the bus policy has.
//!
//! A new method goes into its interface's file here, its record types (if
//! any) into `gpuarch-wire`'s `dbus` module, its proxy line there too, and
//! its policy into `packaging/dbus/io.gpuarch1.conf` when it is privileged
//! (docs/CONTRIBUTING.md lists every place).

mod admission;
mod auth;
mod daemon;
mod inventory;
mod jit_cache;
mod kernel_cache;

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

pub use admission::{READS_IN_ALL, READS_PER_SENDER};
pub(crate) use auth::{authorize, open_side_connection};
pub use daemon::Daemon;
pub use gpuarch_wire::dbus::{ADMIN_BUS_NAME, ADMIN_GROUP, BUS_NAME, OBJECT_PATH};
pub use inventory::Inventory;
pub use jit_cache::JitCache;
pub use kernel_cache::{KernelCache, compiler_line};

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
