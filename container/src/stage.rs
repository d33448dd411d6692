//! The `create-container` and `prestart` stages: the runtime has read the
//! config, so the env can no longer change; instead the Plan is written into
//! the container as files a shell or an entrypoint can source:
//! `/run/gpuarch/env` (`NAME=value` lines) and `/etc/profile.d/gpuarch.sh`.
//!
//! The OCI state on stdin differs between runtimes (runc says `creating`,
//! crun `created` with `pid` 0 in `createContainer`), so only `bundle` and
//! `pid` are read. The rootfs comes from the bundle's `config.json`: podman's
//! bundle is its userdata directory, with an absolute `root.path`.
//!
//! `createContainer` runs in the container's mount namespace before
//! `pivot_root`, so the rootfs path (and a `/run` tmpfs mounted on it) is
//! what the container will see. `prestart` runs in the runtime's namespace
//! after `pivot_root`; there the container's root is `/proc/PID/root`.
//!
//! When no earlier step (precreate, the shim) put kernel mounts in the config,
//! `createContainer` bind-mounts the packages for the container's GPUs
//! itself, read-only, onto handles resolved inside the rootfs
//! ([`Root::bind_read_only`]): the setup where the engine can change neither
//! its runtime nor run precreate. `prestart` mounts nothing (it would mount
//! in the runtime's namespace) and says so in its notes.
//!
//! When kernel packages with `libraries` are mounted, their directories go
//! into `/etc/ld.so.conf.d/gpuarch.conf` and, at createContainer only, the
//! host's ldconfig rebuilds the container's loader cache, pivoted into the
//! rootfs with no procfs and no capability to mount ([`crate::ldconfig`]).
//! It runs with an empty environment plus a fixed PATH: nothing of the
//! container's env (`LD_PRELOAD`, `LD_LIBRARY_PATH`, ...) reaches it.

use std::io::Read;
use std::path::{Path, PathBuf};

use gpuarch_core::config::EnvConfig;
use gpuarch_core::oci::{self, ContainerView};
use gpuarch_core::plan::{self, EnvVar, Plan};
use serde::Deserialize;

use crate::context::{self, Context};
use crate::jit;
use crate::kernels::{self, KernelMount};
use crate::rootfs::{Root, RootfsError};

pub const CREATE_CONTAINER: &str = "create-container";
pub const PRESTART: &str = "prestart";

/// The OCI state is small; anything past this is refused.
pub const MAX_STATE_BYTES: u64 = 1 << 20;

/// Files written inside the container, relative to its `/`.
pub const ENV_FILE: &str = "run/gpuarch/env";
pub const PROFILE_FILE: &str = "etc/profile.d/gpuarch.sh";
pub const LD_CONF_FILE: &str = "etc/ld.so.conf.d/gpuarch.conf";

/// Where the host's ldconfig is looked for, in order (Ubuntu's
/// `/sbin/ldconfig` is a shell wrapper around `ldconfig.real`).
pub const LDCONFIG: [&str; 3] = [
    "/sbin/ldconfig.real",
    "/sbin/ldconfig",
    "/usr/sbin/ldconfig",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    CreateContainer,
    Prestart,
    /// The shim, in the runtime's namespace before the runtime starts
    /// (`runtime.env_files`): the rootfs as the bundle names it, with none
    /// of the config's mounts on it yet; writes the env files only, never
    /// mounts (that would be in the host's namespace) nor runs ldconfig.
    BeforeRuntime,
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("OCI state on stdin: {0}")]
    State(String),
    #[error("{path}: {error}")]
    Bundle { path: PathBuf, error: oci::OciError },
    #[error("{path}: no \"root.path\"")]
    NoRoot { path: PathBuf },
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("ldconfig: not found (looked for {})", LDCONFIG.join(", "))]
    NoLdconfig,
    #[error("ldconfig: {0}")]
    Ldconfig(crate::ldconfig::LdconfigError),
    /// What `strict: true` refuses a start over (the Plan's `blocking`).
    #[error("{0}")]
    Refused(String),
}

/// The fields of the OCI state gpuarch reads.
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    pub bundle: PathBuf,
    #[serde(default)]
    pub pid: i64,
    /// The container's id (every runtime gives it; read for the log).
    #[serde(default)]
    pub id: Option<String>,
}

impl State {
    pub fn parse(bytes: &[u8]) -> Result<Self, StageError> {
        let s: Self =
            serde_json::from_slice(bytes).map_err(|e| StageError::State(e.to_string()))?;
        if !s.bundle.is_absolute() {
            return Err(StageError::State(format!(
                "bundle {} is not an absolute path",
                s.bundle.display()
            )));
        }
        Ok(s)
    }

    /// Read the state from `r`, refusing more than [`MAX_STATE_BYTES`].
    pub fn read(r: impl Read) -> Result<Self, StageError> {
        Self::parse(
            &context::read_at_most(r, MAX_STATE_BYTES)
                .map_err(|e| StageError::State(e.to_string()))?,
        )
    }
}

/// What the stage did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub plan: Plan,
    /// `NAME=value` as written; empty when nothing was written.
    pub env: Vec<(String, String)>,
}

/// The gpuarch variables as the container's process sees them: the value in
/// the config's env where there is one (set by precreate or the shim, or the
/// container's own, which is kept), else the Plan's; with `override`, the
/// Plan's wins. Variables the config disables are left out.
pub fn effective_env(view: &ContainerView, full: &Plan, cfg: &EnvConfig) -> Vec<(String, String)> {
    EnvVar::ALL
        .into_iter()
        .filter(|v| !cfg.disable.contains(v))
        .filter_map(|v| {
            let ours = full.env_get(v.name());
            let theirs = view.env_get(v.name());
            let value = if cfg.override_existing {
                ours.or(theirs)
            } else {
                theirs.or(ours)
            }?;
            Some((v.name().to_owned(), value.to_owned()))
        })
        .collect()
}

fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// Run the stage for the container described by `state`.
pub fn run(stage: Stage, state: &State, ctx: &Context) -> Result<Outcome, StageError> {
    let config_path = state.bundle.join("config.json");
    let bundle_err = |error| StageError::Bundle {
        path: config_path.clone(),
        error,
    };
    let (bytes, config, _) = context::read_config_file(&config_path).map_err(bundle_err)?;
    let mut view = ContainerView::from_value(&config)
        .or_else(|_| ContainerView::from_json(&bytes))
        .map_err(bundle_err)?;
    let full_cfg = EnvConfig {
        override_existing: true,
        ..ctx.config.env.clone()
    };
    let mut full = plan::plan(&view, &ctx.inventory, &full_cfg);
    ctx.refuse_if_strict(&full)
        .map_err(|r| StageError::Refused(r.0))?;
    if full.is_noop() {
        return Ok(Outcome {
            plan: full,
            env: Vec::new(),
        });
    }
    let root_path = config
        .get("root")
        .and_then(|r| r.get("path"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| StageError::NoRoot {
            path: config_path.clone(),
        })?;
    let rootfs = match stage {
        Stage::CreateContainer | Stage::BeforeRuntime => state.bundle.join(root_path),
        Stage::Prestart => prestart_rootfs(state, &state.bundle.join(root_path))?,
    };
    let root = Root::open(&rootfs)?;
    let mut notes = Vec::new();
    notes.extend(crate::image::read_into(
        &mut view,
        &root,
        &ctx.config.hook.image_cache,
    ));
    full = plan::plan(&view, &ctx.inventory, &full_cfg);
    let mut libs = library_dirs(
        &config,
        &ctx.config.kernels.mount_root,
        &ctx.config.kernels.view_dir(),
    );
    if !has_kernel_mounts(&config) {
        let mounted = mount_kernels(stage, &root, &full, ctx, &mut notes)?;
        if !mounted.is_empty() {
            full.add_kernels_dir(kernels::CONTAINER_DIR, &view, &full_cfg);
            libs.extend(mounted.iter().flat_map(KernelMount::library_dirs));
        }
    }
    if ctx.config.jit_cache.enable && !jit::has_mount(&config) {
        mount_jit(stage, &root, &config, &mut full, &view, ctx, &mut notes);
    }
    let mut env = effective_env(&view, &full, &ctx.config.env);
    env.retain(|(k, v)| {
        let ok = !v.contains(['\n', '\0']);
        if !ok {
            notes.push(format!("{k} not written: its value holds a newline"));
        }
        ok
    });
    let mut env_file = String::new();
    let mut profile = String::from("# Written by gpuarch-hook at container start.\n");
    for (k, v) in &env {
        env_file.push_str(&format!("{k}={v}\n"));
        profile.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    root.write_file(Path::new(ENV_FILE), env_file.as_bytes(), 0o644)?;
    root.write_file(Path::new(PROFILE_FILE), profile.as_bytes(), 0o644)?;
    if !libs.is_empty() && stage != Stage::CreateContainer {
        // Prestart runs in the runtime's namespaces, where the rootfs is
        // reached through /proc/PID/root; the createContainer entry that
        // precreate and the shim add for mounted libraries runs it.
        notes.push(format!(
            "ldconfig not run for {}: only the createContainer stage runs it",
            libs.join(", ")
        ));
    } else if !libs.is_empty() {
        let conf = format!("{}\n", libs.join("\n"));
        root.write_file(Path::new(LD_CONF_FILE), conf.as_bytes(), 0o644)?;
        ldconfig(&rootfs, &libs)?;
        notes.push(format!(
            "ldconfig ran inside the container for {}",
            libs.join(", ")
        ));
    }
    let mut plan = full;
    plan.notes.extend(notes);
    plan.notes.push(format!(
        "wrote /{ENV_FILE} and /{PROFILE_FILE} inside the container ({} variables)",
        env.len()
    ));
    Ok(Outcome { plan, env })
}

/// The rootfs as seen from the runtime's namespace at `prestart`. The
/// container's process may not have called `pivot_root` yet (runc has not):
/// then `/proc/PID/root` is the root of its mount namespace, a copy of the
/// host's tree, and the rootfs with the container's mounts on it is at the
/// bundle's path below it. Once it has, `/proc/PID/root` is the rootfs
/// itself. Which one is told by comparing it with the rootfs directory;
/// `/proc/PID/root` alone is never taken for the rootfs on a guess, since
/// before `pivot_root` that would be the host.
fn prestart_rootfs(state: &State, rootfs: &Path) -> Result<PathBuf, StageError> {
    use std::os::unix::fs::MetadataExt;
    if state.pid <= 0 {
        return Ok(rootfs.to_owned());
    }
    let proc_root = PathBuf::from(format!("/proc/{}/root", state.pid));
    let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    match (id(&proc_root), id(rootfs)) {
        (Ok(a), Ok(b)) if a == b => Ok(proc_root),
        (Ok(_), _) => Ok(proc_root.join(rootfs.strip_prefix("/").unwrap_or(rootfs))),
        (Err(e), _) => Err(StageError::State(format!(
            "container process {}: {e}",
            state.pid
        ))),
    }
}

/// Whether an earlier step (precreate, the shim) already put kernel mounts
/// in the config (the view at `/opt/gpuarch/kernels`, or packages under
/// it), or the container mounts something of its own there.
fn has_kernel_mounts(config: &serde_json::Value) -> bool {
    let prefix = format!("{}/", kernels::CONTAINER_DIR);
    config
        .get("mounts")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|ms| {
            ms.iter().any(|m| {
                m.get("destination")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|d| {
                        d.trim_end_matches('/') == kernels::CONTAINER_DIR || d.starts_with(&prefix)
                    })
            })
        })
}

/// The createContainer hook alone (no precreate, no shim): bind the kernel
/// packages for the container's GPUs read-only into its rootfs, from its own
/// mount namespace, as the config's mounts would have. At prestart the hook
/// runs in the runtime's namespace, where a mount would land on the host:
/// nothing is mounted there, and the notes say so.
fn mount_kernels(
    stage: Stage,
    root: &Root,
    plan: &Plan,
    ctx: &Context,
    notes: &mut Vec<String>,
) -> Result<Vec<KernelMount>, StageError> {
    let (kernels, found) = kernels::discover(
        &ctx.config.kernels,
        plan,
        &ctx.inventory.cuda_driver_version,
    );
    notes.extend(found);
    if kernels.is_empty() {
        return Ok(Vec::new());
    }
    if stage != Stage::CreateContainer {
        notes.push(format!(
            "{} kernel package(s) not mounted: only the createContainer stage mounts them",
            kernels.packages.len()
        ));
        return Ok(Vec::new());
    }
    // Nothing of the container's own is under the kernels' directory (or
    // this would not be called): the view, then what goes inside it.
    let mut said = Vec::new();
    let (binds, shown) = kernels.binds(&[], &mut said);
    // Every mount is read-only from the moment it is visible; one that fails
    // takes the ones made before it down again, so a failed stage leaves
    // the container as it found it.
    let mut made = Vec::new();
    let result = binds.iter().try_for_each(|b| {
        made.push(root.bind_read_only(&b.source, Path::new(&b.destination))?);
        Ok::<_, StageError>(())
    });
    if let Err(e) = result {
        // Innermost first: a build's mount sits on the view.
        for m in made.into_iter().rev() {
            let _ = m.undo();
        }
        return Err(e);
    }
    notes.extend(said);
    Ok(shown.into_iter().cloned().collect())
}

/// The createContainer hook alone: bind the container's JIT cache
/// read-write into its rootfs and set its variables (see [`jit`]). A cache
/// that cannot be mounted is a note: the container starts without one.
fn mount_jit(
    stage: Stage,
    root: &Root,
    config: &serde_json::Value,
    plan: &mut Plan,
    view: &ContainerView,
    ctx: &Context,
    notes: &mut Vec<String>,
) {
    if stage != Stage::CreateContainer {
        notes.push("no JIT cache: only the createContainer stage mounts it".to_owned());
        return;
    }
    let (jit_cfg, env_cfg) = (&ctx.config.jit_cache, &ctx.config.env);
    let Some(p) = jit::plan_cache(config, plan, view, jit_cfg, env_cfg) else {
        return;
    };
    match root.bind_writable(&p.fd, Path::new(gpuarch_core::jit::CONTAINER_DIR)) {
        Ok(_) => jit::add_env(plan, &p, view, env_cfg),
        Err(e) => notes.push(format!("no JIT cache: {e}")),
    }
}

/// Library directories (as the container sees them) of the kernel packages
/// this config mounts: a hand-made package's from its manifest under
/// `mount_root`, a published one's (an import with `--ldconfig`) from its
/// manifest in the container's view under `view_dir`. Read on the host side.
fn library_dirs(config: &serde_json::Value, mount_root: &Path, view_dir: &Path) -> Vec<String> {
    let Some(mounts) = config.get("mounts").and_then(serde_json::Value::as_array) else {
        return Vec::new();
    };
    let prefix = format!("{}/", kernels::CONTAINER_DIR);
    let mut dirs = Vec::new();
    for m in mounts {
        let (Some(dest), Some(src)) = (
            m.get("destination").and_then(serde_json::Value::as_str),
            m.get("source").and_then(serde_json::Value::as_str),
        ) else {
            continue;
        };
        let src = Path::new(src);
        if dest == kernels::CONTAINER_DIR && src.parent() == Some(view_dir) {
            dirs.extend(kernels::view_libraries(src));
            continue;
        }
        if !dest.starts_with(&prefix) || src.parent() != Some(mount_root) {
            continue;
        }
        if let Ok(man) = kernels::read_manifest(&src.join("manifest.json")) {
            dirs.extend(man.libraries.iter().map(|l| format!("{dest}/{l}")));
        }
    }
    dirs
}

/// Rebuild the container's loader cache with the host's ldconfig, confined
/// to the rootfs ([`crate::ldconfig`]).
fn ldconfig(rootfs: &Path, dirs: &[String]) -> Result<(), StageError> {
    let bin = LDCONFIG
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or(StageError::NoLdconfig)?;
    crate::ldconfig::run(bin, rootfs, dirs, context::SAFE_PATH).map_err(StageError::Ldconfig)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit::tests::ctx;
    use gpuarch_core::config::Config;
    use serde_json::json;

    fn bundle(dir: &Path, env: &[&str]) {
        std::fs::create_dir_all(dir.join("rootfs/etc")).unwrap();
        let c = json!({"process": {"env": env}, "root": {"path": "rootfs"}});
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    }

    fn state(dir: &Path) -> State {
        State::parse(
            json!({"ociVersion": "1.0.2", "id": "x", "status": "creating", "pid": 0, "bundle": dir})
                .to_string()
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn writes_the_effective_env_into_the_rootfs() {
        let tmp = tempfile::tempdir().unwrap();
        bundle(
            tmp.path(),
            &["NVIDIA_VISIBLE_DEVICES=1", "TORCH_CUDA_ARCH_LIST=it's mine"],
        );
        let out = run(
            Stage::CreateContainer,
            &state(tmp.path()),
            &ctx(Config::default()),
        )
        .unwrap();
        let env = std::fs::read_to_string(tmp.path().join("rootfs/run/gpuarch/env")).unwrap();
        assert!(env.contains("TORCH_CUDA_ARCH_LIST=it's mine\n"), "{env}");
        assert!(env.contains("GPUARCH_DTYPE=bfloat16\n"), "{env}");
        assert!(!env.contains("GPUARCH_KERNELS_DIR"), "{env}");
        let profile =
            std::fs::read_to_string(tmp.path().join("rootfs/etc/profile.d/gpuarch.sh")).unwrap();
        assert!(
            profile.contains(r"export TORCH_CUDA_ARCH_LIST='it'\''s mine'"),
            "{profile}"
        );
        // The 3090 runs flash-attn's sm_80 build: FLASH_ATTN_CUDA_ARCHS too.
        assert!(env.contains("FLASH_ATTN_CUDA_ARCHS=80\n"), "{env}");
        assert_eq!(out.env.len(), 10);
    }

    #[test]
    fn nothing_is_written_without_a_gpu() {
        let tmp = tempfile::tempdir().unwrap();
        bundle(tmp.path(), &["PATH=/bin"]);
        let out = run(
            Stage::CreateContainer,
            &state(tmp.path()),
            &ctx(Config::default()),
        )
        .unwrap();
        assert!(out.env.is_empty());
        assert!(!tmp.path().join("rootfs/run").exists());
    }

    #[test]
    fn bad_states_and_bundles_are_named() {
        for (input, want) in [
            (&b"{"[..], "OCI state on stdin"),
            (br#"{"bundle": "relative"}"#, "not an absolute path"),
            (br#"{"pid": 3}"#, "missing field `bundle`"),
        ] {
            let e = State::parse(input).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let e = run(
            Stage::CreateContainer,
            &state(tmp.path()),
            &ctx(Config::default()),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("config.json"), "{e}");
        let big = vec![b' '; (MAX_STATE_BYTES + 1) as usize];
        let e = State::read(&big[..]).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }
}
