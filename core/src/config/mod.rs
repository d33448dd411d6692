//! `/etc/gpuarch/config.yaml`, the one file every gpuarch program reads:
//! gpuarchd, the hook, the shim and gpuarchctl. Unknown keys are errors, so
//! a typo never passes as a default.
//!
//! ```yaml
//! strict: false          # default: fail open (containers start unchanged on error)
//! env:
//!   override: false      # default: a variable the container sets is left alone
//!   disable: []          # default: inject every variable; e.g. [GPUARCH_FP8]
//!   enable: []           # opt-in variables: [ACCELERATE_MIXED_PRECISION]
//! hook:
//!   timeout_ms: 5000     # default: budget of one hook or shim invocation
//!   image_cache: /run/gpuarch/images  # default: each image's consumers, when the directory exists
//!   record_dir: /run/gpuarch/containers  # default: each GPU container's Plan, for `gpuarchctl why`
//! runtime:
//!   path: null           # default: the first of runc, crun on PATH
//!   env_files: false     # default: no files written into containers (for exec sessions)
//! kernels:
//!   mount_root: /var/lib/gpuarch/kernels   # default: what the hook mounts from
//!   package_dirs: [/usr/share/gpuarch/kernels.d, /etc/gpuarch/kernels.d]
//!   cache_dir: /var/cache/gpuarch          # default: the build store
//!   max_bytes: 10737418240                 # default: 10 GiB, then LRU eviction
//!   workers: 2                             # default: builds at once (1 to 64)
//!   prewarm: true                          # default: build for the host's GPUs
//!   build_timeout_s: 600                   # default: limit of one build
//!   cuda_dirs: []                          # default: NVRTC/headers searched elsewhere
//!   spool_dir: /run/gpuarch/kernel-requests
//!   view_dir: null      # default: <cache_dir>/views, on the store's filesystem
//!   remote: null        # default: no registry; else {repository: host/path, push,
//!                       #   credentials, plain_http (loopback only), ca_file, pull_timeout_ms}
//! daemon:
//!   refresh_interval_s: 60   # default: seconds between NVML reads (1 to 86400)
//!   nvml_timeout_ms: 10000   # default: budget of one NVML read (1 to 600000)
//!   snapshot: /run/gpuarch/inventory.json  # default: the inventory file
//! jit_cache:                 # per-arch JIT caches (off by default)
//!   enable: false
//!   dir: /var/cache/gpuarch/jit            # default: owned by gpuarchd, mode 0700
//!   scope: image             # image (uid + image) | uid | namespace | shared
//!   max_bytes: 21474836480   # default: 20 GiB, then LRU eviction of unused caches
//! export:
//!   nfd: false               # default: no Node Feature Discovery labels file
//!   nfd_file: /etc/kubernetes/node-feature-discovery/features.d/gpuarch
//! audit:                     # the image audit at container start (off by default)
//!   dir: null                # e.g. /var/cache/gpuarch/audits: kept audits and the hook's requests
//!   wait_ms: 0               # default: a new image's first start does not wait for its audit
//!   refuse: false            # default: a GPU that cannot run a binary is a note, not a refusal
//!   max_seconds: 300         # default: longest one audit runs (1 to 3600)
//! log:                       # the hook's and the shim's lines (never the container's stdio)
//!   to: auto                 # default: a terminal, else the journal, else /dev/log, else `file`
//!   level: info              # default: decisions and warnings; debug adds "no GPU requested"
//!   file: /run/gpuarch/gpuarch.log         # default: the last resort
//!   max_bytes: 1048576                     # default: 1 MiB, then one rotation to `file`.1
//! ```
//!
//! One file per section, each with its defaults and its own checks of what
//! the YAML parser cannot see (absolute paths, opt-in variables, a
//! registry reference); [`Config::from_yaml`] runs them all.

mod audit;
mod daemon;
mod env;
mod export;
mod hook;
mod jit_cache;
mod kernels;
mod log;
mod nri;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use audit::{AuditConfig, valid_key};
pub use daemon::{DEFAULT_SNAPSHOT, DaemonConfig};
pub use env::EnvConfig;
pub use export::{DEFAULT_NFD_FILE, ExportConfig};
pub use hook::{DEFAULT_IMAGE_CACHE, DEFAULT_RECORD_DIR, HookConfig, RuntimeConfig};
pub use jit_cache::{DEFAULT_JIT_DIR, JitCacheConfig, JitScope};
pub use kernels::{DEFAULT_MOUNT_ROOT, KernelsConfig, RemoteConfig, valid_package_name};
pub use log::{DEFAULT_LOG_FILE, LogConfig, LogLevel, LogTarget};
pub use nri::{
    DEFAULT_CRIO_CONFIG, DEFAULT_NRI_SOCKET, DEFAULT_STORAGE_CONF, DEFAULT_STORAGE_ROOT,
    DEFAULT_STORAGE_RUNROOT, NriConfig, STORAGE_DRIVERS,
};

/// The whole config file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Fail the container's start with the reason when planning fails,
    /// instead of starting it unchanged. Default `false`.
    pub strict: bool,
    pub env: EnvConfig,
    pub hook: HookConfig,
    pub runtime: RuntimeConfig,
    pub kernels: KernelsConfig,
    pub daemon: DaemonConfig,
    pub jit_cache: JitCacheConfig,
    pub nri: NriConfig,
    pub export: ExportConfig,
    pub log: LogConfig,
    pub audit: AuditConfig,
}

/// A config that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML, or not this schema (an unknown key, a wrong type, a value
    /// out of range), with where in the file when known (1-based line and
    /// column).
    #[error("{}{message}", location.map(|(l, c)| format!("line {l}, column {c}: ")).unwrap_or_default())]
    Syntax {
        location: Option<(usize, usize)>,
        message: String,
    },
    /// Well-formed, but a value gpuarch cannot use.
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// A value the schema accepts that gpuarch cannot use; it names its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("{key} must be absolute, not {}", path.display())]
    NotAbsolute { key: String, path: PathBuf },
    #[error("export.nfd_file must be an absolute path to a file NFD reads (not a dot-file), not {}", .0.display())]
    NfdFile(PathBuf),
    #[error("jit_cache.dir must be an absolute path below /, not {}", .0.display())]
    JitDir(PathBuf),
    #[error("env.enable: {var} is set by default (env.enable is for the opt-in ones: {opt_in})")]
    NotOptIn { var: String, opt_in: String },
    #[error("kernels.remote.repository {0:?} needs a registry host and a path (host[:port]/path)")]
    RepositoryNoPath(String),
    #[error(
        "kernels.remote.repository {repository:?}: {host:?} is not a registry host (it needs a '.', a port, or localhost)"
    )]
    RegistryHost { repository: String, host: String },
    #[error(
        "kernels.remote.repository {0:?}: the path must be lowercase components (a-z, 0-9, '.', '_', '-') with no tag or digest"
    )]
    RepositoryPath(String),
    #[error(
        "kernels.remote.plain_http is only for a registry on loopback (localhost, 127.0.0.1, [::1]), not {0}"
    )]
    PlainHttp(String),
}

impl ConfigError {
    /// The 1-based line and column in the file, when known.
    pub fn location(&self) -> Option<(usize, usize)> {
        match self {
            Self::Syntax { location, .. } => *location,
            Self::Invalid(_) => None,
        }
    }
}

impl Config {
    /// Parse the YAML text of a config file. An empty file (or one of only
    /// comments) is the default config.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let err = |e: serde_yaml::Error| {
            let location = e.location().map(|l| (l.line(), l.column()));
            let mut message = e.to_string();
            // serde_yaml puts the position in its message too; it is said
            // once, first.
            if let Some((l, c)) = location {
                message = message.replacen(&format!(" at line {l} column {c}"), "", 1);
            }
            ConfigError::Syntax { location, message }
        };
        // Parsed once: an empty document (or one of only comments) is
        // null, which is `None` here. The hook and the shim read this file
        // at every start; a parse to a `Value` first, to tell null apart,
        // cost as much again (`cargo bench -p gpuarch-core --bench config`).
        // A file that is not YAML is said to be so: on this path alone it
        // is parsed again, so that its syntax error is said rather than a
        // type error met before it.
        let cfg: Option<Self> = serde_yaml::from_str(text).map_err(|typed| {
            match serde_yaml::from_str::<serde_yaml::Value>(text) {
                Err(syntax) => err(syntax),
                Ok(_) => err(typed),
            }
        })?;
        let Some(cfg) = cfg else {
            return Ok(Self::default());
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Each section's own checks, in the file's order.
    fn validate(&self) -> Result<(), Invalid> {
        self.runtime.validate()?;
        self.log.validate()?;
        self.env.validate()?;
        self.kernels.validate()?;
        self.export.validate()?;
        self.audit.validate()?;
        self.jit_cache.validate()
    }
}

/// A number of a section, refused outside `range` with its key's name.
/// `path`, the value of `key`, must be absolute.
fn absolute(key: &str, path: &std::path::Path) -> Result<(), Invalid> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(Invalid::NotAbsolute {
            key: key.to_owned(),
            path: path.to_owned(),
        })
    }
}

fn in_range<'de, D: serde::Deserializer<'de>>(
    d: D,
    name: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!(
            "{name} {v} is out of range ({} to {})",
            range.start(),
            range.end()
        )))
    }
}

#[cfg(test)]
mod tests;
