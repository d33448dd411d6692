//! `gpuarchctl match REQUIREMENT`: the UUIDs of the GPUs that meet it.

use std::fmt::Write as _;

use anyhow::Result;
use gpuarch_core::requirement;
use gpuarch_wire::dbus::InventoryProxy;
use serde_json::json;

use crate::cli::EXIT_NO;
use crate::render;
use crate::source::{BusError, Source};

pub fn run(json: bool, src: &Source, requirement: &str, out: &mut String) -> Result<u8> {
    let uuids = match src {
        Source::Daemon(d) => d.ask(async {
            let e = |e| BusError::of("match", e);
            let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
            inv.match_devices(requirement).await.map_err(e)
        })?,
        Source::Offline(o) => requirement::match_uuids(requirement, &o.inventory()?.0)?,
    };
    if json {
        render::json(out, &json!({"requirement": requirement, "uuids": uuids}))?;
    } else {
        for u in &uuids {
            let _ = writeln!(out, "{u}");
        }
    }
    Ok(if uuids.is_empty() { EXIT_NO } else { 0 })
}
