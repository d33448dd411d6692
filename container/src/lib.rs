//! gpuarch-container: the edit of one container by a
//! [`gpuarch_core::plan::Plan`], for every way in: gpuarch-hook and
//! gpuarch-runtime (their programs are the `gpuarch-hook` crate's), and
//! gpuarchd's NRI plugin. [`run`] is every start's policy.
//!
//! Synchronous, no tokio, no D-Bus: this runs on every container start.
//! Configs are edited as JSON values so that every field gpuarch does not
//! own comes out as it came in.
//!
//! Three ways in, one [`edit::Edit`] made per start ([`edit::make`]) and
//! written into the OCI config ([`edit::apply`]); gpuarchd's NRI plugin
//! turns the same Edit into an adjustment:
//! - [`precreate`]: podman's hooks.d `precreate` stage, config on stdin;
//! - [`shim`]: `gpuarch-runtime`, in front of runc/crun, edits the bundle's
//!   `config.json` on `create`/`run`;
//! - [`stage`]: `create-container`/`prestart`, inside the container's mount
//!   namespace, writes `/run/gpuarch/env` and `/etc/profile.d/gpuarch.sh`.

pub mod audit;
pub mod budget;
pub mod context;
pub mod edit;
mod exec;
pub mod image;
pub mod jit;
pub mod kernels;
pub mod ldconfig;
pub mod library;
pub mod log;
pub mod nvml;
pub mod rootfs;
pub mod run;
pub mod shim;
pub mod stage;

pub use context::{
    Context, HOOK_ENV_VARS, SAFE_PATH, load_context, read_at_most, read_config_file,
    read_file_at_most,
};
pub use edit::{HookError, edit, precreate};

/// Keep what container `id` got for `gpuarchctl why`
/// ([`gpuarch_core::record`]): only for a container that asked for a GPU,
/// only when `dir` exists. With `only_first`, a record already there for
/// the id (precreate's, the shim's) stays. Never fails a start.
pub fn keep_record(
    dir: &std::path::Path,
    id: Option<&str>,
    by: &str,
    plan: &gpuarch_core::plan::Plan,
    only_first: bool,
) {
    use gpuarch_core::record;
    if plan.source.is_none() && plan.blocking.is_empty() {
        return;
    }
    let Some(id) = id.or(plan.container.id.as_deref()) else {
        log::debug("the engine gave no container id: no record for gpuarchctl why");
        return;
    };
    if !dir.is_dir() {
        return;
    }
    if let Err(e) = gpuarch_fs::record::keep(dir, &record::Record::new(id, by, plan), only_first) {
        log::warn(&format!(
            "{}: {e}; gpuarchctl why will not know this container",
            dir.display()
        ));
    }
}
