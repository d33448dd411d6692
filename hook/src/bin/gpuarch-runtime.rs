//! gpuarch-runtime: an OCI runtime shim. On `create` and `run` it applies
//! the Plan to the bundle's `config.json`, then execs the real runtime
//! (`runtime.path` in the config, else the first of runc, crun on PATH)
//! with exactly the arguments it was given; every other subcommand goes
//! straight through. Its exit code is the runtime's.
//!
//! Fail open: on any error (or when NVML, asked only without the daemon's
//! snapshot, does not answer within `hook.timeout_ms`) the runtime runs on
//! the original bundle and the reason is logged; with `strict: true` the
//! shim exits 1 with a one-line reason instead.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use gpuarch_container::log;
use gpuarch_container::run::{Ran, Runner, Start};
use gpuarch_container::shim::{self, Invocation};

/// What marks this program whatever its file is named, for gpuarchctl's
/// engine checks (a containerd BinaryName or a Docker runtime path that is
/// a copy or a wrapper named otherwise): `gpuarchctl::engine::RUNTIME_MARK`.
static MARK: [u8; 33] = *b"gpuarch-runtime: OCI runtime shim";

fn main() -> ExitCode {
    // Kept in the binary, whatever the linker and LTO drop.
    std::hint::black_box(MARK.as_ptr());
    log::init("gpuarch-runtime");
    if std::env::var_os(shim::ACTIVE_ENV).is_some() {
        log::fatal(
            "started by gpuarch-runtime itself: runtime.path (or PATH) leads back to the shim",
        );
        return ExitCode::FAILURE;
    }
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let inv = Invocation::parse(&args);
    if let Some(path) = &inv.log {
        log::set_runtime_log(path.clone(), inv.log_json);
    }
    let runner = Runner::load();
    log::set_container(inv.id.as_deref(), &Default::default());
    let myself = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let runtime = match shim::find_runtime(
        runner.config().runtime.path.as_deref(),
        std::env::var_os("PATH").as_deref(),
        &myself,
    ) {
        Ok(r) => r,
        Err(e) => {
            log::fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    if inv.creates() {
        let by = format!("gpuarch-runtime {}", inv.command.as_deref().unwrap_or(""));
        let start = Start {
            by: &by,
            id: inv.id.as_deref(),
            only_first: false,
            unchanged: "the container starts unchanged",
            verb: "create",
        };
        let ran = runner.run(&start, |cfg| {
            let bundle = inv
                .bundle
                .clone()
                .or_else(|| std::env::current_dir().ok())
                .unwrap_or_else(|| PathBuf::from("."));
            let hook = myself.with_file_name("gpuarch-hook");
            let hook = hook.is_file().then_some(hook);
            // Only NVML can hang here (the bundle is the engine's, the rest
            // gpuarch's own files): it alone runs under the budget, in a
            // process of its own.
            let env_files = cfg.runtime.env_files;
            let mut ctx = gpuarch_container::load_context(cfg, hook)?;
            ctx.env_files = env_files;
            Ok(shim::rewrite_bundle(&bundle, &ctx)?)
        });
        if let Ran::Refused = ran {
            return ExitCode::FAILURE;
        }
    }
    let err = shim::exec_runtime(&runtime, &args, (shim::ACTIVE_ENV, "1"));
    log::fatal(&format!("cannot run {}: {err}", runtime.path.display()));
    ExitCode::from(127)
}
