//! `gpuarchctl doctor`: is this host set up for gpuarch? Each check says
//! what it found and, when it found a problem, the line that fixes it.
//!
//! Live checks (gpuarchd on the bus, NVML) ask the running system. File
//! checks (config, snapshot, cache, engine configs and programs) read below
//! `--root`, so an image or a chroot can be checked before it boots. Paths
//! named by the caller (`--inventory`, `GPUARCH_INVENTORY`, `GPUARCH_CONFIG`)
//! are taken as given.
//!
//! Here: the order of the checks and their report. The checks live beside
//! it: `node` (gpuarchd, NVML, the snapshot, the compiler: the running
//! system), `files` (trust, the caches, NFD, the registry: files below
//! `--root`), and every engine's through [`crate::engine`].

mod files;
mod node;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

pub use crate::check::{Check, Status};
use crate::check::{fail, ok, under};
use crate::cli::{Cli, DoctorArgs};
use crate::render;
use crate::source::Daemon;
use files::{cache, jit, nfd, registry, trust};
use node::{
    ask_compiler, compiler, daemon, daemon_last_read, daemon_nvml, nri, nvml, snapshot_judged,
};

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
            let _ = writeln!(out, "{tag}  {:<12} {}", c.name, render::shown(&c.detail));
            if let Some(fix) = &c.fix {
                let _ = writeln!(out, "      {:<12} fix: {}", "", render::shown(fix));
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
    let config = match gpuarch_fs::config::read_config_at(&config_path, from_env) {
        Ok(c) => {
            let detail = if config_path.exists() {
                format!("{} is valid", config_path.display())
            } else {
                format!("{} is absent: the defaults apply", config_path.display())
            };
            checks.push(ok("config", detail));
            c
        }
        Err(gpuarch_fs::config::ConfigFileError::Untrusted(u)) => {
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
    let mut live = vec![
        daemon(&bus),
        nvml(cli, d.and_then(daemon_nvml)),
        snapshot_judged(cli, root, &config.daemon, d.and_then(daemon_last_read)),
    ];
    // gpuarchd and NVML are this host's, whatever --root says: each such
    // answer says so, not to be taken for the other root's.
    if root != Path::new("/") {
        for c in &mut live {
            c.detail = format!(
                "{} [this host's gpuarchd and NVML, not {}'s: --root reads only files there]",
                c.detail,
                root.display()
            );
        }
    }
    checks.extend(live);
    checks.push(cache(
        &under(root, &config.kernels.cache_dir),
        config.kernels.max_bytes,
    ));
    checks.push(compiler(&config.kernels, root, d.and_then(ask_compiler)));
    checks.push(jit(&config.jit_cache, root));
    checks.push(nfd(cli, &config, root));
    checks.push(nri(d, &config.nri));
    checks.push(registry(&config.kernels, root));
    for e in crate::engine::ALL {
        checks.extend(crate::engine::check(e, root));
    }
    checks
}
