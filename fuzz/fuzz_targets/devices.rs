//! Device selection strings: NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES,
//! CDI annotation values and gpuarchctl's --devices list, each planned on the
//! mixed node.
#![no_main]
use libfuzzer_sys::fuzz_target;

use gpuarch_core::config::EnvConfig;
use gpuarch_core::oci::ContainerView;
use gpuarch_core::{plan, select};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let inv = common::inventory();
    let cfg = EnvConfig::default();
    let _ = select::check_request_entry(s, &inv);
    let _ = plan::plan_request(s, &ContainerView::default(), &inv, &cfg);
    for view in [
        ContainerView {
            env: vec![("NVIDIA_VISIBLE_DEVICES".into(), s.into())],
            ..Default::default()
        },
        ContainerView {
            env: vec![
                ("NVIDIA_VISIBLE_DEVICES".into(), "all".into()),
                ("CUDA_VISIBLE_DEVICES".into(), s.into()),
            ],
            ..Default::default()
        },
        ContainerView {
            annotations: [("cdi.k8s.io/gpu".to_owned(), s.to_owned())].into(),
            ..Default::default()
        },
        ContainerView {
            devices: vec![gpuarch_core::oci::DeviceNode::path(s)],
            ..Default::default()
        },
    ] {
        let p = plan::plan(&view, &inv, &cfg);
        let _ = p.is_noop();
    }
});
