//! The Slurm TaskProlog (installed as `/usr/lib/gpuarch/slurm-task-prolog`;
//! slurm.conf `TaskProlog=` names it): `export NAME=value` lines of the
//! Plan for the step's GPUs, on stdout, where Slurm reads them.
//!
//! Slurm runs it as the job's owner before every task, so it is kept to
//! what the hook does: the config and gpuarchd's snapshot, read here, and
//! the task's Python environments (those its env finds, read as the job's
//! owner, as the hook reads an image); no arguments, no D-Bus. Where the
//! snapshot gives no Plan (none yet, or a GPU it does not list) it runs
//! `gpuarchctl slurm task-prolog`, which asks gpuarchd. It never fails a job: any error is logged and the task starts
//! unchanged.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use gpuarch_inventory::task_prolog;

fn log(msg: &str) {
    task_prolog::log("gpuarch-slurm-task-prolog", msg);
}

fn main() -> ExitCode {
    let Some((gpus, from)) = task_prolog::step_gpus() else {
        return ExitCode::SUCCESS;
    };
    let planned = gpuarch_fs::config::read_config()
        .map_err(|e| format!("the config: {e}"))
        .and_then(|config| {
            // Read only once there is a config to plan with: without one
            // gpuarchctl takes over, and reads the task itself if it must.
            let env = task_prolog::plan_from_snapshot(&gpus, &read_task(), &config)
                .map_err(|e| e.to_string())?;
            Ok((env, config.env.override_existing))
        });
    let (env, override_existing) = match planned {
        Ok(p) => p,
        Err(why) => {
            log(&format!(
                "no Plan from the snapshot ({why}); asking gpuarchd"
            ));
            return ask_gpuarchd();
        }
    };
    if let Some(note) = task_prolog::note_for(&gpus, from) {
        log(&note);
    }
    let mut out = String::new();
    task_prolog::exports(env, override_existing, &mut out, log);
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        log(&format!("cannot write the export lines: {e}"));
    }
    ExitCode::SUCCESS
}

/// The task's process and what its Python environments hold; what could
/// not be read is logged (the Plan is then that for software not known).
fn read_task() -> gpuarch_core::oci::ContainerView {
    let (task, notes) = gpuarch_container::image::read_task();
    for n in notes.iter().filter(|n| n.contains("not read")) {
        log(n);
    }
    task
}

/// Become `gpuarchctl slurm task-prolog` (the one beside this program, a
/// build tree's, else the package's); if it cannot be run, the task starts
/// unchanged.
fn ask_gpuarchd() -> ExitCode {
    let ctl = gpuarch_container::nvml::gpuarchctl();
    let e = std::process::Command::new(&ctl)
        .args(["slurm", "task-prolog"])
        .exec();
    log(&format!(
        "cannot run {}: {e}; the task starts unchanged",
        ctl.display()
    ));
    ExitCode::SUCCESS
}
