//! The formats gpuarch's programs exchange, each defined once and used by
//! the side that writes it and the side that reads it.
//!
//! - [`dbus`] (feature `dbus`): the records of `io.gpuarch1` (devices,
//!   kernels, verification, JIT caches), a job's state, the bus names and the client
//!   proxies. gpuarchd serves these types and gpuarchctl reads them back.
//! - [`manifest`]: a kernel package's `manifest.json`, published by gpuarchd
//!   (or written by an admin) and read by the hook; a view's name;
//! - [`spool`]: the name of a build request the hook leaves for gpuarchd;
//! - [`library`]: a consumer library's tree for a set of GPUs, laid out by
//!   gpuarchd and mounted by the hook.
//!
//! Readers are strict: a field they do not know, or one that is missing, is
//! an error naming it, never a silent default. A format that changes gets a
//! new schema number (the manifest) or a new interface version (the bus).
#![forbid(unsafe_code)]

#[cfg(feature = "dbus")]
pub mod dbus;
pub mod library;
pub mod manifest;
pub mod spool;
