//! `gpuarchctl slurm gres|task-prolog`: gres.conf typed by architecture,
//! and the TaskProlog that gives a job step its GPUs' Plan.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuarch_core::slurm;
use gpuarch_inventory::task_prolog;
use gpuarch_wire::dbus::InventoryProxy;

use crate::cli::Cli;
use crate::source::{BusError, Daemon, Source};

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
    if let Some(path) = write {
        gpuarch_fs::write_atomic(path, conf.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if cli.json {
        crate::render::json(
            out,
            &serde_json::json!({
                "node": node,
                "gpus": inv.devices.len(),
                "written": write,
                "gres_conf": conf,
            }),
        )?;
        return Ok(0);
    }
    match write {
        Some(path) => {
            let _ = writeln!(out, "wrote {} ({} GPUs)", path.display(), inv.devices.len());
        }
        None => out.push_str(&conf),
    }
    Ok(0)
}

/// How long the TaskProlog waits for gpuarchd before the snapshot.
const PROLOG_PATIENCE: Duration = Duration::from_secs(2);

/// `gpuarchctl slurm task-prolog`: `export NAME=value` lines of the Plan
/// for the step's GPUs, asking gpuarchd first and then its snapshot. The
/// shipped TaskProlog (`slurm-task-prolog`) plans from the snapshot itself
/// and runs this only when that gives no Plan. It never fails a job: on
/// any error it prints nothing, says why in the log, and exits 0.
pub fn task_prolog(json: bool, out: &mut String) -> u8 {
    if !json {
        return task_prolog_lines(out);
    }
    // The same lines, as a JSON object of what the step would get.
    let mut lines = String::new();
    let code = task_prolog_lines(&mut lines);
    let export: serde_json::Map<String, serde_json::Value> = lines
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), serde_json::Value::from(v)))
        .collect();
    let _ = crate::render::json(out, &serde_json::json!({ "export": export }));
    code
}

fn task_prolog_lines(out: &mut String) -> u8 {
    let Some((gpus, from)) = task_prolog::step_gpus() else {
        return 0;
    };
    if let Some(note) = task_prolog::note_for(&gpus, from) {
        log(&note);
    }
    // A config that cannot be read leaves the defaults: the snapshot's
    // default path, the steps' own values kept.
    let config = gpuarch_fs::config::read_config();
    let env = match from_daemon(&gpus) {
        Ok(env) => env,
        Err(why) => {
            log(&format!(
                "gpuarchd did not answer ({why}); planning from the snapshot"
            ));
            let planned = match &config {
                Ok(c) => {
                    let (task, _) = gpuarch_container::image::read_task();
                    task_prolog::plan_from_snapshot(&gpus, &task, c).map_err(|e| e.to_string())
                }
                Err(e) => Err(format!("the config: {e}")),
            };
            match planned {
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
    let override_existing = config.is_ok_and(|c| c.env.override_existing);
    task_prolog::exports(env, override_existing, out, log);
    0
}

fn from_daemon(gpus: &str) -> Result<Vec<(String, String)>> {
    let d = Daemon::connect_within(PROLOG_PATIENCE)?;
    let (env, _) = d.ask_within(PROLOG_PATIENCE, async {
        let e = |e| BusError::of("slurm plan", e);
        let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
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

/// One line for the admin, as gpuarchctl.
fn log(msg: &str) {
    task_prolog::log("gpuarchctl", msg);
}
