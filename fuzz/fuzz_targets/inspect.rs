//! Any file gpuarchctl inspect or the image audit reads: cubin, fatbin,
//! PTX, ELF library (fatbins in `.nv_fatbin` and in its data sections).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gpuarch_kernels::inspect::inspect(data);
    // What the image audit keeps of a file: each target once.
    let _ = gpuarch_kernels::inspect::summarize(data);
    let _ = gpuarch_kernels::inspect::cubin_target(data);
});
