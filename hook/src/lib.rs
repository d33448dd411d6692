//! gpuarch-hook: applies a [`gpuarch_core::plan::Plan`] to an OCI container.
//!
//! This crate is a shell for now. The `gpuarch-hook` and `gpuarch-runtime`
//! binaries arrive with the container-hook issue; they stay synchronous (no
//! tokio, no D-Bus on the hot path) and read the inventory snapshot.
