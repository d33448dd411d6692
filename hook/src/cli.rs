//! The command lines of gpuarch-hook and gpuarch-runtime, as clap commands.
//!
//! gpuarch-hook parses its arguments with [`hook_command`]. gpuarch-runtime
//! cannot: every argument belongs to the runtime behind it and is passed on
//! untouched, so [`runtime_command`] only describes it, for its man page.
//! Both feed the man pages the package ships, so what `--help` says and what
//! `man` says come from one place.

use clap::{Arg, Command};

use gpuarch_container::stage;

const FILES_AND_ENV: &str = "Config: GPUARCH_CONFIG, else /etc/gpuarch/config.yaml (absent: defaults). \
Inventory: GPUARCH_INVENTORY, else /run/gpuarch/inventory.json (written by gpuarchd), else NVML \
(GPUARCH_NVML_LIB, else libnvidia-ml.so.1). Logs go to the journal when it is there, else stderr.";

/// `gpuarch-hook`: one subcommand per OCI hook stage it serves.
pub fn hook_command() -> Command {
    Command::new("gpuarch-hook")
        .version(env!("CARGO_PKG_VERSION"))
        .about("OCI hook: give one container the Plan for the GPUs it was assigned")
        .long_about(
            "OCI hook: give one container the Plan for the GPUs it was assigned: \
TORCH_CUDA_ARCH_LIST, dtype and attention hints, and read-only mounts of the kernels built for \
its GPUs' architectures. Container engines run it; people rarely do.\n\n\
Fail open: on any error, or when NVML (asked only without gpuarchd's snapshot) or an \
in-container stage takes longer than hook.timeout_ms, the container starts unchanged and the \
reason is logged; with strict: true in the config the hook exits 1 with a one-line reason \
instead, and the engine refuses the start.",
        )
        .after_help(FILES_AND_ENV)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(Command::new("precreate").about(
            "podman's hooks.d precreate stage: the proposed OCI config on stdin, the config \
with the Plan applied on stdout (env, mounts, and a createContainer entry where mounted \
libraries need ldconfig)",
        ))
        .subcommand(Command::new(stage::CREATE_CONTAINER).about(
            "OCI createContainer stage: the state on stdin; writes the Plan into the container \
as /run/gpuarch/env and /etc/profile.d/gpuarch.sh, bind-mounts the kernel packages read-only \
when no earlier stage did, and runs ldconfig for mounted libraries",
        ))
        .subcommand(Command::new(stage::PRESTART).about(
            "OCI prestart stage (deprecated by the OCI spec; for runtimes without \
createContainer): as create-container, from the runtime's namespace",
        ))
}

/// `gpuarch-runtime`: documented, never parsed (its arguments are runc's).
pub fn runtime_command() -> Command {
    Command::new("gpuarch-runtime")
        .version(env!("CARGO_PKG_VERSION"))
        .about("OCI runtime shim: apply the gpuarch Plan, then run runc or crun")
        .long_about(
            "OCI runtime shim for engines that can neither run a precreate hook nor edit the \
config (Docker, containerd, CRI-O runtime handlers). On create and run it applies the Plan to \
the bundle's config.json (env, read-only kernel mounts, a createContainer entry for ldconfig), \
then executes the real runtime with exactly the arguments it was given. Every other \
subcommand goes straight through; the exit status is the runtime's.\n\n\
The runtime is runtime.path in the config, else the first of runc and crun on PATH. \
Fail open: on any error, or when NVML (asked only without gpuarchd's snapshot) does not \
answer within hook.timeout_ms, the runtime runs on the original bundle and the reason is \
logged; with strict: true the shim exits 1 instead. gpuarch-runtime does \
not parse --help or --version itself: they are the runtime's.",
        )
        .after_help(FILES_AND_ENV)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(
            Arg::new("runtime-args")
                .value_name("RUNTIME-ARGS")
                .num_args(0..)
                .trailing_var_arg(true)
                .allow_hyphen_values(true)
                .help("The runtime's arguments, passed on unchanged (global options, then the subcommand: create, run, start, kill, delete, state, ...)"),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_command_is_consistent_and_names_every_stage() {
        hook_command().debug_assert();
        runtime_command().debug_assert();
        let names: Vec<String> = hook_command()
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        assert_eq!(names, ["precreate", "create-container", "prestart"]);
    }

    #[test]
    fn runtime_arguments_are_taken_verbatim() {
        let m = runtime_command()
            .try_get_matches_from([
                "gpuarch-runtime",
                "--root",
                "/r",
                "create",
                "--bundle",
                "b",
                "x",
            ])
            .unwrap();
        let got: Vec<&String> = m.get_many("runtime-args").unwrap().collect();
        assert_eq!(got, ["--root", "/r", "create", "--bundle", "b", "x"]);
    }
}
