//! `gpuarchctl plan`: what a container would get. For a device list gpuarchd
//! answers (its `Plan`); offline, or for a container's own config or env,
//! the Plan is made here with the same core code.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use gpuarch_core::oci::{self, ContainerView};
use gpuarch_core::plan;
use gpuarch_core::software::{Dist, Release, Software};
use gpuarch_wire::dbus::InventoryProxy;
use serde_json::json;

use crate::cli::{Cli, PlanArgs};
use crate::render;
use crate::source::{BusError, Offline, Source};

fn read_oci_config(path: &Path) -> Result<Vec<u8>> {
    let bytes = if path == Path::new("-") {
        oci::read_bounded(std::io::stdin().lock())
    } else {
        std::fs::File::open(path)
            .map_err(oci::OciError::from)
            .and_then(oci::read_bounded)
    };
    bytes.with_context(|| format!("OCI config {}", path.display()))
}

/// The entries of a `--devices` list.
fn entries(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The image's consumers from `--software` entries.
fn software(entries: &[String]) -> Result<Software> {
    let mut sw = Software::default();
    if entries.is_empty() {
        return Ok(sw);
    }
    sw.read.push("--software".to_owned());
    for e in entries.iter().filter(|e| *e != "none") {
        let (name, version) = e
            .split_once("==")
            .ok_or_else(|| anyhow!("--software {e:?}: expected DIST==VERSION (torch==2.9.1)"))?;
        let dist = Dist::from_name(name).ok_or_else(|| {
            let known: Vec<_> = Dist::ALL.iter().map(|d| d.name()).collect();
            anyhow!("--software {e:?}: gpuarch knows {}", known.join(", "))
        })?;
        let release = Release::parse(version)
            .ok_or_else(|| anyhow!("--software {e:?}: {version:?} is not a version"))?;
        sw.dists.insert(dist, release);
    }
    Ok(sw)
}

/// A device list, asked of the source.
pub fn run(cli: &Cli, src: &Source, args: &PlanArgs, out: &mut String) -> Result<u8> {
    let Source::Daemon(d) = src else {
        return local(cli, args, out);
    };
    let list = args.devices.as_deref().unwrap_or_default();
    let (env, notes) = d.ask(async {
        let e = |e| BusError::of("plan", e);
        let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
        inv.plan(&entries(list)).await.map_err(e)
    })?;
    if cli.json {
        render::json(out, &json!({"env": env, "notes": notes}))?;
    } else {
        render::env_notes(
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            &notes,
            out,
        );
    }
    Ok(0)
}

/// A Plan made here: for an OCI config, or a device list and env.
pub fn local(cli: &Cli, args: &PlanArgs, out: &mut String) -> Result<u8> {
    // The caller's own input first: its errors matter more than the host's.
    let view = match &args.config {
        Some(path) => Some(
            ContainerView::from_json(&read_oci_config(path)?)
                .with_context(|| path.display().to_string())?,
        ),
        None => None,
    };
    let mut env = Vec::new();
    for e in &args.env {
        let (k, v) = e
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {e:?}: expected KEY=VALUE"))?;
        env.push((k.to_owned(), v.to_owned()));
    }
    let software = software(&args.software)?;
    let cfg = gpuarch_fs::config::read_config()?;
    let (snap, _) = Offline::of(cli).inventory_live(cli.offline)?;
    let plan = match view {
        Some(mut view) => {
            view.software = software;
            plan::plan(&view, &snap, &cfg.env)
        }
        None => {
            let list = args.devices.as_deref().unwrap_or_default();
            let mut view = ContainerView::with_env(env);
            view.software = software;
            plan::plan_request(list, &view, &snap, &cfg.env)
        }
    };
    if cli.json {
        render::json(out, &plan)?;
    } else {
        render::plan(&plan, out);
    }
    Ok(0)
}
