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

use std::io::Read;
use std::path::{Path, PathBuf};

use gpuarch_core::config::EnvConfig;
use gpuarch_core::oci::{self, ContainerView};
use gpuarch_core::plan::{self, EnvVar, Plan};
use serde::Deserialize;

use crate::Context;
use crate::rootfs::{Root, RootfsError};

pub const CREATE_CONTAINER: &str = "create-container";
pub const PRESTART: &str = "prestart";

/// The OCI state is small; anything past this is refused.
pub const MAX_STATE_BYTES: u64 = 1 << 20;

/// Files written inside the container, relative to its `/`.
pub const ENV_FILE: &str = "run/gpuarch/env";
pub const PROFILE_FILE: &str = "etc/profile.d/gpuarch.sh";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    CreateContainer,
    Prestart,
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("OCI state on stdin: {0}")]
    State(String),
    #[error("{path}: {source}")]
    Bundle {
        path: PathBuf,
        source: oci::OciError,
    },
    #[error("{path}: no \"root.path\"")]
    NoRoot { path: PathBuf },
    #[error("{0}")]
    Rootfs(#[from] RootfsError),
}

/// The fields of the OCI state gpuarch reads.
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    pub bundle: PathBuf,
    #[serde(default)]
    pub pid: i64,
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
        let mut bytes = Vec::new();
        r.take(MAX_STATE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| StageError::State(e.to_string()))?;
        if bytes.len() as u64 > MAX_STATE_BYTES {
            return Err(StageError::State(format!(
                "larger than {MAX_STATE_BYTES} bytes"
            )));
        }
        Self::parse(&bytes)
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
    let bundle_err = |source| StageError::Bundle {
        path: config_path.clone(),
        source,
    };
    let file = std::fs::File::open(&config_path).map_err(|e| bundle_err(oci::OciError::Read(e)))?;
    let config =
        oci::parse_value(&oci::read_bounded(file).map_err(bundle_err)?).map_err(bundle_err)?;
    let view = ContainerView::from_value(&config).map_err(bundle_err)?;
    let full_cfg = EnvConfig {
        override_existing: true,
        ..ctx.config.env.clone()
    };
    let full = plan::plan(&view, &ctx.inventory, &full_cfg);
    if full.is_noop() {
        return Ok(Outcome {
            plan: full,
            env: Vec::new(),
        });
    }
    let mut env = effective_env(&view, &full, &ctx.config.env);
    let mut notes = Vec::new();
    env.retain(|(k, v)| {
        let ok = !v.contains(['\n', '\0']);
        if !ok {
            notes.push(format!("{k} not written: its value holds a newline"));
        }
        ok
    });
    let root_path = config
        .get("root")
        .and_then(|r| r.get("path"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| StageError::NoRoot {
            path: config_path.clone(),
        })?;
    let rootfs = match stage {
        Stage::Prestart if state.pid > 0 => PathBuf::from(format!("/proc/{}/root", state.pid)),
        _ => state.bundle.join(root_path),
    };
    let root = Root::open(&rootfs)?;
    let mut env_file = String::new();
    let mut profile = String::from("# Written by gpuarch-hook at container start.\n");
    for (k, v) in &env {
        env_file.push_str(&format!("{k}={v}\n"));
        profile.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    root.write_file(Path::new(ENV_FILE), env_file.as_bytes(), 0o644)?;
    root.write_file(Path::new(PROFILE_FILE), profile.as_bytes(), 0o644)?;
    let mut plan = full;
    plan.notes.extend(notes);
    plan.notes.push(format!(
        "wrote /{ENV_FILE} and /{PROFILE_FILE} inside the container ({} variables)",
        env.len()
    ));
    Ok(Outcome { plan, env })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::ctx;
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
        assert_eq!(out.env.len(), 9);
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
