//! `gpuarchctl verify`: every cached file against its sha256; gpuarchd
//! quarantines and rebuilds what is corrupt. Exit status 1 when any was.

use std::fmt::Write as _;

use anyhow::Result;
use gpuarch_wire::dbus::KernelCacheProxy;

use crate::render;
use crate::source::{BusError, Daemon};

pub fn run(json: bool, d: Daemon, out: &mut String) -> Result<u8> {
    let list = d.ask(async {
        let e = |e| BusError::of("verify", e);
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        kc.verify().await.map_err(e)
    })?;
    let bad: Vec<_> = list.iter().filter(|r| !r.ok).collect();
    if json {
        render::json(out, &render::records(&list)?)?;
    } else {
        let _ = writeln!(out, "{} builds checked, {} corrupt", list.len(), bad.len());
        for r in &bad {
            let _ = writeln!(
                out,
                "{} {}: {} (quarantined; rebuilding)",
                r.package, r.arch, r.problem
            );
        }
    }
    Ok(u8::from(!bad.is_empty()))
}
