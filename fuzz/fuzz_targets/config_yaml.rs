//! /etc/gpuarch/config.yaml.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = gpuarch_core::config::Config::from_yaml(s);
    }
});
