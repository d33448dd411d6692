//! A kernel package's kernel.yaml, with every source it names present.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() > 1 << 20 {
        return; // Package::load refuses more before parsing
    }
    let _ = gpuarch_kernels::spec::Package::parse(
        std::path::Path::new("/fuzz/pkg"),
        data.to_vec(),
        |_| Ok(b"__global__ void k() {}\n".to_vec()),
    );
});
