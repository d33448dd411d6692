//! `gpuarchctl why CONTAINER`: what a container got at its start (its GPUs,
//! env, mounts and the reasons), from the record the shim or the hook kept
//! ([`gpuarch_core::record`]). Read from the files alone: it answers with
//! gpuarchd down.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use gpuarch_core::record::{self, Record};
use serde_json::Value;

use crate::cli::WhyArgs;
use crate::render;

pub fn run(json: bool, args: &WhyArgs, out: &mut String) -> Result<u8> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => gpuarch_fs::config::read_config()?.hook.record_dir,
    };
    if !dir.is_dir() {
        bail!(
            "{} does not exist: gpuarch keeps what containers got only where it does (the package's tmpfiles.d makes it; `systemd-tmpfiles --create gpuarch.conf`)",
            dir.display()
        );
    }
    let found = record::find(&dir, &args.container)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    // The newest record of each container.
    let mut seen = std::collections::BTreeSet::new();
    let found: Vec<&Record> = found.iter().filter(|r| seen.insert(&r.id)).collect();
    match found.as_slice() {
        [] => {
            eprintln!(
                "gpuarchctl: no record of {:?} in {}: one is kept for each container that asked for a GPU since boot, until {} newer ones push it out or it is 30 days old",
                args.container,
                dir.display(),
                record::MAX_RECORDS
            );
            Ok(crate::cli::EXIT_NO)
        }
        [r] => {
            if json {
                render::json(out, r)?;
            } else {
                show(r, out);
            }
            Ok(0)
        }
        many => {
            let ids: Vec<String> = many.iter().map(|r| format!("  {}", label(r))).collect();
            bail!(
                "{:?} names {} containers; say which:\n{}",
                args.container,
                many.len(),
                ids.join("\n")
            )
        }
    }
}

fn label(r: &Record) -> String {
    let n = &r.names;
    let mut s = r.id.clone();
    if let Some(name) = &n.name {
        let _ = write!(s, " name {name}");
    }
    match (&n.namespace, &n.pod) {
        (Some(ns), Some(p)) => {
            let _ = write!(s, " pod {ns}/{p}");
        }
        (None, Some(p)) => {
            let _ = write!(s, " pod {p}");
        }
        _ => {}
    }
    s
}

fn show(r: &Record, out: &mut String) {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.at);
    let _ = writeln!(out, "container {}", label(r));
    let _ = writeln!(
        out,
        "started {} ({} ago), planned by {}",
        humantime::format_rfc3339_seconds(when),
        render::short_duration(when.elapsed().unwrap_or_default()),
        r.by
    );
    let p = &r.plan;
    let gpus = p.get("gpus").and_then(Value::as_array);
    match gpus {
        Some(g) if !g.is_empty() => {
            let src = p.get("source").and_then(Value::as_str).unwrap_or("?");
            let _ = writeln!(out, "GPUs (from {src}, in CUDA order):");
            let s = |g: &Value, k: &str| match g.get(k) {
                Some(Value::String(v)) => v.clone(),
                Some(v @ Value::Number(_)) => v.to_string(),
                _ => String::new(),
            };
            let rows: Vec<Vec<String>> = g
                .iter()
                .map(|g| {
                    let idx = match g.get("mig").and_then(Value::as_u64) {
                        Some(m) => format!("  {}:{m}", s(g, "index")),
                        None => format!("  {}", s(g, "index")),
                    };
                    vec![idx, s(g, "name"), s(g, "compute_capability"), s(g, "uuid")]
                })
                .collect();
            out.push_str(&render::table(&rows));
        }
        _ => out.push_str("GPUs: none\n"),
    }
    let env: Vec<(&str, &str)> = p
        .get("env")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("")))
        .collect();
    let list = |k: &str| -> Vec<String> {
        p.get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mounts = p.get("mounts").and_then(Value::as_array);
    match mounts {
        Some(m) if !m.is_empty() => {
            out.push_str("mounts (read-only):\n");
            for m in m {
                let f = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("");
                let _ = writeln!(out, "  {} from {}", f("destination"), f("source"));
            }
        }
        _ => out.push_str("mounts: none\n"),
    }
    let blocking = list("blocking");
    if !blocking.is_empty() {
        out.push_str("blocking (strict: true refuses such a start):\n");
        for b in &blocking {
            let _ = writeln!(out, "  - {b}");
        }
    }
    render::env_notes(env.into_iter(), &list("notes"), out);
}
