//! What one invocation knows besides the container ([`Context`]), and how
//! it is read: gpuarch's config, the inventory (the snapshot, else NVML
//! under the budget), bounded reads of a config or state.

use std::path::PathBuf;

use gpuarch_core::config::Config;
use gpuarch_core::oci;
use gpuarch_core::snapshot::Snapshot;
use serde_json::Value;

/// What one invocation knows besides the container: the host's GPUs, the
/// config, and how to call the hook back inside the container.
#[derive(Debug, Clone)]
pub struct Context {
    pub inventory: Snapshot,
    pub config: Config,
    /// The `gpuarch-hook` binary that the `createContainer` entry runs; with
    /// `None` no entry is added.
    pub hook_path: Option<PathBuf>,
    /// `NAME=value` settings of this process (`GPUARCH_CONFIG`,
    /// `GPUARCH_INVENTORY`, ...) handed to that entry. Never the container's.
    pub hook_env: Vec<String>,
    /// Add the `createContainer` entry to every container given a Plan, so
    /// `/run/gpuarch/env` and `/etc/profile.d/gpuarch.sh` exist for the
    /// sessions an engine starts without the config's env (`docker exec`,
    /// `kubectl exec`): the shim's `runtime.env_files`.
    pub env_files: bool,
}

/// Variables of this process that the `createContainer` entry inherits:
/// where to find the config and inventory. Nothing else, and never a
/// loader variable.
pub const HOOK_ENV_VARS: [&str; 3] = ["GPUARCH_CONFIG", "GPUARCH_INVENTORY", "GPUARCH_NVML_LIB"];

/// PATH of everything the hook runs, whatever PATH it was started with.
pub const SAFE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What `strict: true` refuses a start over: the Plan's blocking
/// reasons, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl Context {
    /// With `strict: true`, the Plan's blocking reasons as the error that
    /// refuses the start; without it they are notes and the container
    /// starts.
    pub fn refuse_if_strict(&self, plan: &gpuarch_core::plan::Plan) -> Result<(), Refusal> {
        if self.config.strict && !plan.blocking.is_empty() {
            return Err(Refusal(plan.blocking.join("; ")));
        }
        Ok(())
    }

    pub fn new(inventory: Snapshot, config: Config, hook_path: Option<PathBuf>) -> Self {
        Self {
            inventory,
            config,
            hook_path,
            hook_env: Self::hook_env_from_process(),
            env_files: false,
        }
    }

    /// The hook entry's env from this process's environment.
    pub fn hook_env_from_process() -> Vec<String> {
        let mut env = vec![format!("PATH={SAFE_PATH}")];
        for k in HOOK_ENV_VARS {
            if let Some(v) = std::env::var_os(k).and_then(|v| v.into_string().ok()) {
                env.push(format!("{k}={v}"));
            }
        }
        env
    }
}

/// Why there is no context: no inventory could be had in time.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error(transparent)]
    Inventory(#[from] gpuarch_inventory::InventoryError),
    #[error("NVML: {0}")]
    Nvml(#[from] crate::nvml::NvmlError),
}

/// The inventory: gpuarchd's snapshot (`GPUARCH_INVENTORY`, else the
/// config's `daemon.snapshot`), read right here; else NVML, read by
/// gpuarchctl in a process of its own (crate::nvml) and given up on after
/// `hook.timeout_ms`. No D-Bus, no thread: a thread costs a container
/// start about 0.45 ms of CPU and as much wall time on a VM (its start and
/// the wake-up of the one that waits for it).
pub fn load_context(config: Config, hook_path: Option<PathBuf>) -> Result<Context, ContextError> {
    use gpuarch_inventory::GpuInventory;
    let inventory = match gpuarch_inventory::snapshot_source(None, &config.daemon.snapshot) {
        Some(path) => gpuarch_inventory::SnapshotFile::new(path).snapshot()?,
        None => crate::nvml::read(std::time::Duration::from_millis(config.hook.timeout_ms))?,
    };
    Ok(Context::new(inventory, config, hook_path))
}

/// A bounded read that failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("larger than {0} bytes")]
    TooLarge(u64),
}

/// Read all of `r`, refusing more than `limit` bytes without reading past
/// the bound.
pub fn read_at_most(r: impl std::io::Read, limit: u64) -> Result<Vec<u8>, ReadError> {
    read_into(r, limit, Vec::new())
}

/// [`read_at_most`] of a file, into a buffer sized once from its length:
/// one of megabytes, grown as it is read, costs more to copy than to use.
pub fn read_file_at_most(f: std::fs::File, limit: u64) -> Result<Vec<u8>, ReadError> {
    let size = f.metadata()?.len();
    let cap = usize::try_from(size.min(limit) + 1).unwrap_or(0);
    read_into(f, limit, Vec::with_capacity(cap))
}

fn read_into(r: impl std::io::Read, limit: u64, mut bytes: Vec<u8>) -> Result<Vec<u8>, ReadError> {
    use std::io::Read;
    r.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(limit));
    }
    Ok(bytes)
}

/// Read a bundle's `config.json` (bounded) into its bytes, its JSON value
/// and the file's metadata.
pub fn read_config_file(
    path: &std::path::Path,
) -> Result<(Vec<u8>, Value, std::fs::Metadata), oci::OciError> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let bytes = oci::read_bounded(file)?;
    let value = oci::parse_value(&bytes)?;
    Ok((bytes, value, meta))
}
