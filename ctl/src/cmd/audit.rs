//! `gpuarchctl audit PATH`: the CUDA binaries an image carries
//! (gpuarch-audit) and, for each GPU (this host's, `--devices` of them, or
//! `--cap`), whether it runs each one: from SASS, by PTX JIT, or not, and
//! the list to rebuild with.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use gpuarch_audit::Limits;
use gpuarch_container::rootfs::Root;
use gpuarch_core::arch::{CudaVersion, Placement};
use gpuarch_core::audit::ImageAudit;
use gpuarch_core::audit::{Judged, verdicts};
use gpuarch_core::oci::ContainerView;
use gpuarch_wire::dbus::InventoryProxy;
use serde_json::json;

use crate::cli::{AuditArgs, Cli, EXIT_NO};
use crate::render;
use crate::source::{BusError, Source};

pub fn run(cli: &Cli, args: &AuditArgs, out: &mut String) -> Result<u8> {
    if let Some(image) = &args.image {
        return ask(cli, image, args.devices.as_deref(), out);
    }
    let Some(path) = &args.path else {
        return Err(anyhow!("give PATH or --image"));
    };
    let (gpus, driver, no_gpus) =
        super::inspect::judges(cli, args.devices.as_deref(), args.cap.as_deref())?;
    let mut view = ContainerView::with_env(
        args.env
            .iter()
            .map(|e| {
                e.split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .ok_or_else(|| anyhow!("--env {e:?}: not NAME=VALUE"))
            })
            .collect::<Result<Vec<_>>>()?,
    );
    view.user = args.user.map(|u| (u, u));
    let root = Root::open(path).with_context(|| format!("{}", path.display()))?;
    let limits = Limits {
        deadline: Duration::from_secs(args.max_seconds.unwrap_or(300)),
        ..Limits::default()
    };
    let audit = gpuarch_audit::audit(gpuarch_container::image::Files::Root(&root), &view, &limits);
    // The list a rebuild for all of these GPUs takes.
    let archs = gpuarch_core::audit::rebuild_list(gpus.iter().map(|(_, c)| *c));
    // Per binary, its verdict on each GPU.
    let mut per_gpu: Vec<_> = gpus
        .iter()
        .map(|(_, c)| verdicts(&audit, *c, driver).into_iter())
        .collect();
    let judged: Vec<Vec<Judged>> = audit
        .binaries
        .iter()
        .map(|_| per_gpu.iter_mut().filter_map(Iterator::next).collect())
        .collect();
    let cannot = judged
        .iter()
        .any(|v| v.iter().any(|p| matches!(p, Judged::Is(Placement::No(_)))));
    if cli.json {
        render::json(
            out,
            &to_json(path, &audit, &gpus, &judged, &archs, driver, &no_gpus),
        )?;
    } else {
        text(out, path, &audit, &gpus, &judged, &archs, &no_gpus);
    }
    Ok(if cannot { EXIT_NO } else { 0 })
}

type Gpus = [(String, gpuarch_core::arch::ComputeCapability)];

fn to_json(
    path: &std::path::Path,
    audit: &ImageAudit,
    gpus: &Gpus,
    judged: &[Vec<Judged>],
    archs: &str,
    driver: Option<CudaVersion>,
    no_gpus: &Option<String>,
) -> serde_json::Value {
    json!({
        "path": path,
        "gpus": gpus.iter().map(|(l, c)| json!({"gpu": l, "capability": c.to_string()})).collect::<Vec<_>>(),
        "driver_cuda": driver.map(|d| d.to_string()),
        "no_gpus": no_gpus,
        "read": audit.read,
        "unread": audit.unread,
        "stopped": audit.stopped,
        "files": audit.files,
        "bytes": audit.bytes,
        "millis": audit.millis,
        "rebuild_arch_list": archs,
        "binaries": audit.binaries.iter().zip(judged).map(|(b, v)| json!({
            "path": b.path,
            "owner": b.owner,
            "size": b.size,
            "code": b.code,
            "gpus": gpus.iter().zip(v).map(|((l, _), p)| json!({
                "gpu": l,
                "runs": p.runs(),
                "how": p.to_string(),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

fn size(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

fn text(
    out: &mut String,
    path: &std::path::Path,
    audit: &ImageAudit,
    gpus: &Gpus,
    judged: &[Vec<Judged>],
    archs: &str,
    no_gpus: &Option<String>,
) {
    let _ = writeln!(
        out,
        "{}: read {}",
        path.display(),
        if audit.read.is_empty() {
            "nothing (no Python environment, library path or kernel cache found)".to_owned()
        } else {
            audit.read.join(", ")
        }
    );
    for (b, v) in audit.binaries.iter().zip(judged) {
        let _ = writeln!(
            out,
            "{} {} ({}): {}",
            b.owner,
            b.path,
            size(b.size),
            b.code.join(", ")
        );
        for ((label, _), p) in gpus.iter().zip(v) {
            match p {
                Judged::Is(Placement::No(_)) => {
                    let _ = writeln!(
                        out,
                        "  {label}: {p}; rebuild with TORCH_CUDA_ARCH_LIST=\"{archs}\""
                    );
                }
                Judged::Is(Placement::Jit(_)) => {
                    let _ = writeln!(
                        out,
                        "  {label}: {p} (the driver compiles it at its first load)"
                    );
                }
                Judged::Is(Placement::Sass(_)) | Judged::Other => {
                    let _ = writeln!(out, "  {label}: {p}");
                }
            }
        }
    }
    for u in &audit.unread {
        let _ = writeln!(out, "not read: {u}");
    }
    if let Some(s) = &audit.stopped {
        let _ = writeln!(
            out,
            "stopped {s}: the binaries above are some of the image's, not all"
        );
    }
    let _ = writeln!(
        out,
        "{} binaries with GPU code ({} files, {} read in {:.1} s)",
        audit.binaries.len(),
        audit.files,
        size(audit.bytes),
        audit.millis as f64 / 1000.0
    );
    for (i, (label, _)) in gpus.iter().enumerate() {
        let (mut sass, mut jit, mut no, mut other) = (0, 0, 0, 0);
        for v in judged {
            match v[i] {
                Judged::Is(Placement::Sass(_)) => sass += 1,
                Judged::Is(Placement::Jit(_)) => jit += 1,
                Judged::Is(Placement::No(_)) => no += 1,
                Judged::Other => other += 1,
            }
        }
        let verdict = if no > 0 {
            format!("cannot run {no} of them")
        } else {
            "runs all of them".to_owned()
        };
        let others = if other > 0 {
            format!(", {other} built only for other GPUs")
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "{label}: {verdict} ({sass} from SASS, {jit} by PTX JIT{others})"
        );
    }
    if let Some(why) = no_gpus {
        let _ = writeln!(out, "no GPU here to judge them against: {why}");
    }
}

/// `--image NAME`: gpuarchd's report from the audit it keeps.
fn ask(cli: &Cli, image: &str, devices: Option<&str>, out: &mut String) -> Result<u8> {
    let d = match Source::of(cli)? {
        Source::Daemon(d) => d,
        Source::Offline(_) => {
            return Err(anyhow!(
                "audit --image asks gpuarchd, which keeps the audits: not with --offline"
            ));
        }
    };
    let list: Vec<&str> = devices
        .map(|l| l.split(',').map(str::trim).collect())
        .unwrap_or_else(|| vec!["all"]);
    let report = d.ask(async {
        let e = |e| BusError::of("AuditImage", e);
        let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
        inv.audit_image(image, &list).await.map_err(e)
    })?;
    let doc: serde_json::Value = serde_json::from_str(&report)?;
    let runs = doc["runs"].as_bool().unwrap_or(false);
    if cli.json {
        render::json(out, &doc)?;
    } else {
        let _ = writeln!(
            out,
            "{image}: {} binaries with GPU code audited{}",
            doc["binaries"],
            doc["stopped"]
                .as_str()
                .map(|s| format!(" (stopped {s}: not all of them)"))
                .unwrap_or_default()
        );
        for g in doc["gpus"].as_array().into_iter().flatten() {
            let cannot = g["cannot"].as_array().map_or(0, Vec::len);
            let _ = writeln!(
                out,
                "{}: {}",
                g["gpu"].as_str().unwrap_or(""),
                if cannot == 0 {
                    "runs all of them".to_owned()
                } else {
                    format!("cannot run {cannot}")
                }
            );
            for n in g["cannot"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(g["jit"].as_array().into_iter().flatten())
                .chain(g["other"].as_array().into_iter().flatten())
            {
                let _ = writeln!(out, "  {}", n.as_str().unwrap_or(""));
            }
        }
    }
    Ok(if runs { 0 } else { EXIT_NO })
}
