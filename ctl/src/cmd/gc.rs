//! `gpuarchctl gc`: evict the least recently used builds above the limit.

use std::fmt::Write as _;

use anyhow::Result;
use gpuarch_wire::dbus::KernelCacheProxy;
use serde_json::json;

use crate::render::bytes;
use crate::source::{BusError, Daemon};

pub fn run(json: bool, d: Daemon, out: &mut String) -> Result<u8> {
    let freed = d.ask(async {
        let e = |e| BusError::of("gc", e);
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        kc.garbage_collect().await.map_err(e)
    })?;
    if json {
        let _ = writeln!(out, "{}", json!({"freed_bytes": freed}));
    } else {
        let _ = writeln!(out, "freed {}", bytes(freed));
    }
    Ok(0)
}
