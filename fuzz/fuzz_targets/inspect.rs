//! Any file gpuarchctl inspect is pointed at: cubin, fatbin, PTX, ELF library.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gpuarch_kernels::inspect::inspect(data);
    let _ = gpuarch_kernels::inspect::cubin_target(data);
});
