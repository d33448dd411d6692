//! gpuarchctl: the admin and scheduler CLI. It asks gpuarchd over D-Bus;
//! with `--offline` (implied by `--inventory` and `--nvml-lib`) it reads the
//! snapshot or NVML itself and answers with the same core code.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use clap::{Parser, Subcommand};
use gpuarch_core::arch::{ArchList, ComputeCapability, CudaVersion, Target};
use gpuarch_core::config::Config;
use gpuarch_core::features::Feature;
use gpuarch_core::oci::{self, ContainerView};
use gpuarch_core::plan::{self, Plan};
use gpuarch_core::snapshot::Snapshot;
use serde_json::json;

/// Exit status when a question is answered "no" (`arch check`).
pub const EXIT_NO: u8 = 1;
/// Exit status for errors: bad input, no inventory source.
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "gpuarchctl",
    version,
    about = "Ask gpuarch about this node's GPUs: what they are, what they can run, what a container gets",
    after_help = "Source: gpuarchd on the system bus (DBUS_SYSTEM_BUS_ADDRESS to name another bus). \
With --offline: --nvml-lib reads NVML from that library; otherwise --inventory or \
GPUARCH_INVENTORY names a snapshot; otherwise /run/gpuarch/inventory.json if present; otherwise NVML \
(GPUARCH_NVML_LIB or libnvidia-ml.so.1). --nvml-lib and --inventory imply --offline; so do \
plan --config and plan --env, which plan locally.\n\
Config: GPUARCH_CONFIG or /etc/gpuarch/config.yaml (absent: defaults).\n\
Exit status: 0 ok (or yes), 1 no (arch check, match with no GPU), 2 error."
)]
pub struct Cli {
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Do not ask gpuarchd: read the snapshot or NVML directly.
    #[arg(long, global = true)]
    pub offline: bool,
    /// Read the inventory from NVML in this library (implies --offline).
    #[arg(long, global = true, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Read the inventory from this snapshot file (implies --offline).
    #[arg(long, global = true, value_name = "PATH")]
    pub inventory: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Is gpuarchd running, and how fresh is its inventory?
    Status,
    /// List the GPUs (and MIG devices) of this node.
    Devices,
    /// UUIDs of the GPUs meeting a requirement such as 'arch>=8.0,feature=bf16'
    /// (terms: arch>=X.Y, arch>X.Y, arch<=X.Y, arch<X.Y, arch=X.Y, arch!=X.Y,
    /// feature=NAME). Exit status 1 when no GPU does.
    Match { requirement: String },
    /// Ask gpuarchd to re-read its config and the GPUs now (root or group gpuarch).
    Reload,
    /// Show what a container would get: its GPUs, env and the reasons.
    Plan(PlanArgs),
    /// Questions about compute capabilities and build targets.
    #[command(subcommand)]
    Arch(ArchCmd),
    /// Which GPU architectures a cubin, fatbin, PTX file or library carries,
    /// and whether each GPU of this host runs it (from SASS, by PTX JIT, or
    /// not at all, and why). Exit status 1 when a GPU runs none of it.
    Inspect(InspectArgs),
    /// Build kernel packages ahead of time and pin the builds (root or group
    /// gpuarch); shows progress, exit status 1 when a build is not served.
    Prewarm(PrewarmArgs),
    /// List the kernel cache: each build, its arch and variant, pinned, in use.
    Kernels,
    /// Evict least recently used builds above the cache limit (root or group gpuarch).
    Gc,
    /// Check every cached file's sha256; corrupt builds are quarantined and
    /// rebuilt (root or group gpuarch). Exit status 1 when any was corrupt.
    Verify,
    /// Check this host: gpuarchd up, NVML loadable, snapshot fresh, kernel
    /// cache writable, and each installed container engine (podman, Docker,
    /// containerd, CRI-O) wired to gpuarch; each problem with the line that
    /// fixes it. Exit status 1 when something is wrong.
    Doctor(crate::doctor::DoctorArgs),
    /// Wire gpuarch into a container engine's own config.
    #[command(subcommand)]
    Engine(EngineCmd),
}

#[derive(Debug, Subcommand)]
pub enum EngineCmd {
    /// The containerd drop-in that adds the CRI runtime handler (Kubernetes
    /// RuntimeClass handler) beside runc, from containerd's config as it is:
    /// printed, or written with --write. containerd 1.x replaces a plugin's
    /// whole section with an import's, so for it the drop-in carries the
    /// CRI section of config.toml; run this again after changing that
    /// section (doctor says when).
    Containerd(ContainerdArgs),
}

#[derive(Debug, clap::Args)]
pub struct ContainerdArgs {
    /// Absolute imports are read below this directory (an image, a chroot).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// containerd's config.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/containerd/config.toml"
    )]
    pub config: PathBuf,
    /// The shim the handler runs.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/gpuarch-runtime")]
    pub runtime: PathBuf,
    /// The runtime handler's name.
    #[arg(long, value_name = "NAME", default_value = crate::engines::HANDLER)]
    pub handler: String,
    /// Write the drop-in here (atomically) instead of printing it.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = crate::engines::DROPIN)]
    pub write: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Files to read.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Judge for these GPUs (indexes as NVML numbers them) instead of all.
    #[arg(long, value_name = "LIST", conflicts_with = "cap")]
    pub devices: Option<String>,
    /// Judge for a compute capability (8.6) instead of this host's GPUs.
    #[arg(long, value_name = "CAP")]
    pub cap: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct PrewarmArgs {
    /// Packages to build (default: all).
    pub packages: Vec<String>,
    /// Architectures (7.5,8.6 or sm_75,sm_86).
    #[arg(long, value_name = "LIST", conflicts_with = "host")]
    pub arch: Option<String>,
    /// The architectures of this host's GPUs (the default).
    #[arg(long)]
    pub host: bool,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// GPUs as NVIDIA_VISIBLE_DEVICES names them: indexes, UUIDs, GPU:MIG, all.
    #[arg(long, value_name = "LIST", required_unless_present = "config")]
    pub devices: Option<String>,
    /// Plan for this OCI config.json ('-' reads stdin).
    #[arg(long, value_name = "CONFIG.json", conflicts_with = "devices")]
    pub config: Option<PathBuf>,
    /// With --devices: a variable the container sets (KEY=VALUE), repeatable.
    #[arg(
        long = "env",
        short = 'e',
        value_name = "KEY=VALUE",
        requires = "devices"
    )]
    pub env: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ArchCmd {
    /// Does code built for TARGETS (a list: 8.0, sm_80, compute_80, 8.0+PTX, Ampere...) run on --on?
    Check {
        targets: String,
        /// The device's compute capability (8.6 or sm_86).
        #[arg(long, value_name = "CAP")]
        on: String,
        /// CUDA version the driver supports, for PTX (e.g. 13.0).
        #[arg(long, value_name = "X.Y")]
        driver_cuda: Option<String>,
        /// CUDA version of the toolkit that produced the PTX (e.g. 12.8).
        #[arg(long, value_name = "X.Y")]
        ptx_cuda: Option<String>,
    },
    /// Read an architecture list and print it in canonical form.
    Parse { list: String },
    /// Which gated features a compute capability has.
    Features { cap: String },
}

/// An error and its causes in one line. gpuarch's errors already carry their
/// cause in their message (the hook prints them alone), so a cause is added
/// only where the line does not say it yet.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// Run a parsed command line; the returned byte is the exit status.
pub fn run(cli: &Cli) -> Result<u8> {
    let mut out = String::new();
    let offline = cli.offline || cli.nvml_lib.is_some() || cli.inventory.is_some();
    let code = match &cli.cmd {
        Cmd::Arch(a) => arch(cli, a, &mut out)?,
        Cmd::Doctor(args) => crate::doctor::run(cli, args, &mut out)?,
        Cmd::Plan(args) if offline || args.config.is_some() || !args.env.is_empty() => {
            plan_cmd(cli, args, &mut out)?
        }
        Cmd::Devices if offline => {
            let (snap, from) = load_inventory(cli)?;
            devices(cli, &snap, &from, &mut out)
        }
        Cmd::Match { requirement } if offline => {
            let (snap, _) = load_inventory(cli)?;
            let uuids = crate::service::match_uuids(requirement, &snap).map_err(|e| anyhow!(e))?;
            render_match(cli, requirement, &uuids, &mut out)?
        }
        Cmd::Status if offline => offline_status(cli, &mut out)?,
        Cmd::Inspect(args) => inspect_cmd(cli, args, &mut out)?,
        Cmd::Engine(EngineCmd::Containerd(args)) => containerd_cmd(args, &mut out)?,
        Cmd::Reload if offline => {
            return Err(anyhow!(
                "reload asks gpuarchd to re-read NVML and its config; there is nothing to reload --offline"
            ));
        }
        _ => crate::remote::run(cli, &mut out)?,
    };
    print!("{out}");
    Ok(code)
}

fn containerd_cmd(args: &ContainerdArgs, out: &mut String) -> Result<u8> {
    let target = args
        .write
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::engines::DROPIN));
    let drop = crate::engines::containerd_dropin(
        &args.root,
        &args.config,
        &args.runtime,
        &args.handler,
        &target,
    )?;
    for n in &drop.notes {
        eprintln!("gpuarchctl: {n}");
    }
    match &args.write {
        None => out.push_str(&drop.text),
        Some(path) => {
            let dir = path.parent().unwrap_or(Path::new("/"));
            std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
            let tmp = dir.join(format!(
                ".{}.{}",
                path.file_name().unwrap_or_default().to_string_lossy(),
                std::process::id()
            ));
            std::fs::write(&tmp, &drop.text)
                .and_then(|()| std::fs::rename(&tmp, path))
                .with_context(|| path.display().to_string())
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&tmp);
                })?;
            let _ = writeln!(
                out,
                "wrote {}; restart containerd, then give pods runtimeClassName: {}",
                path.display(),
                args.handler
            );
        }
    }
    Ok(0)
}

/// `match` output: UUIDs one per line, or JSON. 1 when none matched.
pub(crate) fn render_match(
    cli: &Cli,
    requirement: &str,
    uuids: &[String],
    out: &mut String,
) -> Result<u8> {
    if cli.json {
        let doc = json!({"requirement": requirement, "uuids": uuids});
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for u in uuids {
            let _ = writeln!(out, "{u}");
        }
    }
    Ok(if uuids.is_empty() { EXIT_NO } else { 0 })
}

fn offline_status(cli: &Cli, out: &mut String) -> Result<u8> {
    let (snap, from) = load_inventory(cli)?;
    let age = humantime_age(&snap.generated_at);
    if cli.json {
        let doc = json!({
            "daemon": null,
            "inventory": {
                "source": from,
                "devices": snap.devices.len(),
                "generated_at": snap.generated_at,
                "age_s": age.map(|a| a.as_secs()),
                "stale": snap.stale,
            }
        });
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let _ = writeln!(out, "daemon: not asked (--offline)");
        let _ = writeln!(
            out,
            "inventory: {} GPU(s) from {from}, read {}{}{}",
            snap.devices.len(),
            snap.generated_at,
            age.map(|a| format!(" ({} ago)", short_duration(a)))
                .unwrap_or_default(),
            if snap.stale {
                ", STALE: the daemon's last refresh failed"
            } else {
                ""
            }
        );
    }
    Ok(0)
}

/// Time since an RFC 3339 stamp, if it parses and is in the past.
pub(crate) fn humantime_age(stamp: &str) -> Option<std::time::Duration> {
    let t = humantime::parse_rfc3339(stamp).ok()?;
    std::time::SystemTime::now().duration_since(t).ok()
}

/// `3d 4h`, `5m 2s`, `42s`: the two largest units.
pub(crate) fn short_duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    let (days, h, m, sec) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (days, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) => format!("{m}m {sec}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{days}d {h}h"),
    }
}

pub(crate) fn load_inventory(cli: &Cli) -> Result<(Snapshot, String)> {
    // The config names the snapshot; a config that cannot be read leaves
    // the default (its own error is for the commands that use it).
    let configured = gpuarch_inventory::read_config()
        .map(|c| c.daemon.snapshot)
        .unwrap_or_else(|_| PathBuf::from(gpuarch_inventory::DEFAULT_SNAPSHOT));
    Ok(gpuarch_inventory::read_inventory(
        cli.nvml_lib.as_deref(),
        cli.inventory.as_deref(),
        &configured,
    )?)
}

fn load_config() -> Result<Config> {
    Ok(gpuarch_inventory::read_config()?)
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<w$}", w = widths[i]))
            .collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    s
}

pub(crate) fn devices(cli: &Cli, snap: &Snapshot, from: &str, out: &mut String) -> u8 {
    if cli.json {
        out.push_str(&snap.to_json_pretty());
        out.push('\n');
        return 0;
    }
    let mut rows = vec![
        [
            "GPU",
            "MINOR",
            "CC",
            "ARCH",
            "NAME",
            "MEMORY",
            "PCI BUS ID",
            "UUID",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for d in &snap.devices {
        let cc = d.compute_capability;
        rows.push(vec![
            d.index.to_string(),
            d.minor.to_string(),
            cc.to_string(),
            cc.arch_name().unwrap_or("?").to_owned(),
            d.name.clone(),
            gib(d.memory_bytes),
            d.pci_bus_id.clone(),
            d.uuid.clone(),
        ]);
        for m in &d.mig {
            rows.push(vec![
                format!("{}:{}", d.index, m.index),
                String::new(),
                cc.to_string(),
                cc.arch_name().unwrap_or("?").to_owned(),
                m.name.clone(),
                gib(m.memory_bytes),
                String::new(),
                m.uuid.clone(),
            ]);
        }
    }
    if snap.devices.is_empty() {
        out.push_str("no GPUs\n");
    } else {
        out.push_str(&table(&rows));
    }
    let _ = writeln!(
        out,
        "\n{} GPU(s) from {from}; driver {}, CUDA {}; read {}{}",
        snap.devices.len(),
        snap.driver_version,
        snap.cuda_driver_version,
        snap.generated_at,
        if snap.stale {
            " (STALE: the daemon's last refresh failed)"
        } else {
            ""
        }
    );
    0
}

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

fn plan_cmd(cli: &Cli, args: &PlanArgs, out: &mut String) -> Result<u8> {
    // The caller's own input first: its errors matter more than the host's.
    let view = match &args.config {
        Some(path) => Some(
            ContainerView::from_json(&read_oci_config(path)?)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?,
        ),
        None => None,
    };
    let cfg = load_config()?;
    let (snap, _) = load_inventory(cli)?;
    let plan = if let Some(view) = view {
        plan::plan(&view, &snap, &cfg.env)
    } else {
        let mut env = Vec::new();
        for e in &args.env {
            let (k, v) = e
                .split_once('=')
                .ok_or_else(|| anyhow!("--env {e:?}: expected KEY=VALUE"))?;
            env.push((k.to_owned(), v.to_owned()));
        }
        let list = args.devices.as_deref().unwrap_or_default();
        plan::plan_request(list, &ContainerView::with_env(env), &snap, &cfg.env)
    };
    if cli.json {
        out.push_str(&serde_json::to_string_pretty(&plan)?);
        out.push('\n');
    } else {
        render_plan(&plan, out);
    }
    Ok(0)
}

pub(crate) fn render_plan(plan: &Plan, out: &mut String) {
    match plan.source {
        Some(src) if !plan.gpus.is_empty() => {
            let _ = writeln!(out, "GPUs (from {src}, in CUDA order):");
            let rows: Vec<Vec<String>> = plan
                .gpus
                .iter()
                .map(|g| {
                    vec![
                        format!(
                            "  {}",
                            g.mig
                                .map_or(g.index.to_string(), |m| format!("{}:{m}", g.index))
                        ),
                        g.name.clone(),
                        g.compute_capability.to_string(),
                        g.uuid.clone(),
                    ]
                })
                .collect();
            out.push_str(&table(&rows));
        }
        _ => out.push_str("GPUs: none\n"),
    }
    render_env_notes(
        plan.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &plan.notes,
        out,
    );
}

/// The env a container gets and the notes saying why.
pub(crate) fn render_env_notes<'a>(
    env: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    notes: &[String],
    out: &mut String,
) {
    if env.len() == 0 {
        out.push_str("env: none (the container starts unchanged)\n");
    } else {
        out.push_str("env:\n");
        for (k, v) in env {
            let _ = writeln!(out, "  {k}={v}");
        }
    }
    out.push_str("notes:\n");
    for n in notes {
        let _ = writeln!(out, "  - {n}");
    }
}

fn parse_device_cap(s: &str) -> Result<ComputeCapability> {
    if let Ok(c) = ComputeCapability::parse_reported(s) {
        return Ok(c);
    }
    let t = Target::parse(s).map_err(|e| anyhow!("--on: {e}"))?;
    Ok(t.cap)
}

fn arch(cli: &Cli, cmd: &ArchCmd, out: &mut String) -> Result<u8> {
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
            if cli.json {
                let targets: Vec<_> = verdicts
                    .iter()
                    .map(|(t, v)| {
                        json!({"target": t.to_string(), "runs": v.runs, "jit": v.jit, "reason": v.reason})
                    })
                    .collect();
                let doc = json!({"device": device.to_string(), "runs": runs, "targets": targets});
                let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
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
            if cli.json {
                let targets: Vec<String> = l.targets().map(Target::to_string).collect();
                let doc = json!({"canonical": l.to_string(), "targets": targets});
                let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
            } else {
                let _ = writeln!(out, "{l}");
                for t in l.targets() {
                    let kind = match t.kind {
                        gpuarch_core::arch::CodeKind::Sass => "SASS",
                        gpuarch_core::arch::CodeKind::Ptx => "PTX",
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
            if cli.json {
                let feats: serde_json::Map<String, serde_json::Value> = Feature::ALL
                    .iter()
                    .map(|f| (f.name().to_owned(), json!(f.supported_on(c))))
                    .collect();
                let doc = json!({"compute_capability": c.to_string(), "arch": c.arch_name(), "features": feats});
                let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
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
    }
}

/// `inspect`: what each file carries and where it runs.
fn inspect_cmd(cli: &Cli, args: &InspectArgs, out: &mut String) -> Result<u8> {
    use gpuarch_kernels::inspect::{self, Placement};
    let mut no_gpus: Option<String> = None;
    // The GPUs to judge for: a capability, or this host's (all or some).
    let (gpus, driver): (Vec<(String, ComputeCapability)>, Option<CudaVersion>) = match &args.cap {
        Some(c) => {
            let cap = ComputeCapability::parse_reported(c.trim_start_matches("sm_"))
                .or_else(|_| Target::parse(c).map(|t| t.cap))
                .map_err(|e| anyhow!("--cap {c}: {e}"))?;
            (vec![(format!("capability {cap}"), cap)], None)
        }
        None => {
            // The file's targets need no GPU: without an inventory (no
            // driver, no gpuarchd: a build box, CI) they are listed all the
            // same, with the reason there is nothing to judge them against.
            // Asked for by name (--inventory, --nvml-lib, --devices), a
            // missing inventory stays an error.
            let asked = cli.inventory.is_some() || cli.nvml_lib.is_some() || args.devices.is_some();
            let snap = match load_inventory(cli) {
                Ok((snap, _)) => Some(snap),
                Err(e) if !asked => {
                    no_gpus = Some(format!("{e:#}"));
                    None
                }
                Err(e) => return Err(e),
            };
            let snap = snap.unwrap_or_else(|| Snapshot {
                schema: gpuarch_core::snapshot::SCHEMA,
                source: String::new(),
                generated_at: String::new(),
                driver_version: String::new(),
                cuda_driver_version: String::new(),
                stale: false,
                devices: Vec::new(),
            });
            let wanted: Option<Vec<u32>> = match &args.devices {
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
            (gpus, CudaVersion::parse(&snap.cuda_driver_version).ok())
        }
    };
    let mut code = 0;
    let mut docs = Vec::new();
    for f in &args.files {
        let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let objs = inspect::inspect(&data).map_err(|e| anyhow!("{}: {e}", f.display()))?;
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
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&docs)?);
    }
    Ok(code)
}
