//! `gpuarchctl jit ls|gc`: the per-architecture JIT caches gpuarchd keeps.

use std::fmt::Write as _;

use anyhow::Result;
use gpuarch_wire::dbus::JitCacheProxy;
use serde_json::json;

use crate::render::{self, bytes};
use crate::source::{BusError, Daemon};

/// One line per cache: whose, for which targets, how big, whether mounted.
pub fn ls(json: bool, d: Daemon, out: &mut String) -> Result<u8> {
    let (list, used, limit) = d.ask(async {
        let e = |e| BusError::of("jit ls", e);
        let p = d.proxy::<JitCacheProxy>().await.map_err(e)?;
        let list = p.list_caches().await.map_err(e)?;
        Ok((
            list,
            p.used_bytes().await.map_err(e)?,
            p.limit_bytes().await.map_err(e)?,
        ))
    })?;
    if json {
        render::json(
            out,
            &json!({"used_bytes": used, "limit_bytes": limit, "caches": render::records(&list)?}),
        )?;
        return Ok(0);
    }
    let _ = writeln!(
        out,
        "JIT caches: {} of {} used, {} caches",
        bytes(used),
        bytes(limit),
        list.len()
    );
    let _ = writeln!(
        out,
        "{:<8} {:<10} {:<28} {:>9}  {:<6} {:<20} FOR",
        "UID", "SCOPE", "TARGETS", "SIZE", "IN USE", "LAST STARTED"
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    for c in &list {
        let what = if !c.image.is_empty() {
            format!("image {}", c.image)
        } else if !c.namespace.is_empty() {
            format!("namespace {}", c.namespace)
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            out,
            "{:<8} {:<10} {:<28} {:>9}  {:<6} {:<20} {what}",
            c.uid,
            if c.kind.is_empty() { "?" } else { &c.kind },
            c.targets,
            bytes(c.bytes),
            yes(c.in_use),
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(c.last_used)
            ),
        );
    }
    Ok(0)
}

/// Remove the least recently started caches above the limit now.
pub fn gc(json: bool, d: Daemon, out: &mut String) -> Result<u8> {
    let freed = d.ask(async {
        let e = |e| BusError::of("jit gc", e);
        let p = d.proxy::<JitCacheProxy>().await.map_err(e)?;
        p.garbage_collect().await.map_err(e)
    })?;
    if json {
        let _ = writeln!(out, "{}", json!({"freed_bytes": freed}));
    } else {
        let _ = writeln!(out, "freed {}", bytes(freed));
    }
    Ok(0)
}
