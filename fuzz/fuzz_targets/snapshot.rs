//! /run/gpuarch/inventory.json, as the hook and gpuarchctl read it; what
//! parses must encode and parse again to the same snapshot.
#![no_main]
use libfuzzer_sys::fuzz_target;

use gpuarch_core::snapshot::Snapshot;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Snapshot::from_json(data) {
        let again =
            Snapshot::from_json(s.to_json_pretty().as_bytes()).expect("re-encoded snapshot parses");
        assert_eq!(again, s);
    }
});
