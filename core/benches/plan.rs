//! The Plan on the hook's hot path, against a baseline measured in the same
//! process: parsing the same OCI config into a `serde_json::Value`, which the
//! hook must do anyway to rewrite it. Prints per-iteration times and the ratio.
//!
//! cargo bench -p gpuarch-core --bench plan

mod common;

use std::hint::black_box;

use common::time;

use gpuarch_core::config::EnvConfig;
use gpuarch_core::oci::ContainerView;
use gpuarch_core::plan;
use gpuarch_core::snapshot::Snapshot;

/// A podman-sized config.json: 40 env entries, mounts, devices, annotations.
fn config() -> String {
    let env: Vec<String> = (0..40)
        .map(|i| format!("\"VAR_{i}=value-{i}\""))
        .chain(["\"NVIDIA_VISIBLE_DEVICES=0,1\"".to_owned()])
        .collect();
    let mounts: Vec<String> = (0..20)
        .map(|i| {
            format!(
                "{{\"destination\": \"/mnt/{i}\", \"type\": \"bind\", \"source\": \"/srv/{i}\", \"options\": [\"rbind\", \"ro\"]}}"
            )
        })
        .collect();
    format!(
        r#"{{"ociVersion": "1.2.0", "process": {{"args": ["python", "train.py"], "env": [{}], "cwd": "/"}},
            "root": {{"path": "rootfs"}}, "mounts": [{}],
            "annotations": {{"io.podman.annotations.label": "x", "org.opencontainers.image.ref.name": "pytorch"}},
            "linux": {{"devices": [{{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}}],
                      "namespaces": [{{"type": "pid"}}, {{"type": "mount"}}]}}}}"#,
        env.join(", "),
        mounts.join(", ")
    )
}

fn main() {
    let cfg = config();
    let inv_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/8xh100.json");
    let inv = Snapshot::from_json(&std::fs::read(inv_path).expect("fixture")).expect("snapshot");
    let env_cfg = EnvConfig::default();
    let iters = 20_000;

    let base = time(iters, || {
        let v: serde_json::Value = serde_json::from_str(black_box(&cfg)).expect("json");
        black_box(v);
    });
    let planned = time(iters, || {
        let view = ContainerView::from_json(black_box(cfg.as_bytes())).expect("view");
        black_box(plan::plan(&view, &inv, &env_cfg));
    });
    let plan_only = {
        let view = ContainerView::from_json(cfg.as_bytes()).expect("view");
        time(iters, || {
            black_box(plan::plan(black_box(&view), &inv, &env_cfg));
        })
    };
    println!(
        "config: {} bytes; inventory: 8 GPUs; {iters} iterations each",
        cfg.len()
    );
    println!("baseline  parse config.json to Value : {base:>10.2?}");
    println!(
        "view + plan                          : {planned:>10.2?}  ({:.2}x baseline)",
        planned.as_secs_f64() / base.as_secs_f64()
    );
    println!(
        "plan alone (view already read)       : {plan_only:>10.2?}  ({:.2}x baseline)",
        plan_only.as_secs_f64() / base.as_secs_f64()
    );
}
