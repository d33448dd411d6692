//! gpuarch-core: the pure part of gpuarch.
//!
//! No I/O beyond parsing, no async runtime. Everything here is a function of
//! its inputs, so the hook, the daemon and the CLI agree by construction:
//!
//! - [`arch`]: compute capabilities and build targets, their syntax and the
//!   rules for what runs where;
//! - [`features`]: which capability each feature (bf16, FlashAttention-2, ...)
//!   needs, in one table;
//! - [`snapshot`]: the inventory snapshot format (schema 1);
//! - [`oci`]: the few fields of an OCI config that device selection reads;
//! - [`select`]: which GPUs a container was given;
//! - [`plan`]: what a container gets (env and notes);
//! - [`nvrequire`]: an image's `NVIDIA_REQUIRE_*`, checked per GPU as
//!   NVIDIA's legacy runtime checks them;
//! - [`requirement`]: the `Match` grammar (`arch>=8.0,feature=bf16`);
//! - [`config`]: the parts of `/etc/gpuarch/config.yaml` the Plan obeys;
//! - [`env`]: the names of the variables gpuarch injects;
//! - [`software`]: the consumers in a container's image, and what each of
//!   their releases accepts;
//! - [`toolkit`]: which architectures each CUDA release builds, and the
//!   container's own toolkit;
//! - [`jit`]: which per-architecture JIT cache a container gets;
//! - [`slurm`]: gres.conf lines by architecture, and Slurm's GPU numbering;
//! - [`nfd`]: Kubernetes node labels for Node Feature Discovery;
//! - [`text`]: one bounded line a record, whatever a message carries.
#![forbid(unsafe_code)]

pub mod arch;
pub mod audit;
pub mod config;
pub mod env;
pub mod features;
pub mod jit;
pub mod library;
pub mod nfd;
pub mod nvrequire;
pub mod oci;
pub mod plan;
pub mod record;
pub mod requirement;
pub mod select;
pub mod slurm;
pub mod snapshot;
pub mod software;
pub mod text;
pub mod toolkit;

pub use text::one_line;
