//! `gpuarchctl kernels`: the kernel cache, one line per build; and
//! `kernels unimport`.

use std::fmt::Write as _;

use anyhow::Result;
use gpuarch_wire::dbus::KernelCacheProxy;
use serde_json::json;

use crate::render::{self, bytes};
use crate::source::{BusError, Daemon};

pub fn run(json: bool, d: Daemon, out: &mut String) -> Result<u8> {
    let (mut list, used, limit, compiler) = d.ask(async {
        let e = |e| BusError::of("kernels", e);
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        let list = kc.list_kernels().await.map_err(e)?;
        Ok((
            list,
            kc.used_bytes().await.map_err(e)?,
            kc.limit_bytes().await.map_err(e)?,
            kc.compiler().await.map_err(e)?,
        ))
    })?;
    if json {
        render::json(
            out,
            &json!({"used_bytes": used, "limit_bytes": limit, "compiler": compiler, "kernels": render::records(&list)?}),
        )?;
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "cache: {} of {} used, {} builds",
        bytes(used),
        bytes(limit),
        list.len()
    );
    match compiler.strip_prefix("none: ") {
        Some(why) => {
            let _ = writeln!(
                out,
                "compiler: none; no NVRTC builds possible: {}",
                render::shown(why)
            );
        }
        None => {
            let _ = writeln!(out, "compiler: {compiler}");
        }
    }
    let _ = writeln!(
        out,
        "{:<10} {:<8} {:<8} {:<9} {:>9}  {:<6} {:<6} KEY",
        "PACKAGE", "ARCH", "VARIANT", "DTYPE", "SIZE", "PINNED", "IN USE"
    );
    list.sort_by(|a, b| (&a.package, &a.arch).cmp(&(&b.package, &b.arch)));
    let yes = |b: bool| if b { "yes" } else { "no" };
    for k in &list {
        let _ = writeln!(
            out,
            "{:<10} {:<8} {:<8} {:<9} {:>9}  {:<6} {:<6} {}",
            render::shown(&k.package),
            render::shown(&k.arch),
            render::shown(&k.variant),
            render::shown(&k.dtype),
            bytes(k.bytes),
            yes(k.pinned),
            yes(k.in_use),
            k.key.get(..12).unwrap_or(&k.key),
        );
    }
    Ok(0)
}

pub fn unimport(json: bool, d: Daemon, name: &str, out: &mut String) -> Result<u8> {
    let files = d.ask(async {
        let e = |e| BusError::of("unimport", e);
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        kc.remove_import(name).await.map_err(e)
    })?;
    if json {
        render::json(out, &json!({"removed": name, "files": files}))?;
    } else {
        let _ = writeln!(
            out,
            "removed import {name}: {files} file(s) unpinned; running containers keep what they mount"
        );
    }
    Ok(0)
}
