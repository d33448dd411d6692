//! The Slurm TaskProlog's part that needs no daemon: which GPUs the step
//! was given, its Plan from gpuarchd's snapshot, and the `export` lines
//! Slurm reads from the prolog's stdout.
//!
//! Two programs use it: `slurm-task-prolog` (gpuarch-hook's crate), which
//! Slurm runs for every task and which plans from the snapshot as the hook
//! does; and `gpuarchctl slurm task-prolog`, which asks gpuarchd first and
//! which the former runs when the snapshot cannot give a Plan.

use std::fmt::Write as _;

use gpuarch_core::config::Config;
use gpuarch_core::oci::ContainerView;
use gpuarch_core::slurm;

/// Where the step's GPUs are read, in order: Slurm's own lists first.
pub const STEP_GPU_VARS: [&str; 3] = ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"];

/// The step's GPUs as Slurm lists them, and which variable said so; None
/// for a step without GPUs.
pub fn step_gpus() -> Option<(String, &'static str)> {
    STEP_GPU_VARS.into_iter().find_map(|k| {
        std::env::var(k)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (v, k))
    })
}

/// What to say of a list read from `CUDA_VISIBLE_DEVICES`: without
/// SLURM_STEP_GPUS or SLURM_JOB_GPUS it may be renumbered from 0
/// (task/cgroup with ConstrainDevices=yes).
pub fn note_for(gpus: &str, from: &str) -> Option<String> {
    (from == "CUDA_VISIBLE_DEVICES").then(|| {
        format!(
            "no SLURM_STEP_GPUS or SLURM_JOB_GPUS: planning for CUDA_VISIBLE_DEVICES={gpus}, taken as Slurm's global indices"
        )
    })
}

/// The Plan's env for `gpus` and the task of `task` (its env, and what
/// its Python environments hold) from the snapshot gpuarchd last wrote
/// (`GPUARCH_INVENTORY`, else the config's `daemon.snapshot`), never NVML:
/// a prolog must not wait on a driver.
pub fn plan_from_snapshot(
    gpus: &str,
    task: &ContainerView,
    config: &Config,
) -> Result<Vec<(String, String)>, PrologError> {
    let path = crate::inventory_env().unwrap_or_else(|| config.daemon.snapshot.clone());
    let inv = crate::read_snapshot(&path)?;
    let plan = slurm::plan_for(gpus, task, &inv, &config.env)?;
    Ok(plan.env)
}

/// Why the prolog could not plan from the snapshot.
#[derive(Debug, thiserror::Error)]
pub enum PrologError {
    #[error(transparent)]
    Snapshot(#[from] crate::InventoryError),
    #[error(transparent)]
    Slurm(#[from] slurm::SlurmError),
}

/// The `export NAME=value` lines for `env`, appended to `out`. The step's
/// own values are kept, as a container's are, unless the config says
/// `env.override_existing` (Slurm applies these lines over the task's
/// env); a value Slurm would misread unquoted is left out and said to
/// `log`.
pub fn exports(
    env: Vec<(String, String)>,
    override_existing: bool,
    out: &mut String,
    mut log: impl FnMut(&str),
) {
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
}

/// One line for the admin from `program`: to syslog (`/dev/log`, which the
/// journal reads), else stderr. Never stdout, which Slurm reads for
/// `export` lines.
pub fn log(program: &str, msg: &str) {
    use std::os::unix::net::UnixDatagram;
    let line = format!(
        "<12>{program}[{}]: slurm task-prolog: {msg}",
        std::process::id()
    );
    let sent = UnixDatagram::unbound()
        .and_then(|s| s.send_to(line.as_bytes(), "/dev/log"))
        .is_ok();
    if !sent {
        eprintln!("{program} slurm task-prolog: {msg}");
    }
}
