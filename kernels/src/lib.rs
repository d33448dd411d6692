//! gpuarch-kernels: kernel packages, their builds, and the store that keeps
//! them.
//!
//! - [`error`]: how a build fails, for every backend;
//! - [`spec`]: `kernel.yaml` packages and where they are found;
//! - [`toolchain`]: NVRTC (through cudarc) and the CUDA headers and tools;
//! - [`command`]: the `command` backend;
//! - [`store`]: the content-addressed store (atomic entries, one build per
//!   key across processes, verification, quarantine, LRU with pins);
//! - [`build`]: variant choice and fallback for one package and arch;
//! - [`inspect`]: what a cubin, fatbin, PTX file or library really carries;
//! - [`file`]: stored files digested and inspected without being held;
//! - [`publish`]: the manifests the hook reads, one per package, each arch
//!   naming the verified entry that serves it;
//! - [`remote`]: the contract of the registry tier (`kernels.remote`); its
//!   client is the `gpuarch-registry` crate;
//! - [`import`]: prebuilt libraries an admin imports, served by what they carry;
//! - [`library`]: consumers' own kernel libraries (FlashInfer's cubins),
//!   imported from their wheels and served per set of GPUs.

pub mod build;
pub mod command;
pub mod error;
pub mod file;
pub mod import;
pub mod inspect;
pub mod library;
pub mod publish;
pub mod remote;
pub mod spec;
pub mod store;
pub mod toolchain;
pub mod worker;
