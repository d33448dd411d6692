//! gpuarchd and gpuarchctl. The daemon arrives with its own issue; for now
//! this crate holds gpuarchctl's offline commands.

pub mod ctl;
