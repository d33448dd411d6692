//! gpuarch-hook: the OCI hook.
//!
//! - `precreate` (podman hooks.d): the proposed config on stdin, the config
//!   with the Plan applied on stdout.
//! - `create-container` / `prestart`: the OCI state on stdin; writes the
//!   Plan into the container as `/run/gpuarch/env` and
//!   `/etc/profile.d/gpuarch.sh`.
//!
//! Fail open: on any error (or past `hook.timeout_ms`: the stages' whole
//! work, precreate's wait for NVML) the container starts unchanged and the
//! reason is logged; with `strict: true` in the config the
//! hook exits 1 with a one-line reason instead, failing the start.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use gpuarch_container::run::{self, Ran, Runner, Start, StartError};
use gpuarch_container::stage::{self, Stage, State};
use gpuarch_container::{budget, log};

/// What a stage name asks for: `None` for precreate, else the
/// in-container stage; `Err` for a name that is no stage.
fn stage_of(name: &str) -> Result<Option<Stage>, ()> {
    match name {
        "precreate" => Ok(None),
        stage::CREATE_CONTAINER => Ok(Some(Stage::CreateContainer)),
        stage::PRESTART => Ok(Some(Stage::Prestart)),
        _ => Err(()),
    }
}

fn main() -> ExitCode {
    // Engines call exactly `gpuarch-hook STAGE`: that is read without
    // building clap's command (about a tenth of precreate's own work);
    // anything else (--help, --version, a mistake) goes through clap.
    let mut args = std::env::args_os().skip(1);
    let fast = match (args.next(), args.next()) {
        (Some(a), None) => a.to_str().and_then(|n| stage_of(n).ok()),
        _ => None,
    };
    let stage = match fast {
        Some(s) => s,
        None => match gpuarch_hook::cli::hook_command().try_get_matches() {
            Ok(m) => match m.subcommand_name().map(stage_of) {
                Some(Ok(s)) => s,
                _ => return ExitCode::from(2),
            },
            Err(e) => {
                // --help and --version print to stdout and exit 0; misuse exits 2.
                let _ = e.print();
                return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
            }
        },
    };
    log::init("gpuarch-hook");
    match stage {
        None => precreate(),
        Some(which) => in_container(which),
    }
}

fn precreate() -> ExitCode {
    let limit = gpuarch_core::oci::MAX_CONFIG_BYTES;
    let mut stdin = std::io::stdin().lock();
    let mut bytes = Vec::new();
    if let Err(e) = (&mut stdin).take(limit + 1).read_to_end(&mut bytes) {
        // Nothing whole to pass through: the engine must not get half a config.
        log::fatal(&format!("cannot read the OCI config: {e}"));
        return ExitCode::FAILURE;
    }
    let runner = Runner::load();
    // podman gives precreate no OCI state: the id, when there is one, is
    // read from the config's mounts.
    let start = Start {
        by: "gpuarch-hook precreate",
        id: None,
        only_first: false,
        unchanged: "the container starts unchanged",
        verb: "start",
    };
    if bytes.len() as u64 > limit {
        // Not parsed: it streams through unchanged (in constant memory
        // beyond what was read), or the start fails.
        return match run::fail::<()>(&StartError::TooLarge(limit), runner.config().strict, &start) {
            Ran::Unchanged => write_out(&bytes, Some(stdin)),
            _ => ExitCode::FAILURE,
        };
    }
    // The config is in memory and bounded; only NVML can hang, and it
    // alone runs under the budget, in a process of its own.
    let ran = runner.run(&start, |cfg| {
        let ctx = gpuarch_container::load_context(cfg, std::env::current_exe().ok())?;
        Ok(gpuarch_container::precreate(&bytes, &ctx)?)
    });
    match ran {
        Ran::Planned((out, _)) => write_out(&out, None::<std::io::Empty>),
        Ran::Unchanged => write_out(&bytes, None::<std::io::Empty>),
        Ran::Refused => ExitCode::FAILURE,
    }
}

/// Write the config for the engine: `head`, then what is left of `rest`.
fn write_out(head: &[u8], rest: Option<impl Read>) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(head).and_then(|()| match rest {
        Some(mut r) => std::io::copy(&mut r, &mut stdout).map(|_| ()),
        None => Ok(()),
    });
    match written.and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::fatal(&format!("cannot write the config: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn in_container(which: Stage) -> ExitCode {
    let runner = Runner::load();
    let state = State::read(std::io::stdin().lock());
    let id = state.as_ref().ok().and_then(|s| s.id.clone());
    log::set_container(id.as_deref(), &Default::default());
    let start = Start {
        by: match which {
            Stage::Prestart => "gpuarch-hook prestart",
            _ => "gpuarch-hook create-container",
        },
        id: id.as_deref(),
        // Only where no earlier step (precreate, the shim) planned it:
        // theirs is what the container's env holds.
        only_first: true,
        unchanged: &format!("the container starts without /{} inside", stage::ENV_FILE),
        verb: "start",
    };
    let ran = runner.run(&start, |cfg| {
        let state = state?;
        // The container's rootfs may be anything (a FUSE mount that never
        // answers): the whole stage runs under the budget.
        let budget = Duration::from_millis(cfg.hook.timeout_ms);
        budget::within(budget, move || -> Result<_, StartError> {
            let ctx = gpuarch_container::load_context(cfg, None)?;
            Ok(stage::run(which, &state, &ctx)?)
        })?
    });
    match ran {
        Ran::Refused => ExitCode::FAILURE,
        Ran::Planned(_) | Ran::Unchanged => ExitCode::SUCCESS,
    }
}
