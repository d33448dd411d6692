//! gpuarch-kernels: kernel packages, build backends (NVRTC, command), the
//! content-addressed store and cubin/fatbin inspection.
//!
//! This crate is a shell for now; the kernel-cache issue fills it.
