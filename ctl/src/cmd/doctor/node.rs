//! Doctor's checks of the running system: gpuarchd on the bus, NVML (as
//! gpuarchd reads it, or here), the snapshot and how recently gpuarchd read
//! NVML for it, and the compiler the kernel builds use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use gpuarch_core::config::NriConfig;
use gpuarch_core::config::STORAGE_DRIVERS;
use gpuarch_fs::crio::CrioStorage;
use gpuarch_wire::dbus::{DaemonProxy, InventoryProxy, KernelCacheProxy};

use crate::check::{Check, fail, ok, skip, under, warn};
use crate::cli::Cli;
use crate::render::{age_of_stamp as humantime_age, short_duration};
use crate::source::{BusError, Daemon};

pub(super) fn daemon(bus: &Result<Daemon>) -> Check {
    const NAME: &str = "gpuarchd";
    let fix = "systemctl enable --now gpuarchd (journalctl -u gpuarchd -b says why it stopped)";
    let failed = |e: &anyhow::Error| match e.downcast_ref::<BusError>() {
        Some(BusError::NotRunning) => fail(
            NAME,
            "not running (nothing owns io.gpuarch1 on the system bus)",
            fix,
        ),
        Some(BusError::NoBus(b)) => fail(
            NAME,
            format!("cannot reach the system bus: {b}"),
            "systemctl start dbus, then systemctl enable --now gpuarchd",
        ),
        _ => fail(NAME, gpuarch_core::one_line(e.as_ref()), fix),
    };
    let d = match bus {
        Ok(d) => d,
        Err(e) => return failed(e),
    };
    let asked = d.ask_within(Duration::from_secs(5), async {
        let e = |e| BusError::of("asking gpuarchd", e);
        let version = d
            .proxy::<DaemonProxy>()
            .await
            .map_err(e)?
            .version()
            .await
            .map_err(e)?;
        let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
        let stale = inv.stale().await.map_err(e)?;
        let err = inv.last_error().await.map_err(e)?;
        let caps = inv.compute_capabilities().await.map_err(e)?;
        Ok((version, stale, err, caps))
    });
    match asked {
        Ok((version, false, _, caps)) => ok(
            NAME,
            format!(
                "{version} running on the system bus; GPUs: {}",
                if caps.is_empty() {
                    "none".to_owned()
                } else {
                    caps.join(", ")
                }
            ),
        ),
        Ok((version, true, err, _)) => fail(
            NAME,
            format!("{version} running, but its inventory is stale: {err}"),
            "fix what the error names, then gpuarchctl reload",
        ),
        Err(e) => failed(&e.into()),
    }
}

/// The NRI plugin, as gpuarchd says it is: registered with the runtime
/// (and what it planned last), or why not; skipped when `nri.enable` is
/// off or gpuarchd does not answer (its own check says that).
pub(super) fn nri(d: Option<&Daemon>, cfg: &NriConfig) -> crate::check::Check {
    const NAME: &str = "NRI";
    if !cfg.enable {
        return crate::check::skip(NAME, "off (nri.enable)");
    }
    let Some(d) = d else {
        return crate::check::skip(NAME, "gpuarchd does not answer");
    };
    let asked = d.ask_within(Duration::from_secs(5), async {
        let e = |e| BusError::of("asking gpuarchd", e);
        let p = d.proxy::<DaemonProxy>().await.map_err(e)?;
        Ok((
            p.nri_state().await.map_err(e)?,
            p.nri_planned().await.map_err(e)?,
            p.nri_last().await.map_err(e)?,
        ))
    });
    match asked {
        Ok((state, planned, last)) if state.starts_with("registered") => {
            let detail = format!(
                "{state}; {planned} container(s) planned{}",
                if last.is_empty() {
                    String::new()
                } else {
                    format!(", the last {last}")
                }
            );
            // Under CRI-O the images are read from its containers/storage
            // (gpuarchd's host's, whatever --root says), where CRI-O's own
            // config puts it unless gpuarch's says otherwise.
            let crio = CrioStorage::of(cfg);
            let store = &crio.root.value;
            if state.starts_with("registered with cri-o")
                && !STORAGE_DRIVERS
                    .iter()
                    .any(|d| store.join(format!("{d}-containers")).is_dir())
            {
                let problems = if crio.problems.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", crio.problems.join("; "))
                };
                return warn(
                    NAME,
                    format!(
                        "{detail}; but {} (from {}) holds no containers/storage: CRI-O's images are not read, and its pods get the lists for an image not known{problems}",
                        store.display(),
                        crio.root.from
                    ),
                    "set nri.crio_config and nri.storage_conf to the files CRI-O runs with, or nri.storage_root and nri.storage_runroot to its root and runroot",
                );
            }
            ok(NAME, detail)
        }
        Ok((state, _, _)) => fail(
            NAME,
            crate::render::shown(&state).into_owned(),
            "check nri.socket against the runtime's NRI socket, and that NRI is enabled in the runtime (containerd: [plugins.\"io.containerd.nri.v1.nri\"] disable = false)",
        ),
        Err(e) => fail(NAME, gpuarch_core::one_line(&e), "restart gpuarchd"),
    }
}

/// What gpuarchd says of its own NVML reads.
pub(super) struct DaemonNvml {
    library: String,
    last_ok: Option<Duration>,
    last_error: String,
    gpus: usize,
    driver: String,
}

pub(super) fn daemon_nvml(d: &Daemon) -> Option<DaemonNvml> {
    d.ask_within(Duration::from_secs(5), async {
        let e = |e| BusError::of("asking gpuarchd", e);
        let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
        Ok(DaemonNvml {
            library: inv.nvml_library().await.map_err(e)?,
            last_ok: crate::render::age_of_usec(inv.last_refresh().await.map_err(e)?),
            last_error: inv.last_error().await.map_err(e)?,
            gpus: inv.compute_capabilities().await.map_err(e)?.len(),
            driver: inv.driver_version().await.map_err(e)?,
        })
    })
    .ok()
}

/// NVML as gpuarchd loads it (its library, its environment), when it
/// answers and `--nvml-lib` does not name another; else as this process
/// loads it, saying so.
pub(super) fn nvml(cli: &Cli, daemons: Option<DaemonNvml>) -> Check {
    const NAME: &str = "NVML";
    if cli.nvml_lib.is_none()
        && let Some(n) = daemons
    {
        return match (&n.last_ok, n.last_error.is_empty()) {
            (Some(age), true) => ok(
                NAME,
                format!(
                    "gpuarchd loads {}: {} GPU(s), driver {}; it last answered {} ago",
                    n.library,
                    n.gpus,
                    n.driver,
                    crate::render::short_duration(*age)
                ),
            ),
            _ => fail(
                NAME,
                format!(
                    "gpuarchd's NVML ({}) fails: {}",
                    n.library,
                    if n.last_error.is_empty() {
                        "it has not answered yet"
                    } else {
                        &n.last_error
                    }
                ),
                "install the NVIDIA driver (it provides libnvidia-ml.so.1), or name the library gpuarchd loads: systemctl edit gpuarchd, Environment=GPUARCH_NVML_LIB=/path/libnvidia-ml.so.1",
            ),
        };
    }
    let lib = cli
        .nvml_lib
        .clone()
        .or_else(|| std::env::var_os("GPUARCH_NVML_LIB").map(PathBuf::from));
    let opened = gpuarch_inventory::NvmlInventory::open(lib.as_deref());
    match opened.and_then(|n| gpuarch_inventory::GpuInventory::snapshot(&n)) {
        Ok(s) => ok(
            NAME,
            format!(
                "{} loads in gpuarchctl's own environment: {} GPU(s), driver {}",
                lib.as_deref()
                    .map_or(gpuarch_inventory::DEFAULT_NVML_LIB.into(), |p| p
                        .display()
                        .to_string()),
                s.devices.len(),
                s.driver_version
            ),
        ),
        Err(e) => fail(
            NAME,
            format!(
                "{e} ({})",
                if cli.nvml_lib.is_some() {
                    "--nvml-lib, loaded by gpuarchctl"
                } else {
                    "in gpuarchctl's own environment: gpuarchd does not answer"
                }
            ),
            "install the NVIDIA driver (it provides libnvidia-ml.so.1), or name the library in GPUARCH_NVML_LIB",
        ),
    }
}

/// The snapshot doctor reads: `--inventory`, `GPUARCH_INVENTORY`, else
/// the config's below `root`.
pub(super) fn snapshot_path(
    cli: &Cli,
    root: &Path,
    daemon: &gpuarch_core::config::DaemonConfig,
) -> PathBuf {
    cli.inventory
        .clone()
        .or_else(gpuarch_inventory::inventory_env)
        .unwrap_or_else(|| under(root, &daemon.snapshot))
}

/// When gpuarchd's NVML read last succeeded (it rewrites the snapshot only
/// when the GPUs change, so the file's own time says nothing of that);
/// `None` when gpuarchd does not answer.
pub(super) fn daemon_last_read(d: &Daemon) -> Option<Duration> {
    let usec = d
        .ask_within(Duration::from_secs(5), async {
            let e = |e| BusError::of("asking gpuarchd", e);
            let inv = d.proxy::<InventoryProxy>().await.map_err(e)?;
            inv.last_refresh().await.map_err(e)
        })
        .ok()?;
    crate::render::age_of_usec(usec).or(Some(Duration::MAX))
}

/// The snapshot check, given how long ago gpuarchd's last NVML read
/// succeeded (`None`: gpuarchd does not answer, which its own check says).
pub(super) fn snapshot_judged(
    cli: &Cli,
    root: &Path,
    daemon: &gpuarch_core::config::DaemonConfig,
    last_read: Option<Duration>,
) -> Check {
    const NAME: &str = "snapshot";
    let interval_s = daemon.refresh_interval_s;
    let path = snapshot_path(cli, root, daemon);
    let fix = "systemctl restart gpuarchd (journalctl -u gpuarchd says why its reads stopped)";
    let snap = match gpuarch_inventory::read_snapshot(&path) {
        Ok(s) => s,
        Err(e) => return fail(NAME, e.to_string(), fix),
    };
    if snap.stale {
        return fail(
            NAME,
            format!(
                "{} is marked stale: gpuarchd's last NVML read failed",
                path.display()
            ),
            "journalctl -u gpuarchd says why; gpuarchctl reload once fixed",
        );
    }
    // The file changes only when the GPUs do: its age is when they last
    // changed. Whether it is current is gpuarchd's last successful read.
    let Some(changed) = humantime_age(&snap.generated_at) else {
        return fail(
            NAME,
            format!(
                "{}: generated_at {:?} is not a past RFC 3339 time",
                path.display(),
                snap.generated_at
            ),
            fix,
        );
    };
    let limit = Duration::from_secs(interval_s.saturating_mul(3));
    let what = format!(
        "{}: {} GPU(s), unchanged for {}",
        path.display(),
        snap.devices.len(),
        short_duration(changed)
    );
    match last_read {
        Some(age) if age > limit => fail(
            NAME,
            format!(
                "{what}, but gpuarchd's last successful NVML read was {}, more than 3 refresh intervals ({interval_s} s)",
                if age == Duration::MAX {
                    "never".to_owned()
                } else {
                    format!("{} ago", short_duration(age))
                }
            ),
            fix,
        ),
        Some(age) => ok(
            NAME,
            format!("{what}; gpuarchd read NVML {} ago", short_duration(age)),
        ),
        None => ok(
            NAME,
            format!("{what}; gpuarchd does not answer, so whether it is current is not known"),
        ),
    }
}

/// gpuarchd's answer for the compiler of NVRTC packages (`NVRTC 12.9
/// (PATH)` or `none: REASON`); `None` when gpuarchd does not answer.
pub(super) fn ask_compiler(d: &Daemon) -> Option<String> {
    d.ask_within(Duration::from_secs(10), async {
        let e = |e| BusError::of("asking gpuarchd", e);
        let kc = d.proxy::<KernelCacheProxy>().await.map_err(e)?;
        kc.compiler().await.map_err(e)
    })
    .ok()
}

/// Whether NVRTC packages can be built: gpuarchd's own answer, or (when it
/// does not answer, on this host) NVRTC loaded here from `kernels.cuda_dirs`.
pub(super) fn compiler(
    kernels: &gpuarch_core::config::KernelsConfig,
    root: &Path,
    daemons: Option<String>,
) -> Check {
    const NAME: &str = "compiler";
    let fix = "install NVRTC: a CUDA 12 or 13 toolkit in /usr/local/cuda, or pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 and list its nvidia/ directory in kernels.cuda_dirs; then systemctl restart gpuarchd";
    let dirs: Vec<PathBuf> = kernels
        .package_dirs
        .iter()
        .map(|d| under(root, d))
        .filter(|d| d.exists())
        .collect();
    let (packages, _) = gpuarch_kernels::spec::discover(&dirs);
    let nvrtc_packages: Vec<&str> = packages
        .iter()
        .filter(|(_, p)| matches!(p.spec.build, gpuarch_kernels::spec::BuildSpec::Nvrtc { .. }))
        .map(|(name, _)| name.as_str())
        .collect();
    let (answer, whose) = match daemons {
        Some(a) => (a, "gpuarchd"),
        None if root == Path::new("/") => (
            local_compiler(&kernels.cuda_dirs),
            "gpuarchctl's own environment (gpuarchd does not answer)",
        ),
        None => return skip(NAME, "gpuarchd does not answer and --root is not this host"),
    };
    match answer.strip_prefix("none: ") {
        None => ok(NAME, format!("{answer}, as {whose} loads it")),
        Some(_) if nvrtc_packages.is_empty() => skip(
            NAME,
            format!("no NVRTC package to build; {whose}: {answer}"),
        ),
        // Containers still get their Plan; only these packages' builds
        // (and so their mounts) are missing.
        Some(why) => warn(
            NAME,
            format!(
                "no builds possible for {} ({} NVRTC package(s)): {why} ({whose})",
                nvrtc_packages.join(", "),
                nvrtc_packages.len()
            ),
            fix,
        ),
    }
}

/// NVRTC as this process finds it in `cuda_dirs`, in the daemon's words.
pub(super) fn local_compiler(cuda_dirs: &[PathBuf]) -> String {
    match gpuarch_kernels::toolchain::Nvrtc::load(cuda_dirs) {
        Ok(n) => format!("NVRTC {} ({})", n.version, n.library.display()),
        Err(e) => format!("none: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Status;

    /// A snapshot unchanged for years is current when gpuarchd read NVML
    /// lately, and not when its reads stopped three intervals ago (a hung
    /// read leaves the file unmarked), nor when it never read.
    #[test]
    fn the_snapshot_is_judged_by_the_last_read_not_the_files_age() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.json");
        let snap = gpuarch_core::snapshot::Snapshot {
            schema: 1,
            source: "test".into(),
            generated_at: "2020-01-01T00:00:00Z".into(),
            driver_version: "580.95.05".into(),
            cuda_driver_version: "13.0".into(),
            stale: false,
            devices: vec![],
        };
        std::fs::write(&path, snap.to_json_pretty()).unwrap();
        let cli = Cli::parse_from([
            "gpuarchctl",
            "--inventory",
            path.to_str().unwrap(),
            "doctor",
        ]);
        let daemon = gpuarch_core::config::DaemonConfig::default();
        let judged = |read| snapshot_judged(&cli, dir.path(), &daemon, read);
        let c = judged(Some(Duration::from_secs(20)));
        assert_eq!(c.status, Status::Ok, "{}", c.detail);
        assert!(
            c.detail.contains("gpuarchd read NVML 20s ago"),
            "{}",
            c.detail
        );
        let c = judged(Some(Duration::from_secs(181)));
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains(
                "last successful NVML read was 3m 1s ago, more than 3 refresh intervals (60 s)"
            ),
            "{}",
            c.detail
        );
        assert!(c.fix.unwrap().starts_with("systemctl restart gpuarchd"));
        let c = judged(Some(Duration::MAX));
        assert!(
            c.detail.contains("last successful NVML read was never"),
            "{}",
            c.detail
        );
        let c = judged(None);
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.detail.contains("whether it is current is not known"),
            "{}",
            c.detail
        );
    }
}
