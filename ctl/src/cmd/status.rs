//! `gpuarchctl status`: is gpuarchd running, and how fresh is its
//! inventory? Offline: where the inventory was read from, and when.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Result;
use gpuarch_wire::dbus::{DaemonProxy, InventoryProxy};
use serde_json::json;

use crate::render::{self, age_of_stamp, age_of_usec, short_duration};
use crate::source::{BusError, Daemon, Offline, Source};

pub fn run(json: bool, src: &Source, out: &mut String) -> Result<u8> {
    let config = ConfigState::now();
    let code = match src {
        Source::Daemon(d) => daemon(json, d, &config, out),
        Source::Offline(o) => offline(json, o, &config, out),
    }?;
    // A config file the hook and the shim cannot use is a failure, even
    // where gpuarchd runs on its last valid one.
    Ok(if config.problem.is_some() { 1 } else { code })
}

/// The config file as the hook and the shim read it at every start.
struct ConfigState {
    path: std::path::PathBuf,
    /// Why the file cannot be used, and what new containers get meanwhile.
    problem: Option<(String, String)>,
}

impl ConfigState {
    fn now() -> Self {
        let (path, _) = gpuarch_fs::config::config_path();
        let problem = gpuarch_fs::config::read_config().err().map(|e| {
            let l = gpuarch_fs::config::read_config_or_last_good();
            let meanwhile = match l.error {
                None => "new containers are planned with gpuarchd's last valid config".to_owned(),
                Some(_) => {
                    "new containers start unplanned (gpuarchd has published no valid config)"
                        .to_owned()
                }
            };
            (e.to_string(), meanwhile)
        });
        Self { path, problem }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "path": self.path,
            "error": self.problem.as_ref().map(|p| &p.0),
            "meanwhile": self.problem.as_ref().map(|p| &p.1),
        })
    }

    fn line(&self, out: &mut String) {
        if let Some((e, meanwhile)) = &self.problem {
            let _ = writeln!(
                out,
                "CONFIG INVALID: {}; {meanwhile} until it is fixed",
                render::shown(e)
            );
        }
    }
}

/// What gpuarchd says of itself and its inventory.
struct Answer {
    version: String,
    started_at: u64,
    caps: Vec<String>,
    generated_at: String,
    last_refresh: u64,
    stale: bool,
    last_error: String,
    driver: String,
    cuda: String,
    nri: (String, u64, String),
}

fn ask(d: &Daemon) -> Result<Answer, BusError> {
    d.ask(async {
        let e = |e| BusError::of("status", e);
        let daemon = d.proxy::<DaemonProxy>().await.map_err(e)?;
        let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
        Ok(Answer {
            version: daemon.version().await.map_err(e)?,
            started_at: daemon.started_at().await.map_err(e)?,
            caps: inv.compute_capabilities().await.map_err(e)?,
            generated_at: inv.generated_at().await.map_err(e)?,
            last_refresh: inv.last_refresh().await.map_err(e)?,
            stale: inv.stale().await.map_err(e)?,
            last_error: inv.last_error().await.map_err(e)?,
            driver: inv.driver_version().await.map_err(e)?,
            cuda: inv.cuda_driver_version().await.map_err(e)?,
            nri: (
                daemon.nri_state().await.map_err(e)?,
                daemon.nri_planned().await.map_err(e)?,
                daemon.nri_last().await.map_err(e)?,
            ),
        })
    })
}

fn daemon(json: bool, d: &Daemon, config: &ConfigState, out: &mut String) -> Result<u8> {
    let a = ask(d)?;
    let uptime = age_of_usec(a.started_at);
    let refreshed = age_of_usec(a.last_refresh);
    let inventory_age = age_of_stamp(&a.generated_at);
    if json {
        let doc = json!({
            "daemon": {"version": a.version, "uptime_s": uptime.map(|d| d.as_secs())},
            "config": config.json(),
            "nri": {"state": a.nri.0, "planned": a.nri.1, "last": a.nri.2},
            "inventory": {
                "devices": a.caps.len(),
                "compute_capabilities": a.caps,
                "driver_version": a.driver,
                "cuda_driver_version": a.cuda,
                "generated_at": a.generated_at,
                "age_s": inventory_age.map(|a| a.as_secs()),
                "last_refresh_age_s": refreshed.map(|a| a.as_secs()),
                "stale": a.stale,
                "last_error": (!a.last_error.is_empty()).then_some(&a.last_error),
            }
        });
        render::json(out, &doc)?;
        return Ok(0);
    }
    let ago = |d: Option<Duration>| {
        d.map_or_else(
            || "never".to_owned(),
            |d| format!("{} ago", short_duration(d)),
        )
    };
    let _ = writeln!(
        out,
        "gpuarchd {}: running, up {}",
        a.version,
        uptime.map_or_else(|| "?".to_owned(), short_duration)
    );
    config.line(out);
    if !a.nri.0.starts_with("off") {
        let _ = writeln!(
            out,
            "nri: {}; {} container(s) planned{}",
            render::shown(&a.nri.0),
            a.nri.1,
            if a.nri.2.is_empty() {
                String::new()
            } else {
                format!(", the last {}", render::shown(&a.nri.2))
            }
        );
    }
    if a.generated_at.is_empty() {
        let _ = writeln!(out, "inventory: none yet: {}", a.last_error);
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "inventory: {} GPU(s) ({}), driver {}, CUDA {}",
        a.caps.len(),
        if a.caps.is_empty() {
            "none".to_owned()
        } else {
            a.caps.join(", ")
        },
        a.driver,
        a.cuda
    );
    let _ = writeln!(
        out,
        "read: {} ({}); NVML last answered {}",
        a.generated_at,
        ago(inventory_age),
        ago(refreshed)
    );
    if a.stale {
        let _ = writeln!(
            out,
            "STALE: the last refresh failed ({}); serving the last good inventory",
            a.last_error
        );
    }
    Ok(0)
}

fn offline(json: bool, o: &Offline, config: &ConfigState, out: &mut String) -> Result<u8> {
    let (snap, from) = o.inventory()?;
    let age = age_of_stamp(&snap.generated_at);
    if json {
        let doc = json!({
            "daemon": null,
            "config": config.json(),
            "inventory": {
                "source": from,
                "devices": snap.devices.len(),
                "generated_at": snap.generated_at,
                "age_s": age.map(|a| a.as_secs()),
                "stale": snap.stale,
            }
        });
        render::json(out, &doc)?;
    } else {
        let _ = writeln!(out, "daemon: not asked (--offline)");
        config.line(out);
        let _ = writeln!(
            out,
            "inventory: {} GPU(s) from {from}, read {}{}{}",
            snap.devices.len(),
            snap.generated_at,
            age.map(|a| format!(" ({} ago)", short_duration(a)))
                .unwrap_or_default(),
            if snap.stale {
                ", STALE: the daemon's last refresh failed"
            } else {
                ""
            }
        );
    }
    Ok(0)
}
