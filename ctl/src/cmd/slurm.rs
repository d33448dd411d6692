//! `gpuarchctl slurm gres|task-prolog`: gres.conf typed by architecture,
//! and the TaskProlog that gives a job step its GPUs' Plan.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuarch_core::slurm;
use gpuarch_wire::dbus::InventoryProxy;

use crate::cli::Cli;
use crate::source::{BusError, Daemon, Offline, Source};

/// gres.conf for this node, printed or written atomically to `write`.
pub fn gres(
    cli: &Cli,
    write: Option<&PathBuf>,
    node: Option<&str>,
    out: &mut String,
) -> Result<u8> {
    let (inv, _) = Source::of(cli)?.inventory()?;
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let node = node.map_or_else(|| slurm::short_name(&host), str::to_owned);
    let conf = slurm::gres_conf(&inv, &node)?;
    match write {
        Some(path) => {
            gpuarch_fs::write_atomic(path, conf.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            let _ = writeln!(out, "wrote {} ({} GPUs)", path.display(), inv.devices.len());
        }
        None => out.push_str(&conf),
    }
    Ok(0)
}

/// How long the TaskProlog waits for gpuarchd before the snapshot.
const PROLOG_PATIENCE: Duration = Duration::from_secs(2);

/// The step's GPUs as Slurm lists them, and which variable said so.
fn step_gpus() -> Option<(String, &'static str)> {
    ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|k| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| (v, k))
        })
}

/// The TaskProlog: `export NAME=value` lines of the Plan for the step's
/// GPUs. It never fails a job: on any error it prints nothing, says why in
/// the log, and exits 0.
pub fn task_prolog(out: &mut String) -> u8 {
    let Some((gpus, from)) = step_gpus() else {
        return 0;
    };
    if from == "CUDA_VISIBLE_DEVICES" {
        // Without SLURM_STEP_GPUS or SLURM_JOB_GPUS the list may be
        // renumbered from 0 (task/cgroup with ConstrainDevices=yes).
        log(&format!(
            "no SLURM_STEP_GPUS or SLURM_JOB_GPUS: planning for CUDA_VISIBLE_DEVICES={gpus}, taken as Slurm's global indices"
        ));
    }
    let env = match from_daemon(&gpus) {
        Ok(env) => env,
        Err(why) => {
            log(&format!(
                "gpuarchd did not answer ({why}); planning from the snapshot"
            ));
            match offline(&gpus) {
                Ok(env) => env,
                Err(why) => {
                    log(&format!(
                        "no Plan for GPUs {gpus} ({from}): {why}; the task starts unchanged"
                    ));
                    return 0;
                }
            }
        }
    };
    // The step's own values are kept, as a container's are, unless the
    // config overrides: Slurm applies these lines over the task's env.
    let override_existing =
        gpuarch_fs::config::read_config().is_ok_and(|c| c.env.override_existing);
    for (k, v) in env {
        if !override_existing && std::env::var_os(&k).is_some() {
            continue;
        }
        if slurm::prolog_safe(&k, &v) {
            let _ = writeln!(out, "export {k}={v}");
        } else {
            log(&format!("{k} not exported: its value needs quoting"));
        }
    }
    0
}

fn from_daemon(gpus: &str) -> Result<Vec<(String, String)>> {
    let d = Daemon::connect_within(PROLOG_PATIENCE)?;
    let (env, _) = d.ask_within(PROLOG_PATIENCE, async {
        let e = |e| BusError::of("slurm plan", e);
        let inv = InventoryProxy::new(&d.conn).await.map_err(e)?;
        inv.slurm_plan(gpus).await.map_err(e)
    })?;
    // gpuarchd's env is a map: put it back in injection order.
    let mut env: Vec<(String, String)> = env.into_iter().collect();
    let order = |k: &str| {
        gpuarch_core::env::EnvVar::from_name(k)
            .and_then(|v| gpuarch_core::env::EnvVar::ALL.iter().position(|x| *x == v))
            .unwrap_or(usize::MAX)
    };
    env.sort_by_key(|(k, _)| order(k));
    Ok(env)
}

/// The Plan from the snapshot gpuarchd last wrote, never NVML: a prolog
/// must not wait on a driver.
fn offline(gpus: &str) -> Result<Vec<(String, String)>> {
    let config = gpuarch_fs::config::read_config().context("the config")?;
    let snapshot = std::env::var_os("GPUARCH_INVENTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| config.daemon.snapshot.clone());
    let offline = Offline {
        nvml_lib: None,
        inventory: Some(snapshot),
    };
    let (inv, _) = offline.inventory()?;
    let plan = slurm::plan(gpus, &inv, &config.env)?;
    Ok(plan.env)
}

/// One line for the admin: to syslog (`/dev/log`, the journal reads it),
/// else stderr. Never stdout, which Slurm reads for `export` lines.
fn log(msg: &str) {
    use std::os::unix::net::UnixDatagram;
    let line = format!(
        "<12>gpuarchctl[{}]: slurm task-prolog: {msg}",
        std::process::id()
    );
    let sent = UnixDatagram::unbound()
        .and_then(|s| s.send_to(line.as_bytes(), "/dev/log"))
        .is_ok();
    if !sent {
        eprintln!("gpuarchctl slurm task-prolog: {msg}");
    }
}
