//! `gpuarchctl devices`: the GPUs and MIG devices of this node.

use std::fmt::Write as _;

use anyhow::Result;

use crate::render::{bytes, table};
use crate::source::Source;

pub fn run(json: bool, src: &Source, out: &mut String) -> Result<u8> {
    let (snap, from) = src.inventory()?;
    if json {
        out.push_str(&snap.to_json_pretty());
        out.push('\n');
        return Ok(0);
    }
    let mut rows = vec![
        [
            "GPU",
            "MINOR",
            "CC",
            "ARCH",
            "NAME",
            "MEMORY",
            "PCI BUS ID",
            "UUID",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for d in &snap.devices {
        let cc = d.compute_capability;
        let arch = cc.arch_name().unwrap_or("?").to_owned();
        rows.push(vec![
            d.index.to_string(),
            d.minor.to_string(),
            cc.to_string(),
            arch.clone(),
            d.name.clone(),
            bytes(d.memory_bytes),
            d.pci_bus_id.clone(),
            d.uuid.clone(),
        ]);
        for m in &d.mig {
            rows.push(vec![
                format!("{}:{}", d.index, m.index),
                String::new(),
                cc.to_string(),
                arch.clone(),
                m.name.clone(),
                bytes(m.memory_bytes),
                String::new(),
                m.uuid.clone(),
            ]);
        }
    }
    if snap.devices.is_empty() {
        out.push_str("no GPUs\n");
    } else {
        out.push_str(&table(&rows));
    }
    let _ = writeln!(
        out,
        "\n{} GPU(s) from {from}; driver {}, CUDA {}; read {}{}",
        snap.devices.len(),
        snap.driver_version,
        snap.cuda_driver_version,
        snap.generated_at,
        if snap.stale {
            " (STALE: the daemon's last refresh failed)"
        } else {
            ""
        }
    );
    Ok(0)
}
