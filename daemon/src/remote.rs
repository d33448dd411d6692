//! gpuarchctl's commands answered by gpuarchd over D-Bus.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use gpuarch_core::snapshot::{self, Snapshot};
use serde_json::json;
use zbus::Connection;

use crate::client::{DaemonProxy, InventoryProxy, JobProxy, KernelCacheProxy, device_from};
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
            Cmd::Arch(_) | Cmd::Inspect(_) | Cmd::Doctor(_) | Cmd::Engine(_) => {
                Err(anyhow!("this command does not ask the daemon"))
            }
            Cmd::Prewarm(args) => return prewarm(cli, &conn, args, out).await,
            Cmd::Kernels => kernels(cli, &conn, out).await,
            Cmd::Gc => {
                let freed = KernelCacheProxy::new(&conn)
                    .await
                    .map_err(|e| explain("gc", e))?
                    .garbage_collect()
                    .await
                    .map_err(|e| explain("gc", e))?;
                if cli.json {
                    let _ = writeln!(out, "{}", json!({"freed_bytes": freed}));
                } else {
                    let _ = writeln!(out, "freed {}", bytes(freed));
                }
                Ok(0)
            }
            Cmd::Verify => verify(cli, &conn, out).await,
        }
    };
    if matches!(cli.cmd, Cmd::Prewarm(_)) {
        // Builds take as long as they take; the job reports progress.
        return rt.block_on(work);
    }
    rt.block_on(async { patient(work).await? })
}

/// `f`, or an error once gpuarchd has taken longer than [`PATIENCE`].
async fn patient<T>(f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(PATIENCE, f).await.map_err(|_| {
        anyhow!(
            "gpuarchd did not answer within {} s (is it hung? see journalctl -u gpuarchd); {HINT}",
            PATIENCE.as_secs()
        )
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

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

type Dict = std::collections::HashMap<String, zbus::OwnedVariant>;

fn text(d: &Dict, k: &str) -> String {
    d.get(k)
        .and_then(|v| String::try_from(v.try_clone().ok()?).ok())
        .unwrap_or_default()
}

fn flag(d: &Dict, k: &str) -> bool {
    d.get(k)
        .and_then(|v| bool::try_from(v).ok())
        .unwrap_or(false)
}

fn number(d: &Dict, k: &str) -> u64 {
    d.get(k).and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
}

async fn kernels(cli: &Cli, conn: &Connection, out: &mut String) -> Result<u8> {
    let e = |e| explain("kernels", e);
    let kc = KernelCacheProxy::new(conn).await.map_err(e)?;
    let list = kc.list_kernels().await.map_err(e)?;
    let used = kc.used_bytes().await.map_err(e)?;
    let limit = kc.limit_bytes().await.map_err(e)?;
    if cli.json {
        let rows: Vec<_> = list
            .iter()
            .map(|d| {
                json!({
                    "key": text(d, "key"), "package": text(d, "package"),
                    "version": text(d, "version"), "variant": text(d, "variant"),
                    "dtype": text(d, "dtype"), "arch": text(d, "arch"),
                    "toolkit": text(d, "toolkit"), "bytes": number(d, "bytes"),
                    "pinned": flag(d, "pinned"), "in_use": flag(d, "in_use"),
                    "last_used": number(d, "last_used"), "path": text(d, "path"),
                })
            })
            .collect();
        let doc = json!({"used_bytes": used, "limit_bytes": limit, "kernels": rows});
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "cache: {} of {} used, {} builds",
        bytes(used),
        bytes(limit),
        list.len()
    );
    let _ = writeln!(
        out,
        "{:<10} {:<8} {:<8} {:<9} {:>9}  {:<6} {:<6} KEY",
        "PACKAGE", "ARCH", "VARIANT", "DTYPE", "SIZE", "PINNED", "IN USE"
    );
    let mut rows: Vec<&Dict> = list.iter().collect();
    rows.sort_by_key(|d| (text(d, "package"), text(d, "arch")));
    for d in rows {
        let _ = writeln!(
            out,
            "{:<10} {:<8} {:<8} {:<9} {:>9}  {:<6} {:<6} {}",
            text(d, "package"),
            text(d, "arch"),
            text(d, "variant"),
            text(d, "dtype"),
            bytes(number(d, "bytes")),
            if flag(d, "pinned") { "yes" } else { "no" },
            if flag(d, "in_use") { "yes" } else { "no" },
            &text(d, "key")[..12.min(text(d, "key").len())],
        );
    }
    Ok(0)
}

async fn verify(cli: &Cli, conn: &Connection, out: &mut String) -> Result<u8> {
    let e = |e| explain("verify", e);
    let list = KernelCacheProxy::new(conn)
        .await
        .map_err(e)?
        .verify()
        .await
        .map_err(e)?;
    let bad: Vec<&Dict> = list.iter().filter(|d| !flag(d, "ok")).collect();
    if cli.json {
        let rows: Vec<_> = list
            .iter()
            .map(|d| json!({"key": text(d, "key"), "package": text(d, "package"), "arch": text(d, "arch"), "ok": flag(d, "ok"), "problem": text(d, "problem")}))
            .collect();
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&rows)?);
    } else {
        let _ = writeln!(out, "{} builds checked, {} corrupt", list.len(), bad.len());
        for d in &bad {
            let _ = writeln!(
                out,
                "{} {}: {} (quarantined; rebuilding)",
                text(d, "package"),
                text(d, "arch"),
                text(d, "problem")
            );
        }
    }
    Ok(if bad.is_empty() { 0 } else { 1 })
}

async fn prewarm(
    cli: &Cli,
    conn: &Connection,
    args: &crate::ctl::PrewarmArgs,
    out: &mut String,
) -> Result<u8> {
    use futures_util::StreamExt;
    let e = |e| explain("prewarm", e);
    let archs: Vec<String> = args
        .arch
        .as_deref()
        .map(|l| {
            l.split(',')
                .map(|a| a.trim().to_owned())
                .filter(|a| !a.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let pkgs: Vec<&str> = args.packages.iter().map(String::as_str).collect();
    let archs: Vec<&str> = archs.iter().map(String::as_str).collect();
    let kc = patient(KernelCacheProxy::new(conn)).await?.map_err(e)?;
    let path = patient(kc.prewarm(&pkgs, &archs)).await?.map_err(e)?;
    let job = JobProxy::builder(conn)
        .path(path.clone())
        .build()
        .await
        .map_err(e)?;
    let mut finished = job.receive_finished().await.map_err(e)?;
    let mut progress = job.receive_progress_changed().await;
    let bar = indicatif::ProgressBar::new(1000);
    if cli.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} pre-warming [{bar:40}] {percent:>3}% {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    // The job may have finished before we listened.
    if job.state().await.map_err(e)? == "running" {
        loop {
            tokio::select! {
                p = progress.next() => {
                    if let Some(p) = p && let Ok(v) = p.get().await {
                        bar.set_position((v * 1000.0) as u64);
                    }
                }
                _ = finished.next() => break,
            }
        }
    }
    bar.finish_and_clear();
    // Message and Log emit no change signals: read them fresh, not cached.
    let job = JobProxy::builder(conn)
        .path(path.clone())
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .map_err(e)?;
    let state = job.state().await.map_err(e)?;
    let message = job.message().await.map_err(e)?;
    let log = job.log().await.map_err(e)?;
    if cli.json {
        let doc = json!({"job": path.as_str(), "state": state, "message": message, "log": log});
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for l in &log {
            let _ = writeln!(out, "{l}");
        }
        let _ = writeln!(out, "{state}: {message}");
    }
    Ok(if state == "done" { 0 } else { 1 })
}
