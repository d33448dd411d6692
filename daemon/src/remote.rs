//! gpuarchctl's commands answered by gpuarchd over D-Bus.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use gpuarch_core::snapshot::{self, Snapshot};
use serde_json::json;
use zbus::Connection;

use crate::client::{DaemonProxy, InventoryProxy, device_from};
use crate::ctl::{
    Cli, Cmd, devices, humantime_age, render_env_notes, render_match, short_duration,
};
use crate::service::{BUS_NAME, age};

const NOT_RUNNING: &str = "gpuarchd is not running";
/// How long gpuarchctl waits for the daemon (Reload waits for NVML, whose
/// own budget is at most this long by default).
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);
const HINT: &str = "use --offline to read NVML or the snapshot directly";

/// A D-Bus failure as one line a person can act on.
fn explain(what: &str, e: zbus::Error) -> anyhow::Error {
    let (name, msg) = match &e {
        zbus::Error::MethodError(name, msg, _) => {
            (name.as_str().to_owned(), msg.clone().unwrap_or_default())
        }
        zbus::Error::FDO(f) => {
            let name = zbus::DBusError::name(f.as_ref()).as_str().to_owned();
            let msg = zbus::DBusError::description(f.as_ref())
                .unwrap_or_default()
                .to_owned();
            (name, msg)
        }
        _ => return anyhow!("{what}: {e}"),
    };
    match name.as_str() {
        "org.freedesktop.DBus.Error.ServiceUnknown"
        | "org.freedesktop.DBus.Error.NameHasNoOwner" => {
            anyhow!("{NOT_RUNNING} (nothing owns {BUS_NAME} on the system bus); {HINT}")
        }
        "org.freedesktop.DBus.Error.AccessDenied" if msg.starts_with("Rejected send message") => {
            anyhow!(
                "{what}: permission denied by the bus policy (io.gpuarch1.conf: root and group gpuarch only)"
            )
        }
        "org.freedesktop.DBus.Error.AccessDenied" => anyhow!("{what}: permission denied: {msg}"),
        _ => anyhow!("{what}: {msg}"),
    }
}

/// Run a daemon command; the exit status.
pub fn run(cli: &Cli, out: &mut String) -> Result<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let work = async {
        let conn = Connection::system().await.map_err(|e| {
            anyhow!("{NOT_RUNNING} here: cannot reach the system bus ({e}); {HINT}")
        })?;
        let inv = InventoryProxy::new(&conn)
            .await
            .map_err(|e| explain("connecting", e))?;
        match &cli.cmd {
            Cmd::Devices => {
                let snap = snapshot_of(&inv).await?;
                Ok(devices(cli, &snap, &format!("gpuarchd ({BUS_NAME})"), out))
            }
            Cmd::Match { requirement } => {
                let uuids = inv
                    .match_devices(requirement)
                    .await
                    .map_err(|e| explain("match", e))?;
                render_match(cli, requirement, &uuids, out)
            }
            Cmd::Plan(args) => {
                let list = args.devices.as_deref().unwrap_or_default();
                let entries: Vec<&str> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                let (env, notes) = inv.plan(&entries).await.map_err(|e| explain("plan", e))?;
                if cli.json {
                    let doc = json!({"env": env, "notes": notes});
                    let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
                } else {
                    render_env_notes(
                        env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                        &notes,
                        out,
                    );
                }
                Ok(0)
            }
            Cmd::Reload => {
                DaemonProxy::new(&conn)
                    .await
                    .map_err(|e| explain("reload", e))?
                    .reload()
                    .await
                    .map_err(|e| explain("reload", e))?;
                if !cli.json {
                    out.push_str("reloaded\n");
                }
                Ok(0)
            }
            Cmd::Status => status(cli, &conn, &inv, out).await,
            Cmd::Arch(_) => Err(anyhow!("arch commands do not ask the daemon")),
        }
    };
    rt.block_on(async {
        tokio::time::timeout(PATIENCE, work).await.unwrap_or_else(|_| {
            Err(anyhow!(
                "gpuarchd did not answer within {} s (is it hung? see journalctl -u gpuarchd); {HINT}",
                PATIENCE.as_secs()
            ))
        })
    })
}

async fn snapshot_of(inv: &InventoryProxy<'_>) -> Result<Snapshot> {
    let list = inv
        .list_devices()
        .await
        .map_err(|e| explain("devices", e))?;
    let devices = list
        .into_iter()
        .map(device_from)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("gpuarchd answered oddly: {e}"))?;
    let prop = |e| explain("devices", e);
    Ok(Snapshot {
        schema: snapshot::SCHEMA,
        source: "nvml".to_owned(),
        generated_at: inv.generated_at().await.map_err(prop)?,
        driver_version: inv.driver_version().await.map_err(prop)?,
        cuda_driver_version: inv.cuda_driver_version().await.map_err(prop)?,
        stale: inv.stale().await.map_err(prop)?,
        devices,
    })
}

async fn status(
    cli: &Cli,
    conn: &Connection,
    inv: &InventoryProxy<'_>,
    out: &mut String,
) -> Result<u8> {
    let e = |e| explain("status", e);
    let daemon = DaemonProxy::new(conn).await.map_err(e)?;
    let version = daemon.version().await.map_err(e)?;
    let uptime = age(daemon.started_at().await.map_err(e)?);
    let caps = inv.compute_capabilities().await.map_err(e)?;
    let generated_at = inv.generated_at().await.map_err(e)?;
    let refreshed = age(inv.last_refresh().await.map_err(e)?);
    let stale = inv.stale().await.map_err(e)?;
    let last_error = inv.last_error().await.map_err(e)?;
    let driver = inv.driver_version().await.map_err(e)?;
    let cuda = inv.cuda_driver_version().await.map_err(e)?;
    let inventory_age = humantime_age(&generated_at);
    if cli.json {
        let doc = json!({
            "daemon": {"version": version, "uptime_s": uptime.map(|d| d.as_secs())},
            "inventory": {
                "devices": caps.len(),
                "compute_capabilities": caps,
                "driver_version": driver,
                "cuda_driver_version": cuda,
                "generated_at": generated_at,
                "age_s": inventory_age.map(|a| a.as_secs()),
                "last_refresh_age_s": refreshed.map(|a| a.as_secs()),
                "stale": stale,
                "last_error": (!last_error.is_empty()).then_some(&last_error),
            }
        });
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    let ago = |d: Option<std::time::Duration>| {
        d.map_or_else(
            || "never".to_owned(),
            |d| format!("{} ago", short_duration(d)),
        )
    };
    let _ = writeln!(
        out,
        "gpuarchd {version}: running, up {}",
        uptime.map_or_else(|| "?".to_owned(), short_duration)
    );
    if generated_at.is_empty() {
        let _ = writeln!(out, "inventory: none yet: {last_error}");
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "inventory: {} GPU(s) ({}), driver {driver}, CUDA {cuda}",
        caps.len(),
        if caps.is_empty() {
            "none".to_owned()
        } else {
            caps.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "read: {generated_at} ({}); NVML last answered {}",
        ago(inventory_age),
        ago(refreshed)
    );
    if stale {
        let _ = writeln!(
            out,
            "STALE: the last refresh failed ({last_error}); serving the last good inventory"
        );
    }
    Ok(0)
}
