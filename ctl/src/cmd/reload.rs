//! `gpuarchctl reload`: gpuarchd re-reads its config and NVML now.

use anyhow::Result;
use gpuarch_wire::dbus::DaemonProxy;

use crate::source::{BusError, Daemon};

pub fn run(json: bool, d: Daemon, out: &mut String) -> Result<u8> {
    d.ask(async {
        let e = |e| BusError::of("reload", e);
        d.proxy::<DaemonProxy>()
            .await
            .map_err(e)?
            .reload()
            .await
            .map_err(e)
    })?;
    if json {
        crate::render::json(out, &serde_json::json!({"reloaded": true}))?;
    } else {
        out.push_str("reloaded\n");
    }
    Ok(0)
}
