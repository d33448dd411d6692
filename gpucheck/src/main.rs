//! gpuarch-gpu-check: the parts of scripts/gpu-check that talk to the GPU.
//! One line per check on stdout; `--report FILE` writes them as JSON.
//! Exit status 0 when every check passed, 1 when one failed, 2 when the
//! check could not run at all (no CUDA driver, bad arguments).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use gpuarch_gpucheck::Check;
use gpuarch_gpucheck::driver::{Gpu, error_name};
use gpuarch_gpucheck::kernels::{self, Setup};
use gpuarch_gpucheck::sandbox::Sandbox;
use gpuarch_inventory::{GpuInventory, NvmlInventory};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(name = "gpuarch-gpu-check", version, about)]
struct Cli {
    /// Write the checks as a JSON array to this file.
    #[arg(long, global = true)]
    report: Option<PathBuf>,
    /// CUDA ordinal of the GPU to use.
    #[arg(long, global = true, default_value_t = 0)]
    device: usize,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build every variant of every package for this GPU's arch into a
    /// store, load each cubin and compare its kernels with a CPU reference.
    Kernels {
        /// Package directories (default: kernels/packages).
        #[arg(long = "packages", default_value = "kernels/packages")]
        packages: Vec<PathBuf>,
        /// The store to build into (a scratch directory).
        #[arg(long)]
        store: PathBuf,
        /// Searched first for NVRTC and the CUDA headers.
        #[arg(long = "cuda-dir")]
        cuda_dirs: Vec<PathBuf>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// cuModuleLoadData of each file: whether the driver loads it, and its
    /// error when not (CUDA_DISABLE_PTX_JIT=1 in the environment forbids JIT).
    Load { files: Vec<PathBuf> },
    /// nvmlInit plus a full inventory read, timed: the first run (cold) and
    /// the median of the rest.
    Nvml {
        /// libnvidia-ml.so.1 to use.
        #[arg(long)]
        lib: Option<PathBuf>,
        #[arg(long, default_value_t = 20)]
        runs: usize,
    },
    /// Plan calls per second to a running gpuarchd, against
    /// org.freedesktop.DBus.Peer.Ping to it in the same run (the cheapest
    /// round trip over the bus), in ABBA order.
    PlanRate {
        /// The bus gpuarchd is on (DBUS_SYSTEM_BUS_ADDRESS).
        #[arg(long)]
        address: String,
        /// GPUs to plan for, as NVIDIA_VISIBLE_DEVICES names them.
        #[arg(long, default_value = "0")]
        devices: String,
        #[arg(long, default_value_t = 4000)]
        calls: usize,
    },
    /// Run a command under the unit's memory and system-call sandbox.
    Sandbox {
        /// PR_SET_MDWE (PR_MDWE_REFUSE_EXEC_GAIN).
        #[arg(long)]
        mdwe: bool,
        /// A seccomp BPF program (scripts/lib/seccomp-bpf.py), repeatable.
        #[arg(long)]
        bpf: Vec<PathBuf>,
        #[arg(last = true, required = true)]
        argv: Vec<OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(checks) => {
            for c in &checks {
                println!("{}", c.line());
            }
            if let Some(path) = &cli.report {
                let doc = json!(checks.iter().map(Check::to_json).collect::<Vec<_>>());
                if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
                    eprintln!("gpuarch-gpu-check: {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            ExitCode::from(u8::from(checks.iter().any(|c| !c.ok)))
        }
        Err(e) => {
            eprintln!("gpuarch-gpu-check: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<Vec<Check>> {
    match &cli.cmd {
        Cmd::Kernels {
            packages,
            store,
            cuda_dirs,
            seed,
        } => {
            let gpu = Gpu::open(cli.device)?;
            let setup = Setup {
                packages: packages.clone(),
                store: store.clone(),
                cuda_dirs: cuda_dirs.clone(),
                seed: *seed,
            };
            kernels::run(&gpu, &setup)
        }
        Cmd::Load { files } => {
            let gpu = Gpu::open(cli.device)?;
            let jit_off = std::env::var_os("CUDA_DISABLE_PTX_JIT").is_some_and(|v| v == "1");
            files
                .iter()
                .map(|f| {
                    let image = std::fs::read(f).with_context(|| f.display().to_string())?;
                    let r = gpu.load(&image);
                    let (loaded, error) = match &r {
                        Ok(_) => (true, None),
                        Err(e) => (false, Some(error_name(e))),
                    };
                    let detail = match &error {
                        None => format!("loads on {} ({})", gpu.name, gpu.cap),
                        Some(e) => format!("refused on {} ({}): {e}", gpu.name, gpu.cap),
                    };
                    Ok(
                        Check::new("load", f.display().to_string(), true, detail).with(json!({
                            "file": f, "loaded": loaded, "error": error, "jit_disabled": jit_off,
                            "gpu": gpu.name, "capability": gpu.cap.to_string(),
                            "driver_cuda": gpu.driver_cuda,
                        })),
                    )
                })
                .collect()
        }
        Cmd::Nvml { lib, runs } => {
            let mut times = Vec::new();
            let mut devices = 0;
            let mut nodes = Vec::new();
            for _ in 0..(*runs).max(2) {
                let t = Instant::now();
                let inv = NvmlInventory::open(lib.as_deref())?;
                let snap = inv.snapshot()?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                devices = snap.devices.len();
                // What NVML holds open while initialised: what a unit's
                // DeviceAllow= must let through.
                nodes = open_device_nodes();
                drop(inv); // nvmlShutdown: the next run initialises again
            }
            let first = times[0];
            let mut rest = times[1..].to_vec();
            rest.sort_by(f64::total_cmp);
            let median = rest[rest.len() / 2];
            Ok(vec![
                Check::new(
                    "nvml",
                    "init+read",
                    devices > 0,
                    format!(
                        "nvmlInit and a full read of {devices} GPU(s): first {first:.1} ms, median of {} more {median:.1} ms",
                        rest.len()
                    ),
                )
                .with(json!({"first_ms": first, "median_ms": median, "runs_ms": times, "devices": devices})),
                Check::new(
                    "nvml",
                    "device nodes",
                    !nodes.is_empty(),
                    format!("NVML holds open: {}", nodes.join(", ")),
                )
                .with(json!({"device_nodes": nodes})),
            ])
        }
        Cmd::PlanRate {
            address,
            devices,
            calls,
        } => {
            let devices: Vec<&str> = devices.split(',').collect();
            let r = gpuarch_gpucheck::bus::plan_rate(address, &devices, *calls)?;
            Ok(vec![
                Check::new(
                    "daemon",
                    "plan-rate",
                    !r.capabilities.is_empty(),
                    format!(
                        "Plan {:.0} calls/s, Ping {:.0} calls/s (Plan/Ping time {:.2}x); GPUARCH_COMPUTE_CAPABILITIES={}",
                        r.plan_per_s,
                        r.ping_per_s,
                        r.ping_per_s / r.plan_per_s,
                        r.capabilities
                    ),
                )
                .with(json!({"plan_per_s": r.plan_per_s, "ping_per_s": r.ping_per_s,
                             "calls": calls, "env": r.env})),
            ])
        }
        Cmd::Sandbox { mdwe, bpf, argv } => {
            Sandbox {
                mdwe: *mdwe,
                bpf: bpf.clone(),
            }
            .exec(argv)?;
            unreachable!("exec returned without an error")
        }
    }
}

/// The device nodes this process has open, each once.
fn open_device_nodes() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .filter(|p| p.starts_with("/dev/") && p != "/dev/null")
        .collect();
    v.sort();
    v.dedup();
    v
}
