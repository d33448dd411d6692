//! `gpuarchctl inspect FILE...`: the SASS and PTX a file carries and, for
//! each GPU of this host (or a capability), whether and how it runs.

use std::fmt::Write as _;

use anyhow::{Context, Result, anyhow};
use gpuarch_core::arch::{ComputeCapability, CudaVersion, Target};
use gpuarch_kernels::inspect::{self, Placement};
use serde_json::json;

use crate::cli::{Cli, EXIT_NO, InspectArgs};
use crate::render;
use crate::source::Offline;

/// The GPUs to judge for (label, capability), the driver's CUDA, and, when
/// there is no inventory to judge against, why.
type Judges = (
    Vec<(String, ComputeCapability)>,
    Option<CudaVersion>,
    Option<String>,
);

/// The GPUs to judge for: `caps` (a list: `7.5,8.6` or `sm_75,sm_86`),
/// else `devices` of this host's inventory (indexes), else all of them.
pub(crate) fn judges(cli: &Cli, devices: Option<&str>, caps: Option<&str>) -> Result<Judges> {
    if let Some(list) = caps {
        let mut out = Vec::new();
        for c in list.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            let cap = ComputeCapability::parse_reported(c.trim_start_matches("sm_"))
                .or_else(|_| Target::parse(c).map(|t| t.cap))
                .map_err(|e| anyhow!("--cap {c}: {e}"))?;
            out.push((format!("capability {cap}"), cap));
        }
        if out.is_empty() {
            return Err(anyhow!("--cap {list:?}: no capability"));
        }
        return Ok((out, None, None));
    }
    // The file's targets need no GPU: without an inventory (no driver, no
    // gpuarchd: a build box, CI) they are listed all the same, with the
    // reason there is nothing to judge them against. Asked for by name
    // (--inventory, --nvml-lib, --devices), a missing inventory stays an
    // error.
    let offline = Offline::of(cli);
    let snap = match offline.inventory_live(cli.offline) {
        Ok((snap, _)) => snap,
        Err(e) if !offline.named() && devices.is_none() => {
            return Ok((Vec::new(), None, Some(format!("{e:#}"))));
        }
        Err(e) => return Err(e),
    };
    let wanted: Option<Vec<u32>> = match devices {
        None => None,
        Some(l) => Some(
            l.split(',')
                .map(|i| {
                    i.trim()
                        .parse::<u32>()
                        .map_err(|_| anyhow!("--devices: {i:?} is not a GPU index"))
                })
                .collect::<Result<_>>()?,
        ),
    };
    let gpus = snap
        .devices
        .iter()
        .filter(|d| wanted.as_ref().is_none_or(|w| w.contains(&d.index)))
        .map(|d| {
            (
                format!("GPU {} {} ({})", d.index, d.name, d.compute_capability),
                d.compute_capability,
            )
        })
        .collect();
    Ok((
        gpus,
        CudaVersion::parse(&snap.cuda_driver_version).ok(),
        None,
    ))
}

pub fn run(cli: &Cli, args: &InspectArgs, out: &mut String) -> Result<u8> {
    let (gpus, driver, no_gpus) = judges(cli, args.devices.as_deref(), args.cap.as_deref())?;
    let mut code = 0;
    let mut docs = Vec::new();
    for f in &args.files {
        // Mapped, not read into the heap (libtorch_cuda is 460 MB), and
        // read from disk no further than the inspector looks.
        // Not blocking on a FIFO: anything but a regular file is refused.
        let file = gpuarch_fs::open_regular(f, true)
            .with_context(|| format!("reading {}", f.display()))?;
        let map = gpuarch_kernels::file::Mapped::new(&file)
            .with_context(|| format!("reading {}", f.display()))?;
        let reading = gpuarch_kernels::file::Reading::of(f);
        let objs = inspect::inspect_mapped(&map).with_context(|| f.display().to_string())?;
        drop(reading);
        let verdicts: Vec<(String, Placement)> = gpus
            .iter()
            .map(|(label, cap)| (label.clone(), inspect::placement(&objs, *cap, driver)))
            .collect();
        if verdicts.iter().any(|(_, p)| matches!(p, Placement::No(_))) {
            code = EXIT_NO;
        }
        if cli.json {
            docs.push(json!({
                "file": f,
                "no_gpus": no_gpus,
                "code": objs.iter().map(|o| json!({
                    "target": o.target.to_string(), "origin": o.origin,
                    "functions": o.functions, "verified": o.verified,
                })).collect::<Vec<_>>(),
                "gpus": verdicts.iter().map(|(l, p)| json!({
                    "gpu": l,
                    "runs": !matches!(p, Placement::No(_)),
                    "how": p.to_string(),
                })).collect::<Vec<_>>(),
            }));
            continue;
        }
        let _ = writeln!(out, "{}:", f.display());
        if objs.is_empty() {
            let _ = writeln!(out, "  no GPU code");
        }
        for o in &objs {
            let funcs = if o.functions.is_empty() {
                String::new()
            } else {
                format!(": {}", o.functions.join(", "))
            };
            let _ = writeln!(out, "  {o}{funcs}");
        }
        for (label, p) in &verdicts {
            let _ = writeln!(out, "  {label}: {p}");
        }
        if let Some(why) = &no_gpus {
            let _ = writeln!(out, "  no GPU here to judge it against: {why}");
        }
    }
    if cli.json {
        render::json(out, &docs)?;
    }
    Ok(code)
}
