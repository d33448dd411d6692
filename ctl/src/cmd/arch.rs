//! `gpuarchctl arch check|parse|features|toolkit`: questions about
//! capabilities, build targets and toolkits, answered from core's rules
//! alone.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use gpuarch_core::arch::{ArchList, CodeKind, ComputeCapability, CudaVersion, Target};
use gpuarch_core::features::Feature;
use serde_json::json;

use crate::cli::{ArchCmd, EXIT_NO};
use crate::render::{self, table};

/// A device's capability as `8.6`, `sm_86` or any target naming it.
pub fn parse_device_cap(s: &str) -> Result<ComputeCapability> {
    if let Ok(c) = ComputeCapability::parse_reported(s) {
        return Ok(c);
    }
    let t = Target::parse(s).map_err(|e| anyhow!("--on: {e}"))?;
    Ok(t.cap)
}

pub fn run(json: bool, cmd: &ArchCmd, out: &mut String) -> Result<u8> {
    match cmd {
        ArchCmd::Check {
            targets,
            on,
            driver_cuda,
            ptx_cuda,
        } => {
            let list = ArchList::parse(targets)?;
            let device = parse_device_cap(on)?;
            let ver = |v: &Option<String>, flag: &str| -> Result<Option<CudaVersion>> {
                v.as_deref()
                    .map(CudaVersion::parse)
                    .transpose()
                    .map_err(|e| anyhow!("{flag}: {e}"))
            };
            let driver = ver(driver_cuda, "--driver-cuda")?;
            let ptx = ver(ptx_cuda, "--ptx-cuda")?;
            let verdicts: Vec<(Target, _)> = list
                .targets()
                .map(|t| (*t, t.check(device, driver, ptx)))
                .collect();
            let runs = verdicts.iter().any(|(_, v)| v.runs);
            if json {
                let targets: Vec<_> = verdicts
                    .iter()
                    .map(|(t, v)| {
                        json!({"target": t.to_string(), "runs": v.runs, "jit": v.jit, "reason": v.reason})
                    })
                    .collect();
                render::json(
                    out,
                    &json!({"device": device.to_string(), "runs": runs, "targets": targets}),
                )?;
            } else {
                for (_, v) in &verdicts {
                    let _ = writeln!(out, "{}: {}", if v.runs { "yes" } else { "no " }, v.reason);
                }
                let _ = writeln!(
                    out,
                    "{list} on {device}: {}",
                    if runs { "runs" } else { "does NOT run" }
                );
            }
            Ok(if runs { 0 } else { EXIT_NO })
        }
        ArchCmd::Parse { list } => {
            let l = ArchList::parse(list)?;
            if json {
                let targets: Vec<String> = l.targets().map(Target::to_string).collect();
                render::json(
                    out,
                    &json!({"canonical": l.to_string(), "targets": targets}),
                )?;
            } else {
                let _ = writeln!(out, "{l}");
                for t in l.targets() {
                    let kind = match t.kind {
                        CodeKind::Sass => "SASS",
                        CodeKind::Ptx => "PTX",
                    };
                    let _ = writeln!(
                        out,
                        "  {:<14} {kind:<4}  {}",
                        t.to_string(),
                        t.cap.arch_name().unwrap_or("?")
                    );
                }
            }
            Ok(0)
        }
        ArchCmd::Features { cap } => {
            let c = parse_device_cap(cap)?;
            if json {
                let feats: serde_json::Map<String, serde_json::Value> = Feature::ALL
                    .iter()
                    .map(|f| (f.name().to_owned(), json!(f.supported_on(c))))
                    .collect();
                render::json(
                    out,
                    &json!({"compute_capability": c.to_string(), "arch": c.arch_name(), "features": feats}),
                )?;
            } else {
                let rows: Vec<Vec<String>> = Feature::ALL
                    .iter()
                    .map(|f| {
                        vec![
                            f.name().to_owned(),
                            if f.supported_on(c) { "yes" } else { "no" }.to_owned(),
                            format!("(needs {})", f.gate()),
                        ]
                    })
                    .collect();
                let _ = writeln!(out, "{c} ({})", c.arch_name().unwrap_or("unknown arch"));
                out.push_str(&table(&rows));
            }
            Ok(0)
        }
        ArchCmd::Toolkit { cuda, on } => toolkit(json, cuda.as_deref(), on.as_deref(), out),
        ArchCmd::Torch { version } => torch(json, version.as_deref(), out),
    }
}

fn torch(json: bool, version: Option<&str>, out: &mut String) -> Result<u8> {
    use gpuarch_core::software::{self, Release};
    let releases: Vec<Release> = match version {
        Some(v) => {
            vec![Release::parse(v).ok_or_else(|| anyhow!("{v:?} is not a torch version (2.9.1)"))?]
        }
        None => software::torch_releases().collect(),
    };
    if json {
        let m: serde_json::Map<String, serde_json::Value> = releases
            .iter()
            .map(|r| (r.to_string(), json!(software::torch_names(*r))))
            .collect();
        render::json(out, &json!({ "releases": m }))?;
    } else {
        let rows: Vec<Vec<String>> = releases
            .iter()
            .map(|r| vec![format!("torch {r}"), software::torch_names(*r).join(" ")])
            .collect();
        out.push_str(&table(&rows));
    }
    Ok(0)
}

fn toolkit(json: bool, cuda: Option<&str>, on: Option<&str>, out: &mut String) -> Result<u8> {
    use gpuarch_core::toolkit::{self as tk, Build};
    let archs = |v: CudaVersion| -> Vec<String> {
        tk::accepted(v).iter().map(ToString::to_string).collect()
    };
    let Some(cuda) = cuda else {
        let releases = tk::releases();
        if json {
            let m: serde_json::Map<String, serde_json::Value> = releases
                .iter()
                .map(|v| (v.to_string(), json!(archs(*v))))
                .collect();
            render::json(out, &json!({ "releases": m }))?;
        } else {
            let rows: Vec<Vec<String>> = releases
                .iter()
                .map(|v| vec![format!("CUDA {v}"), archs(*v).join(" ")])
                .collect();
            out.push_str(&table(&rows));
        }
        return Ok(0);
    };
    // CUDA_VERSION's form (12.8.1) too, read as the Plan reads it.
    let v = tk::parse_version(cuda)
        .ok_or_else(|| anyhow!("{cuda:?} is not a CUDA version (12.8, or 12.8.1)"))?;
    if v < tk::OLDEST {
        return Err(anyhow!(
            "CUDA {v} is older than the table (CUDA {} on)",
            tk::OLDEST
        ));
    }
    let Some(on) = on else {
        if json {
            render::json(out, &json!({"cuda": v.to_string(), "archs": archs(v)}))?;
        } else {
            let _ = writeln!(out, "CUDA {v} builds: {}", archs(v).join(" "));
        }
        return Ok(0);
    };
    let device = parse_device_cap(on)?;
    let (kind, target) = match tk::best(device, v) {
        Build::Exact(c) => ("exact", Some(c.to_string())),
        Build::Family(c) => ("family", Some(c.to_string())),
        Build::Ptx(c) => ("ptx", Some(format!("{c}+PTX"))),
        Build::None => ("none", None),
    };
    if json {
        render::json(
            out,
            &json!({"cuda": v.to_string(), "device": device.to_string(), "build": kind, "target": target}),
        )?;
    } else {
        let _ = writeln!(
            out,
            "CUDA {v} for {device}: {}",
            match (kind, &target) {
                ("exact", Some(t)) => format!("{t} (its own architecture)"),
                ("family", Some(t)) => format!("{t} (SASS of its family, which runs there)"),
                ("ptx", Some(t)) => format!("{t} (PTX, JIT-compiled by the driver)"),
                _ => "nothing it builds runs there".to_owned(),
            }
        );
    }
    Ok(if target.is_some() { 0 } else { EXIT_NO })
}
