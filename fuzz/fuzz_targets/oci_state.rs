//! The OCI state a runtime passes to the createContainer/prestart stages.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = gpuarch_container::stage::State::parse(data);
});
