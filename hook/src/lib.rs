//! gpuarch-hook and gpuarch-runtime: apply a [`gpuarch_core::plan::Plan`] to
//! one container.
//!
//! Synchronous, no tokio, no D-Bus: this runs on every container start.
//! Configs are edited as JSON values so that every field gpuarch does not
//! own comes out as it came in.
//!
//! Three ways in, one edit ([`edit`]):
//! - [`precreate`]: podman's hooks.d `precreate` stage, config on stdin;
//! - [`shim`]: `gpuarch-runtime`, in front of runc/crun, edits the bundle's
//!   `config.json` on `create`/`run`;
//! - [`stage`]: `create-container`/`prestart`, inside the container's mount
//!   namespace, writes `/run/gpuarch/env` and `/etc/profile.d/gpuarch.sh`.

pub mod budget;
pub mod cli;
pub mod context;
pub mod edit;
mod exec;
pub mod image;
pub mod jit;
pub mod kernels;
pub mod ldconfig;
pub mod log;
pub mod rootfs;
pub mod shim;
pub mod stage;

pub use context::{
    Context, HOOK_ENV_VARS, SAFE_PATH, load_config, load_context, load_context_within,
    read_at_most, read_config_file,
};
pub use edit::{HookError, edit, precreate};
