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

use gpuarch_hook::stage::{self, Stage, State};
use gpuarch_hook::{budget, log};

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
    if bytes.len() as u64 > limit {
        return too_large(&bytes, stdin);
    }
    let (cfg, cfg_err, cfg_note) = gpuarch_hook::load_config();
    log::configure(&cfg.log);
    if let Some(n) = &cfg_note {
        log::warn(n);
    }
    let strict = cfg.strict;
    let records = cfg.hook.record_dir.clone();
    // audit.refuse refuses whatever strict says.
    let mut refuses = false;
    let result = match cfg_err {
        // A config that cannot be read leaves strict off: fail open.
        Some(e) => Err(e),
        None => {
            // The config is in memory and bounded; only NVML can hang, and
            // it alone runs under the budget, in a process of its own.
            let hook_path = std::env::current_exe().ok();
            gpuarch_hook::load_context(cfg, hook_path)
                .map_err(|e| e.to_string())
                .and_then(|ctx| {
                    gpuarch_hook::precreate(&bytes, &ctx).map_err(|e| {
                        refuses = e.refuses();
                        e.to_string()
                    })
                })
        }
    };
    let result = result.map(|(out, mut plan)| {
        plan.notes.extend(cfg_note);
        (out, plan)
    });
    let out: &[u8] = match &result {
        Ok((out, plan)) => {
            // podman gives precreate no OCI state: the id, when there is
            // one, is read from the config's mounts.
            log::set_container(None, &plan.container);
            log::plan(plan);
            gpuarch_hook::keep_record(&records, None, "gpuarch-hook precreate", plan, false);
            out
        }
        Err(e) if refuses => {
            log::fatal(&format!("{e} (refusing to start the container)"));
            return ExitCode::FAILURE;
        }
        Err(e) if strict => {
            log::fatal(&format!("{e} (strict: refusing to start the container)"));
            return ExitCode::FAILURE;
        }
        Err(e) => {
            log::warn(&format!("{e}; the container starts unchanged"));
            &bytes
        }
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::fatal(&format!("cannot write the config: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// A config over the bound is not parsed: it streams through unchanged
/// (fail open, in constant memory beyond what was read), or with `strict`
/// the start fails.
fn too_large(head: &[u8], mut rest: impl Read) -> ExitCode {
    let reason = format!(
        "OCI config is over {} MiB; not planning it",
        gpuarch_core::oci::MAX_CONFIG_BYTES >> 20
    );
    let (cfg, _, _) = gpuarch_hook::load_config();
    log::configure(&cfg.log);
    if cfg.strict {
        log::fatal(&format!(
            "{reason} (strict: refusing to start the container)"
        ));
        return ExitCode::FAILURE;
    }
    log::warn(&format!("{reason}; the container starts unchanged"));
    let mut stdout = std::io::stdout().lock();
    let copied = stdout
        .write_all(head)
        .and_then(|()| std::io::copy(&mut rest, &mut stdout))
        .and_then(|_| stdout.flush());
    match copied {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::fatal(&format!("cannot pass the config through: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn in_container(which: Stage) -> ExitCode {
    let (cfg, cfg_err, cfg_note) = gpuarch_hook::load_config();
    log::configure(&cfg.log);
    if let Some(n) = &cfg_note {
        log::warn(n);
    }
    let strict = cfg.strict;
    let records = cfg.hook.record_dir.clone();
    let mut id = None;
    let result = match cfg_err {
        Some(e) => Err(e),
        None => match State::read(std::io::stdin().lock()) {
            Err(e) => Err(e.to_string()),
            Ok(state) => {
                id = state.id.clone();
                log::set_container(id.as_deref(), &Default::default());
                // The container's rootfs may be anything (a FUSE mount
                // that never answers): the whole stage runs under the
                // budget.
                let budget = Duration::from_millis(cfg.hook.timeout_ms);
                budget::within(budget, move || {
                    let ctx = gpuarch_hook::load_context(cfg, None).map_err(|e| e.to_string())?;
                    stage::run(which, &state, &ctx).map_err(|e| e.to_string())
                })
                .map_err(|e| e.to_string())
                .and_then(|r| r)
            }
        },
    };
    match result {
        Ok(mut out) => {
            out.plan.notes.extend(cfg_note);
            log::set_container(id.as_deref(), &out.plan.container);
            log::plan(&out.plan);
            let by = match which {
                Stage::Prestart => "gpuarch-hook prestart",
                _ => "gpuarch-hook create-container",
            };
            // Only where no earlier step (precreate, the shim) planned it:
            // theirs is what the container's env holds.
            gpuarch_hook::keep_record(&records, id.as_deref(), by, &out.plan, true);
            ExitCode::SUCCESS
        }
        Err(e) if strict => {
            log::fatal(&format!("{e} (strict: refusing to start the container)"));
            ExitCode::FAILURE
        }
        Err(e) => {
            log::warn(&format!(
                "{e}; the container starts without /{} inside",
                stage::ENV_FILE
            ));
            ExitCode::SUCCESS
        }
    }
}
