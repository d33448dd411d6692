//! An OCI config.json as an engine hands it to the precreate hook or the
//! shim: parsed, planned on the mixed node, and edited.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let ctx = common::context();
    let _ = gpuarch_core::oci::ContainerView::from_json(data);
    if let Ok(mut value) = gpuarch_core::oci::parse_value(data) {
        if let Ok(plan) = gpuarch_container::edit(&mut value, &ctx) {
            // What comes out must encode again.
            serde_json::to_vec(&value).expect("edited config encodes");
            let _ = plan.is_noop();
        }
    }
});
