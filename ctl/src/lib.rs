//! gpuarchctl, the admin and scheduler CLI: one module per subcommand
//! under [`cmd`], the tables and sizes they print in [`render`], and where
//! they get their answers in [`source`]: gpuarchd over D-Bus, or, with
//! `--offline` (implied by `--inventory` and `--nvml-lib`), the snapshot or
//! NVML read here and answered with the same core code.
//!
//! This crate is the program; its library form exists for the man pages
//! (xtask) and the tests. Errors are `anyhow` here, as in any binary: the
//! libraries under it keep their own typed errors, carried as the source.
#![forbid(unsafe_code)]

pub mod check;
pub mod cli;
pub mod cmd;
pub mod docker_api;
pub mod engine;
pub mod render;
pub mod source;

use anyhow::Result;

pub use crate::cli::{Cli, EXIT_ERROR, EXIT_NO};
use crate::cli::{Cmd, EngineCmd, JitCmd, KernelsCmd, SlurmCmd};
use crate::source::Source;

/// An error and its causes in one line (see [`gpuarch_core::one_line`]).
pub fn one_line(e: &anyhow::Error) -> String {
    gpuarch_core::one_line(e.as_ref())
}

/// Why `reload` has no `--offline` form.
const RELOAD_IS_THE_DAEMONS: &str =
    "reload asks gpuarchd to re-read NVML and its config; there is nothing to reload --offline";
/// Why the kernel cache's commands have no `--offline` form.
const CACHE_IS_THE_DAEMONS: &str =
    "the kernel cache is gpuarchd's: this command asks it, and has no --offline form";

/// Why the JIT caches' commands have no `--offline` form.
const JIT_IS_THE_DAEMONS: &str =
    "the JIT caches are gpuarchd's: this command asks it, and has no --offline form";

/// Run a parsed command line; the returned byte is the exit status.
pub fn run(cli: &Cli) -> Result<u8> {
    let mut out = String::new();
    let daemon = |offline: &str| Source::daemon(cli, offline);
    let code = match &cli.cmd {
        // Questions that need no GPU and no daemon.
        Cmd::Arch(a) => cmd::arch::run(cli.json, a, &mut out)?,
        Cmd::Inspect(args) => cmd::inspect::run(cli, args, &mut out)?,
        Cmd::Audit(args) => cmd::audit::run(cli, args, &mut out)?,
        Cmd::Engine(EngineCmd::Containerd(args)) => {
            cmd::engine::containerd(cli.json, args, &mut out)?
        }
        Cmd::Engine(EngineCmd::Docker(args)) => cmd::engine::docker(cli.json, args, &mut out)?,
        Cmd::Doctor(args) => cmd::doctor::run(cli, args, &mut out)?,
        Cmd::Why(args) => cmd::why::run(cli.json, args, &mut out)?,
        // A plan for a container's own config or env is made here.
        Cmd::Plan(args) if args.config.is_some() || !args.env.is_empty() => {
            cmd::plan::local(cli, args, &mut out)?
        }
        // Questions about the inventory: the daemon's, or --offline.
        Cmd::Status => cmd::status::run(cli.json, &Source::of(cli)?, &mut out)?,
        Cmd::Devices => cmd::devices::run(cli.json, &Source::of(cli)?, &mut out)?,
        Cmd::Match { requirement } => {
            cmd::matching::run(cli.json, &Source::of(cli)?, requirement, &mut out)?
        }
        Cmd::Labels => cmd::labels::run(cli.json, &Source::of(cli)?, &mut out)?,
        Cmd::Plan(args) => cmd::plan::run(cli, &Source::of(cli)?, args, &mut out)?,
        // What only gpuarchd can do.
        Cmd::Reload => cmd::reload::run(cli.json, daemon(RELOAD_IS_THE_DAEMONS)?, &mut out)?,
        Cmd::Prewarm(args) => {
            cmd::prewarm::run(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, args, &mut out)?
        }
        Cmd::Kernels(k) => match &k.cmd {
            None | Some(KernelsCmd::Ls) => {
                cmd::kernels::run(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, &mut out)?
            }
            Some(KernelsCmd::Push(args)) => {
                cmd::prewarm::push(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, args, &mut out)?
            }
            Some(KernelsCmd::Pull(args)) => cmd::prewarm::pull(
                cli.json,
                daemon(CACHE_IS_THE_DAEMONS)?,
                args,
                false,
                &mut out,
            )?,
            Some(KernelsCmd::Import(args)) => {
                cmd::prewarm::import(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, args, &mut out)?
            }
            Some(KernelsCmd::ImportWheel { wheel }) => cmd::prewarm::import_wheel(
                cli.json,
                daemon(CACHE_IS_THE_DAEMONS)?,
                wheel,
                &mut out,
            )?,
            Some(KernelsCmd::Unimport { name }) => {
                cmd::kernels::unimport(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, name, &mut out)?
            }
        },
        Cmd::Gc => cmd::gc::run(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, &mut out)?,
        Cmd::Slurm(SlurmCmd::Gres { write, node }) => {
            cmd::slurm::gres(cli, write.as_ref(), node.as_deref(), &mut out)?
        }
        Cmd::Slurm(SlurmCmd::TaskProlog) => cmd::slurm::task_prolog(cli.json, &mut out),
        Cmd::Jit(JitCmd::Ls) => cmd::jit::ls(cli.json, daemon(JIT_IS_THE_DAEMONS)?, &mut out)?,
        Cmd::Jit(JitCmd::Gc) => cmd::jit::gc(cli.json, daemon(JIT_IS_THE_DAEMONS)?, &mut out)?,
        Cmd::Verify => cmd::verify::run(cli.json, daemon(CACHE_IS_THE_DAEMONS)?, &mut out)?,
    };
    print!("{out}");
    Ok(code)
}
