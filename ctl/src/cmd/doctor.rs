//! `gpuarchctl doctor`: is this host set up for gpuarch? Each check says
//! what it found and, when it found a problem, the line that fixes it.
//!
//! Live checks (gpuarchd on the bus, NVML) ask the running system. File
//! checks (config, snapshot, cache, engine configs and programs) read below
//! `--root`, so an image or a chroot can be checked before it boots. Paths
//! named by the caller (`--inventory`, `GPUARCH_INVENTORY`, `GPUARCH_CONFIG`)
//! are taken as given.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};

use gpuarch_wire::dbus::{DaemonProxy, InventoryProxy, KernelCacheProxy};

use crate::cli::{Cli, DoctorArgs};
use crate::containerd as engines;
use crate::render::{age_of_stamp as humantime_age, short_duration};
use crate::source::{BusError, Daemon};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Nothing to check (an engine that is not installed).
    Skip,
    /// Works, with something missing that a part of gpuarch needs (NVRTC
    /// for the kernel builds): containers still get their Plan. Not a
    /// failure for the exit status.
    Warn,
    Fail,
}

#[derive(Debug, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Fail,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Warn,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

fn skip(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status: Status::Skip,
        detail: detail.into(),
        fix: None,
    }
}

/// The installed programs and their example configs.
const RUNTIME: &str = "/usr/bin/gpuarch-runtime";
const EXAMPLES: &str = "/usr/share/doc/gpuarch/examples";
/// Where podman (and CRI-O by default) read hooks.d files.
const HOOK_DIRS: [&str; 2] = [
    "/usr/share/containers/oci/hooks.d",
    "/etc/containers/oci/hooks.d",
];
const BIN_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// `path` (absolute, on the host) as seen below `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Run every check; print them; 1 when any failed.
pub fn run(cli: &Cli, args: &DoctorArgs, out: &mut String) -> Result<u8> {
    let checks = checks(cli, &args.root);
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    if cli.json {
        let doc = json!({"ok": failed == 0, "checks": checks});
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for c in &checks {
            let tag = match c.status {
                Status::Ok => "ok  ",
                Status::Skip => "-   ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            let _ = writeln!(out, "{tag}  {:<12} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "      {:<12} fix: {fix}", "");
            }
        }
        let mut summary = if failed == 0 {
            "no problems found".to_owned()
        } else {
            format!("{failed} problem(s)")
        };
        if warned > 0 {
            summary.push_str(&format!("; {warned} warning(s)"));
        }
        let _ = writeln!(out, "{summary}");
    }
    Ok(u8::from(failed > 0))
}

pub fn checks(cli: &Cli, root: &Path) -> Vec<Check> {
    let (config_path, from_env) = match std::env::var_os("GPUARCH_CONFIG") {
        Some(p) => (PathBuf::from(p), true),
        None => (under(root, Path::new("/etc/gpuarch/config.yaml")), false),
    };
    let mut checks = Vec::new();
    let config = match gpuarch_inventory::read_config_at(&config_path, from_env) {
        Ok(c) => {
            let detail = if config_path.exists() {
                format!("{} is valid", config_path.display())
            } else {
                format!("{} is absent: the defaults apply", config_path.display())
            };
            checks.push(ok("config", detail));
            c
        }
        Err(gpuarch_inventory::ConfigFileError::Untrusted(u)) => {
            let fix = u.fix.clone();
            checks.push(fail("config", format!("config: {u}"), fix));
            gpuarch_core::config::Config::default()
        }
        Err(e) => {
            checks.push(fail(
                "config",
                e.to_string(),
                format!(
                    "correct {} (gpuarchd --check-config shows the line), or reinstall it: apt install --reinstall -o Dpkg::Options::=--force-confmiss gpuarch",
                    config_path.display()
                ),
            ));
            gpuarch_core::config::Config::default()
        }
    };
    checks.push(trust(&config, root));
    // One connection for every question to gpuarchd.
    let bus = Daemon::connect();
    let d = bus.as_ref().ok();
    checks.push(daemon(&bus));
    checks.push(nvml(cli, d.and_then(daemon_nvml)));
    checks.push(snapshot_judged(
        cli,
        root,
        &config.daemon,
        d.and_then(daemon_last_read),
    ));
    checks.push(cache(&under(root, &config.kernels.cache_dir)));
    checks.push(compiler(&config.kernels, root, d.and_then(ask_compiler)));
    checks.push(jit(&config.jit_cache, root));
    checks.push(nfd(cli, &config, root));
    checks.push(registry(&config.kernels, root));
    checks.push(podman(root));
    checks.push(docker(root));
    checks.push(docker_gpus(root));
    checks.push(containerd(root));
    checks.extend(crio(root));
    checks
}

/// What gpuarch runs or loads as root besides its config: kernel packages
/// (a `command` build runs as root), the OCI runtime the shim execs, the
/// CUDA directories NVRTC and build tools come from. Each must be root's
/// and written by nobody else ([`gpuarch_inventory::trust`]).
fn trust(config: &gpuarch_core::config::Config, root: &Path) -> Check {
    use gpuarch_inventory::trust;
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut judge = |what: &str, p: &Path| {
        if let Err(u) = trust::check(p) {
            problems.push((format!("{what}: {u}"), u.fix));
        }
    };
    let package_dirs: Vec<PathBuf> = config
        .kernels
        .package_dirs
        .iter()
        .map(|d| under(root, d))
        .filter(|d| d.exists())
        .collect();
    for d in &package_dirs {
        judge("kernels.package_dirs", d);
    }
    if let Some(r) = &config.runtime.path {
        judge("runtime.path", &under(root, r));
    }
    for d in &config.kernels.cuda_dirs {
        let d = under(root, d);
        if d.exists() {
            judge("kernels.cuda_dirs", &d);
        }
    }
    let (_, errors) = gpuarch_kernels::spec::discover(&package_dirs);
    for e in errors
        .iter()
        .filter(|e| e.reason.contains("is not trusted"))
    {
        let fix = e
            .reason
            .rsplit_once("(fix: ")
            .map_or_else(String::new, |(_, f)| f.trim_end_matches(')').to_owned());
        problems.push((format!("kernel package: {e}"), fix));
    }
    if problems.is_empty() {
        return ok(
            "trust",
            "the kernel packages, runtime and CUDA directories in use are root's and writable by no one else",
        );
    }
    let (details, fixes): (Vec<String>, Vec<String>) = problems.into_iter().unzip();
    fail("trust", details.join("; "), fixes.join("; "))
}

fn daemon(bus: &Result<Daemon>) -> Check {
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
        let version = DaemonProxy::new(&d.conn)
            .await
            .map_err(e)?
            .version()
            .await
            .map_err(e)?;
        let inv = InventoryProxy::new(&d.conn).await.map_err(e)?;
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

/// What gpuarchd says of its own NVML reads.
struct DaemonNvml {
    library: String,
    last_ok: Option<Duration>,
    last_error: String,
    gpus: usize,
    driver: String,
}

fn daemon_nvml(d: &Daemon) -> Option<DaemonNvml> {
    d.ask_within(Duration::from_secs(5), async {
        let e = |e| BusError::of("asking gpuarchd", e);
        let inv = InventoryProxy::new(&d.conn).await.map_err(e)?;
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
fn nvml(cli: &Cli, daemons: Option<DaemonNvml>) -> Check {
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
fn snapshot_path(cli: &Cli, root: &Path, daemon: &gpuarch_core::config::DaemonConfig) -> PathBuf {
    cli.inventory
        .clone()
        .or_else(|| std::env::var_os("GPUARCH_INVENTORY").map(PathBuf::from))
        .unwrap_or_else(|| under(root, &daemon.snapshot))
}

/// When gpuarchd's NVML read last succeeded (it rewrites the snapshot only
/// when the GPUs change, so the file's own time says nothing of that);
/// `None` when gpuarchd does not answer.
fn daemon_last_read(d: &Daemon) -> Option<Duration> {
    let usec = d
        .ask_within(Duration::from_secs(5), async {
            let e = |e| BusError::of("asking gpuarchd", e);
            let inv = InventoryProxy::new(&d.conn).await.map_err(e)?;
            inv.last_refresh().await.map_err(e)
        })
        .ok()?;
    crate::render::age_of_usec(usec).or(Some(Duration::MAX))
}

/// The snapshot check, given how long ago gpuarchd's last NVML read
/// succeeded (`None`: gpuarchd does not answer, which its own check says).
fn snapshot_judged(
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
fn ask_compiler(d: &Daemon) -> Option<String> {
    d.ask_within(Duration::from_secs(10), async {
        let e = |e| BusError::of("asking gpuarchd", e);
        let kc = KernelCacheProxy::new(&d.conn).await.map_err(e)?;
        kc.compiler().await.map_err(e)
    })
    .ok()
}

/// Whether NVRTC packages can be built: gpuarchd's own answer, or (when it
/// does not answer, on this host) NVRTC loaded here from `kernels.cuda_dirs`.
fn compiler(
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
fn local_compiler(cuda_dirs: &[PathBuf]) -> String {
    match gpuarch_kernels::toolchain::Nvrtc::load(cuda_dirs) {
        Ok(n) => format!("NVRTC {} ({})", n.version, n.library.display()),
        Err(e) => format!("none: {e}"),
    }
}

fn cache(dir: &Path) -> Check {
    const NAME: &str = "kernel cache";
    use nix::sys::statvfs::{FsFlags, statvfs};
    use nix::unistd::{AccessFlags, access};
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return fail(
                NAME,
                format!("{} is not a directory", dir.display()),
                format!("move it away; gpuarchd recreates {}", dir.display()),
            );
        }
        Err(e) => {
            return fail(
                NAME,
                format!("{}: {e}", dir.display()),
                "systemctl restart gpuarchd (its unit creates the cache directory)",
            );
        }
    }
    let vfs = match statvfs(dir) {
        Ok(v) => v,
        Err(e) => {
            return fail(
                NAME,
                format!("{}: statvfs: {e}", dir.display()),
                "check the filesystem it is on",
            );
        }
    };
    if vfs.flags().contains(FsFlags::ST_RDONLY) {
        return fail(
            NAME,
            format!("{} is on a read-only filesystem", dir.display()),
            "mount it read-write, or point kernels.cache_dir at a writable directory",
        );
    }
    if let Err(e) = access(dir, AccessFlags::W_OK) {
        let who = nix::unistd::geteuid();
        return fail(
            NAME,
            format!("{} is not writable by uid {who}: {e}", dir.display()),
            if who.is_root() {
                "chown root: and chmod u+w it".to_owned()
            } else {
                "run gpuarchctl doctor as root (gpuarchd writes the cache as root)".to_owned()
            },
        );
    }
    let free = vfs.blocks_available() as u64 * vfs.fragment_size() as u64;
    ok(
        NAME,
        format!(
            "{} is writable, {:.1} GiB free",
            dir.display(),
            free as f64 / f64::from(1u32 << 30)
        ),
    )
}

/// The JIT caches, when on: their directory is root's and no one else's
/// (the hook refuses it otherwise), and gpuarchd's unit may write there
/// (ProtectSystem=strict leaves it only /var/cache/gpuarch, unless a
/// drop-in adds `ReadWritePaths=`).
fn jit(cfg: &gpuarch_core::config::JitCacheConfig, root: &Path) -> Check {
    const NAME: &str = "JIT caches";
    if !cfg.enable {
        return skip(NAME, "off (jit_cache.enable)");
    }
    let dir = under(root, &cfg.dir);
    if dir.exists()
        && let Err(u) = gpuarch_inventory::trust::check(&dir)
    {
        let fix = u.fix.clone();
        return fail(NAME, format!("jit_cache.dir: {u}"), fix);
    }
    if !cfg.dir.starts_with("/var/cache/gpuarch") {
        let dropins = under(root, Path::new(DROPINS));
        if !writable_by_unit(root, &cfg.dir) {
            return fail(
                NAME,
                format!(
                    "{} is outside /var/cache/gpuarch, where gpuarchd's unit cannot write: it cannot remove caches there",
                    cfg.dir.display()
                ),
                format!(
                    "add ReadWritePaths={} in {}/jit.conf, then systemctl daemon-reload and restart gpuarchd",
                    cfg.dir.display(),
                    dropins.display()
                ),
            );
        }
    }
    ok(
        NAME,
        format!(
            "on, scope {}, in {} (up to {:.1} GiB)",
            cfg.scope,
            cfg.dir.display(),
            cfg.max_bytes as f64 / f64::from(1u32 << 30)
        ),
    )
}

const DROPINS: &str = "/etc/systemd/system/gpuarchd.service.d";

/// Whether a drop-in of gpuarchd's unit names `dir` in `ReadWritePaths=`
/// (ProtectSystem=strict leaves the unit nothing else outside its own
/// directories).
fn writable_by_unit(root: &Path, dir: &Path) -> bool {
    dropin_has(root, |l| {
        l.trim_start().starts_with("ReadWritePaths=")
            && l.split(['=', ' '])
                .any(|w| Path::new(w.trim_start_matches('-')) == dir)
    })
}

/// Whether a line of gpuarchd's drop-ins below `root` is `pred`'s.
fn dropin_has(root: &Path, pred: impl Fn(&str) -> bool) -> bool {
    std::fs::read_dir(under(root, Path::new(DROPINS)))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.lines().any(&pred)))
}

/// The Node Feature Discovery file, when exported: its directory exists
/// and gpuarchd's unit may write there, and it holds the labels of the
/// inventory gpuarchd serves now.
fn nfd(cli: &Cli, cfg: &gpuarch_core::config::Config, root: &Path) -> Check {
    const NAME: &str = "NFD labels";
    let export = &cfg.export;
    if !export.nfd {
        return skip(NAME, "off (export.nfd)");
    }
    let file = under(root, &export.nfd_file);
    let parent = export.nfd_file.parent().unwrap_or(Path::new("/"));
    let default_dir = Path::new(gpuarch_core::config::DEFAULT_NFD_FILE).parent();
    if !under(root, parent).is_dir() {
        return fail(
            NAME,
            format!("{} does not exist", parent.display()),
            "deploy NFD's worker (it mounts that directory from the host) or mkdir it, then systemctl restart gpuarchd",
        );
    }
    if Some(parent) != default_dir && !writable_by_unit(root, parent) {
        return fail(
            NAME,
            format!(
                "{} is outside the directories gpuarchd's unit may write",
                parent.display()
            ),
            format!(
                "add ReadWritePaths={} in {DROPINS}/nfd.conf, then systemctl daemon-reload and restart gpuarchd",
                parent.display()
            ),
        );
    }
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            return fail(
                NAME,
                format!("{}: {e}", export.nfd_file.display()),
                "journalctl -u gpuarchd says why it was not written (a directory made after gpuarchd started needs a restart)",
            );
        }
    };
    if !text.starts_with(gpuarch_core::nfd::HEADER) {
        return fail(
            NAME,
            format!("{} was not written by gpuarchd", export.nfd_file.display()),
            "move that file away, or point export.nfd_file elsewhere",
        );
    }
    let snap_path = snapshot_path(cli, root, &cfg.daemon);
    let lines = text.lines().filter(|l| !l.starts_with('#')).count();
    match gpuarch_inventory::read_snapshot(&snap_path) {
        Ok(snap) if gpuarch_core::nfd::render(&gpuarch_core::nfd::labels(&snap)) != text => fail(
            NAME,
            format!(
                "{} does not match the inventory in {}",
                export.nfd_file.display(),
                snap_path.display()
            ),
            "journalctl -u gpuarchd says why it was not rewritten",
        ),
        _ => ok(
            NAME,
            format!("{lines} labels in {}", export.nfd_file.display()),
        ),
    }
}

/// The registry tier, when configured: gpuarchd's unit may reach the
/// network (it has none without a drop-in), and the registry answers a TCP
/// connection from here.
fn registry(cfg: &gpuarch_core::config::KernelsConfig, root: &Path) -> Check {
    const NAME: &str = "registry";
    let Some(r) = &cfg.remote else {
        return skip(NAME, "off (kernels.remote)");
    };
    let opened = dropin_has(root, |l| {
        l.split_whitespace().collect::<String>() == "PrivateNetwork=no"
    });
    if !opened {
        return fail(
            NAME,
            format!(
                "gpuarchd's unit has no network (PrivateNetwork=yes): {} is out of its reach, so every build runs here",
                r.repository
            ),
            format!(
                "add [Service] PrivateNetwork=no, RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 and IPAddressAllow=<the registry's address> in {DROPINS}/registry.conf, then systemctl daemon-reload and restart gpuarchd"
            ),
        );
    }
    let (host, port) = r.host_and_port();
    let addr = format!("{host}:{port}");
    use std::net::ToSocketAddrs;
    let reached = addr.to_socket_addrs().map(|mut a| {
        a.any(|sa| std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(2)).is_ok())
    });
    match reached {
        Ok(true) => ok(
            NAME,
            format!(
                "{} answers; push {}",
                r.repository,
                if r.push { "on" } else { "off" }
            ),
        ),
        Ok(false) => fail(
            NAME,
            format!("{addr} does not accept a connection: builds run here until it does"),
            "check the registry and the route to it",
        ),
        Err(e) => fail(
            NAME,
            format!("{addr}: {e}"),
            "check the registry's name in kernels.remote.repository",
        ),
    }
}

/// The engine's program below `root`, if installed.
fn installed(root: &Path, program: &str) -> Option<PathBuf> {
    BIN_DIRS
        .iter()
        .map(|d| under(root, &Path::new(d).join(program)))
        .find(|p| p.is_file())
}

/// hooks.d files below `root` in `dirs` whose hook runs gpuarch-hook at
/// `stage`: (file, whether the program it names is installed).
fn gpuarch_hooks(root: &Path, dirs: &[&str], stage: &str) -> Vec<(PathBuf, bool)> {
    let mut found = Vec::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(under(root, Path::new(d))) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "json"))
        {
            let Some(h) = std::fs::read(&f)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            else {
                continue;
            };
            let path = h["hook"]["path"].as_str().unwrap_or_default();
            let stages = h["stages"].as_array().cloned().unwrap_or_default();
            if path.ends_with("/gpuarch-hook") && stages.iter().any(|s| s == stage) {
                let exe = under(root, Path::new(path));
                found.push((f, exe.is_file()));
            }
        }
    }
    found
}

fn podman(root: &Path) -> Check {
    const NAME: &str = "podman";
    if installed(root, "podman").is_none() {
        return skip(NAME, "not installed");
    }
    let hooks = gpuarch_hooks(root, &HOOK_DIRS, "precreate");
    match hooks.iter().find(|(_, exe)| *exe) {
        Some((f, _)) => ok(NAME, format!("wired: precreate hook {}", f.display())),
        None => fail(
            NAME,
            "no hooks.d file runs gpuarch-hook at precreate (podman reads /usr/share/containers/oci/hooks.d and /etc/containers/oci/hooks.d unless containers.conf sets hooks_dir)",
            "apt install --reinstall gpuarch (it ships /usr/share/containers/oci/hooks.d/gpuarch-hook.json)",
        ),
    }
}

/// The program dockerd looks for on its PATH at start; only with it does it
/// register the `gpu` device driver that `--gpus` and compose's GPU
/// reservations ask for (NVIDIA's container toolkit installs it).
const NVIDIA_HOOK: &str = "nvidia-container-runtime-hook";

/// Will `docker run --gpus` work? gpuarch plans from the
/// `NVIDIA_VISIBLE_DEVICES` dockerd's gpu driver sets; without the driver
/// dockerd refuses the request before any runtime runs.
fn docker_gpus(root: &Path) -> Check {
    const NAME: &str = "docker gpus";
    if installed(root, "dockerd").is_none() {
        return skip(NAME, "docker not installed");
    }
    match installed(root, NVIDIA_HOOK) {
        Some(p) => ok(
            NAME,
            format!(
                "--gpus and compose GPU reservations work: dockerd finds {} and sets NVIDIA_VISIBLE_DEVICES, which gpuarch plans from",
                p.display()
            ),
        ),
        None => warn(
            NAME,
            format!(
                "docker run --gpus and compose GPU reservations fail (could not select device driver \"\" with capabilities: [[gpu]]): dockerd registers its gpu driver only when {NVIDIA_HOOK} is on its PATH"
            ),
            "install NVIDIA's container toolkit (nvidia-container-toolkit), then systemctl restart docker; until then give GPUs as --device /dev/nvidiaN, which gpuarch plans too",
        ),
    }
}

fn docker(root: &Path) -> Check {
    const NAME: &str = "docker";
    if installed(root, "dockerd").is_none() {
        return skip(NAME, "not installed");
    }
    let file = under(root, Path::new("/etc/docker/daemon.json"));
    let fix = format!(
        "add \"runtimes\": {{\"gpuarch\": {{\"path\": \"{RUNTIME}\"}}}} to /etc/docker/daemon.json (as in {EXAMPLES}/docker/daemon.json), systemctl restart docker, then docker run --runtime gpuarch (or set \"default-runtime\": \"gpuarch\")"
    );
    let doc: Value = match std::fs::read(&file) {
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(v) => v,
            Err(e) => {
                return fail(
                    NAME,
                    format!("{}: not JSON: {e}", file.display()),
                    "correct the file (dockerd refuses to start with it as it is)",
                );
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail(NAME, format!("{} does not exist", file.display()), fix);
        }
        Err(e) => return fail(NAME, format!("{}: {e}", file.display()), fix),
    };
    let names: Vec<&String> = doc["runtimes"]
        .as_object()
        .map(|rs| {
            rs.iter()
                .filter(|(_, r)| {
                    r["path"]
                        .as_str()
                        .is_some_and(|p| p.ends_with("gpuarch-runtime"))
                })
                .map(|(n, _)| n)
                .collect()
        })
        .unwrap_or_default();
    match names.first() {
        Some(n) => {
            let default = doc["default-runtime"].as_str() == Some(n.as_str());
            ok(
                NAME,
                format!(
                    "wired: runtime \"{n}\" in {}{}",
                    file.display(),
                    if default {
                        " (the default runtime)"
                    } else {
                        "; containers use it with --runtime"
                    }
                ),
            )
        }
        None => fail(
            NAME,
            format!("{} has no runtime running gpuarch-runtime", file.display()),
            fix,
        ),
    }
}

/// Tables (dotted paths) of `v` whose `key` is a string ending in `suffix`.
fn toml_find(v: &toml::Value, key: &str, suffix: &str, at: &str, found: &mut Vec<String>) {
    if let toml::Value::Table(t) = v {
        for (k, child) in t {
            if k == key && child.as_str().is_some_and(|s| s.ends_with(suffix)) {
                found.push(at.to_owned());
            }
            let path = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            toml_find(child, key, suffix, &path, found);
        }
    }
}

fn read_toml(file: &Path) -> Result<Option<toml::Value>> {
    match std::fs::read_to_string(file) {
        Ok(text) => toml::from_str(&text)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{}: not TOML: {}", file.display(), e.message())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context(file.display().to_string())),
    }
}

fn containerd(root: &Path) -> Check {
    const NAME: &str = "containerd";
    if installed(root, "containerd").is_none() {
        return skip(NAME, "not installed");
    }
    let file = under(root, Path::new("/etc/containerd/config.toml"));
    let fix = format!(
        "gpuarchctl engine containerd --write (a drop-in at {}), systemctl restart containerd, and give pods runtimeClassName: gpuarch ({EXAMPLES}/containerd/runtimeclass.yaml)",
        engines::DROPIN
    );
    if !file.exists() {
        return fail(NAME, format!("{} does not exist", file.display()), fix);
    }
    let eff = match engines::effective(root, &file, None) {
        Ok(e) => e,
        Err(e) => return fail(NAME, format!("{e:#}"), "correct the file"),
    };
    if let Some(problem) = eff.cri_problem() {
        return fail(NAME, problem, fix);
    }
    let handlers = eff.gpuarch_handlers();
    let dropin = under(root, Path::new(engines::DROPIN));
    if handlers.is_empty() && dropin.exists() && !eff.reads_file(root, &file, &dropin) {
        return fail(
            NAME,
            format!(
                "{} does not import {}, so containerd never reads gpuarch's handler",
                file.display(),
                dropin.display()
            ),
            "gpuarchctl engine containerd --write (it adds the imports entry, keeping a backup), then systemctl restart containerd",
        );
    }
    if handlers.is_empty() {
        return fail(
            NAME,
            format!(
                "{}: no CRI runtime handler runs gpuarch-runtime",
                file.display()
            ),
            fix,
        );
    }
    if dropin.exists() && engines::stale(root, &file, &dropin).unwrap_or(false) {
        return fail(
            NAME,
            format!(
                "{} holds an older copy of {}'s CRI section, and containerd 1.x reads only the copy",
                dropin.display(),
                file.display()
            ),
            fix,
        );
    }
    ok(
        NAME,
        format!(
            "CRI loads; runtime handler {} runs gpuarch-runtime",
            handlers.join(", ")
        ),
    )
}

/// CRI-O: a runtime handler, and a hooks_dir it can read. Its hooks library
/// refuses a directory holding a hook for a stage it does not know, such as
/// podman's precreate.
fn crio(root: &Path) -> Vec<Check> {
    const NAME: &str = "cri-o";
    if installed(root, "crio").is_none() {
        return vec![skip(NAME, "not installed")];
    }
    // crio.conf, then crio.conf.d/*.conf in name order: later settings win.
    let mut files = vec![under(root, Path::new("/etc/crio/crio.conf"))];
    if let Ok(entries) = std::fs::read_dir(under(root, Path::new("/etc/crio/crio.conf.d"))) {
        let mut more: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "conf"))
            .collect();
        more.sort();
        files.extend(more);
    }
    let mut handler = None;
    let mut hooks_dir: Vec<String> = vec![HOOK_DIRS[0].to_owned()];
    for f in &files {
        let doc = match read_toml(f) {
            Ok(Some(d)) => d,
            Ok(None) => continue,
            Err(e) => return vec![fail(NAME, format!("{e:#}"), "correct the file")],
        };
        let mut found = Vec::new();
        toml_find(&doc, "runtime_path", "gpuarch-runtime", "", &mut found);
        if let Some(t) = found.into_iter().next() {
            handler = Some((t, f.clone()));
        }
        if let Some(dirs) = doc
            .get("crio")
            .and_then(|c| c.get("runtime"))
            .and_then(|r| r.get("hooks_dir"))
            .and_then(toml::Value::as_array)
        {
            hooks_dir = dirs
                .iter()
                .filter_map(|d| d.as_str().map(str::to_owned))
                .collect();
        }
    }
    let fix = format!(
        "cp {EXAMPLES}/crio/50-gpuarch.conf /etc/crio/crio.conf.d/ and systemctl restart crio"
    );
    let mut checks = vec![match handler {
        Some((t, f)) => ok(
            NAME,
            format!("wired: [{t}] in {} runs gpuarch-runtime", f.display()),
        ),
        None => fail(NAME, "no runtime handler runs gpuarch-runtime", fix.clone()),
    }];
    let dirs: Vec<&str> = hooks_dir.iter().map(String::as_str).collect();
    let precreate = gpuarch_hooks(root, &dirs, "precreate");
    if let Some((f, _)) = precreate.first() {
        checks.push(fail(
            "cri-o hooks",
            format!(
                "CRI-O reads {}, which holds podman's precreate hook; CRI-O has no precreate stage and its hooks library refuses that directory",
                f.parent().map_or_else(String::new, |p| p.display().to_string())
            ),
            fix,
        ));
    } else if !gpuarch_hooks(root, &dirs, "createContainer").is_empty() {
        checks.push(ok(
            "cri-o hooks",
            "the createContainer hook is in its hooks_dir",
        ));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_jit_check_names_an_untrusted_or_unwritable_directory() {
        use gpuarch_core::config::JitCacheConfig;
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let off = JitCacheConfig::default();
        assert_eq!(jit(&off, root.path()).status, Status::Skip);
        let on = JitCacheConfig {
            enable: true,
            ..off
        };
        assert_eq!(jit(&on, root.path()).status, Status::Ok);
        let dir = under(root.path(), &on.dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let c = jit(&on, root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("is not trusted"), "{}", c.detail);
        let srv = JitCacheConfig {
            dir: PathBuf::from("/srv/jit"),
            ..on
        };
        let c = jit(&srv, root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("ReadWritePaths=/srv/jit"));
        let dropins = under(
            root.path(),
            Path::new("/etc/systemd/system/gpuarchd.service.d"),
        );
        std::fs::create_dir_all(&dropins).unwrap();
        std::fs::write(
            dropins.join("jit.conf"),
            "[Service]\nReadWritePaths=/srv/jit\n",
        )
        .unwrap();
        assert_eq!(jit(&srv, root.path()).status, Status::Ok);
    }

    #[test]
    fn the_registry_check_wants_a_network_and_an_answer() {
        use gpuarch_core::config::{KernelsConfig, RemoteConfig};
        let root = tempfile::tempdir().unwrap();
        let off = KernelsConfig::default();
        assert_eq!(registry(&off, root.path()).status, Status::Skip);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let on = |port: u16| KernelsConfig {
            remote: Some(RemoteConfig {
                repository: format!("127.0.0.1:{port}/gpuarch/kernels"),
                push: true,
                credentials: None,
                plain_http: true,
                ca_file: None,
                pull_timeout_ms: 1000,
            }),
            ..KernelsConfig::default()
        };
        let c = registry(&on(port), root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("PrivateNetwork=no"));
        let dropins = under(root.path(), Path::new(DROPINS));
        std::fs::create_dir_all(&dropins).unwrap();
        std::fs::write(
            dropins.join("registry.conf"),
            "[Service]\nPrivateNetwork=no\n",
        )
        .unwrap();
        let c = registry(&on(port), root.path());
        assert_eq!(c.status, Status::Ok, "{}", c.detail);
        drop(listener);
        let c = registry(&on(port), root.path());
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("does not accept a connection"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn toml_find_names_the_table() {
        let doc: toml::Value = toml::from_str(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpuarch.options]\nBinaryName = \"/usr/bin/gpuarch-runtime\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut found = Vec::new();
        toml_find(&doc, "BinaryName", "gpuarch-runtime", "", &mut found);
        assert_eq!(
            found,
            ["plugins.io.containerd.grpc.v1.cri.containerd.runtimes.gpuarch.options"]
        );
    }
}
