//! gpuarchd and gpuarchctl. The daemon arrives with its own issue; this crate
//! holds gpuarchctl's offline commands for now.
