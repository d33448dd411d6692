//! `gpuarchctl why CONTAINER`: what a container got at its start (its GPUs,
//! env, mounts and the reasons), from the record the shim or the hook kept
//! ([`gpuarch_core::record`]). Read from the files alone: it answers with
//! gpuarchd down.

use std::fmt::Write as _;

use anyhow::{Result, bail};
use gpuarch_core::record::{self, Record};
use serde_json::Value;

use crate::cli::WhyArgs;
use crate::render::{self, shown};

pub fn run(json: bool, args: &WhyArgs, out: &mut String) -> Result<u8> {
    let dir = match &args.dir {
        Some(d) => d.clone(),
        // Where the hook keeps records, as the hook reads the config: with
        // the file invalid, gpuarchd's last valid one (whose records are
        // the ones asked about).
        None => {
            let l = gpuarch_fs::config::read_config_or_last_good();
            if let Some(e) = l.error {
                bail!("{e}");
            }
            l.config.hook.record_dir
        }
    };
    if !dir.is_dir() {
        bail!(
            "{} does not exist: gpuarch keeps what containers got only where it does (the package's tmpfiles.d makes it; `systemd-tmpfiles --create gpuarchd.conf`)",
            dir.display()
        );
    }
    let found = gpuarch_fs::record::find(&dir, &args.container).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            // Group gpuarch may call gpuarchd, but the records hold every
            // container's env and are root's alone (mode 0700).
            anyhow::anyhow!(
                "{}: permission denied: the records hold every container's env and are root's alone (mode 0700); run `sudo gpuarchctl why {}`",
                dir.display(),
                args.container
            )
        } else {
            anyhow::anyhow!("{}: {e}", dir.display())
        }
    })?;
    // Docker gives the runtime no names: a name is asked of Docker, and its
    // container's record looked up by id.
    let mut docker_said = None;
    let found = if found.is_empty() {
        match crate::docker_api::container_id(&args.container) {
            Ok(id) => gpuarch_fs::record::find(&dir, &id)
                .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?,
            Err(e) => {
                docker_said = Some(e.to_string());
                found
            }
        }
    } else {
        found
    };
    // The newest record of each container.
    let mut seen = std::collections::BTreeSet::new();
    let found: Vec<&Record> = found.iter().filter(|r| seen.insert(&r.id)).collect();
    match found.as_slice() {
        [] => {
            eprintln!(
                "gpuarchctl: no record of {:?} in {}: one is kept for each container that asked for a GPU since boot, until {} newer ones push it out or it is 30 days old{}",
                args.container,
                dir.display(),
                record::MAX_RECORDS,
                docker_said
                    .map(|d| format!(" (as a Docker or podman name: {d})"))
                    .unwrap_or_default()
            );
            if json {
                render::json(out, &serde_json::json!({"records": []}))?;
            }
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

/// The record's id and names, [`render::shown`]: the names come from the
/// container's annotations.
fn label(r: &Record) -> String {
    let n = &r.names;
    let mut s = shown(&r.id).into_owned();
    if let Some(name) = &n.name {
        let _ = write!(s, " name {}", shown(name));
    }
    match (&n.namespace, &n.pod) {
        (Some(ns), Some(p)) => {
            let _ = write!(s, " pod {}/{}", shown(ns), shown(p));
        }
        (None, Some(p)) => {
            let _ = write!(s, " pod {}", shown(p));
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
        shown(&r.by)
    );
    let p = &r.plan;
    let gpus = p.get("gpus").and_then(Value::as_array);
    match gpus {
        Some(g) if !g.is_empty() => {
            let src = p.get("source").and_then(Value::as_str).unwrap_or("?");
            let _ = writeln!(out, "GPUs (from {}, in CUDA order):", shown(src));
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
                let _ = writeln!(
                    out,
                    "  {} from {}",
                    shown(f("destination")),
                    shown(f("source"))
                );
            }
        }
        _ => out.push_str("mounts: none\n"),
    }
    let blocking = list("blocking");
    if !blocking.is_empty() {
        out.push_str("blocking (strict: true refuses such a start):\n");
        for b in &blocking {
            let _ = writeln!(out, "  - {}", shown(b));
        }
    }
    render::env_notes(env.into_iter(), &list("notes"), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an image author and a pod's author control, each with a
    /// newline, a carriage return and escape sequences.
    const FORGED: &str = "x\nstarted by root\r\u{1b}[2J\u{1b}]0;owned\u{7}\u{9b}31m";

    #[test]
    fn a_forged_record_prints_no_control_character_and_no_line_of_its_own() {
        let plan = serde_json::json!({
            "source": "NVIDIA_VISIBLE_DEVICES",
            "gpus": [{"index": 0, "name": FORGED, "compute_capability": "8.6", "uuid": FORGED}],
            "env": {"TORCH_CUDA_ARCH_LIST": FORGED},
            "notes": [FORGED, format!("the image holds torch 2.7.1 ({FORGED:?})")],
            "mounts": [{"destination": FORGED, "source": FORGED}],
            "blocking": [FORGED],
        });
        let r = Record {
            id: format!("abc{FORGED}"),
            names: gpuarch_core::oci::Names {
                id: None,
                name: Some(FORGED.to_owned()),
                pod: Some(FORGED.to_owned()),
                namespace: Some(FORGED.to_owned()),
            },
            by: FORGED.to_owned(),
            at: 0,
            plan,
        };
        let mut out = String::new();
        show(&r, &mut out);
        let bad: Vec<char> = out
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(bad.is_empty(), "{bad:?} in:\n{out}");
        // container, started; GPUs, mounts, blocking and env a header and
        // a line each; notes a header and two: none forged.
        assert_eq!(out.lines().count(), 13, "{out}");
        assert!(
            !out.lines().any(|l| l.starts_with("started by root")),
            "{out}"
        );
        assert!(label(&r).lines().count() == 1);
    }
}
