//! The parts of `/etc/gpuarch/config.yaml` that planning obeys. The file is
//! shared by the daemon and the hook; sections for them are added by the
//! issues that build them. Unknown keys are errors, so a typo never passes as
//! a default.
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
//! log:                       # the hook's and the shim's lines (never the container's stdio)
//!   to: auto                 # default: a terminal, else the journal, else /dev/log, else `file`
//!   level: info              # default: decisions and warnings; debug adds "no GPU requested"
//!   file: /run/gpuarch/gpuarch.log         # default: the last resort
//!   max_bytes: 1048576                     # default: 1 MiB, then one rotation to `file`.1
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::env::EnvVar;

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
}

/// What gpuarchd publishes for schedulers beyond D-Bus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportConfig {
    /// Keep Node Feature Discovery's local-source file (`nfd_file`) with
    /// the node's `gpuarch.io/` labels, rewritten on a real change. Default
    /// false.
    pub nfd: bool,
    /// Default [`DEFAULT_NFD_FILE`]; its directory must exist (NFD's).
    pub nfd_file: PathBuf,
}

/// Default of `export.nfd_file`: where NFD's local source reads.
pub const DEFAULT_NFD_FILE: &str = "/etc/kubernetes/node-feature-discovery/features.d/gpuarch";

impl Default for ExportConfig {
    fn default() -> Self {
        Self {
            nfd: false,
            nfd_file: PathBuf::from(DEFAULT_NFD_FILE),
        }
    }
}

/// Per-architecture JIT caches: a read-write directory per scope and
/// target set, mounted into each GPU container with torch's, Triton's,
/// TorchInductor's, FlashInfer's and the driver's cache variables pointing
/// into it (see `gpuarch_core::jit`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JitCacheConfig {
    /// Give containers a cache. Default false.
    pub enable: bool,
    /// Where the caches are: `<dir>/<scope>/<targets>/`. Default
    /// [`DEFAULT_JIT_DIR`].
    pub dir: PathBuf,
    /// Which containers share a cache. Default `image`.
    pub scope: JitScope,
    /// Size above which gpuarchd removes the least recently started caches
    /// that no container has mounted. Default 20 GiB.
    #[serde(deserialize_with = "max_bytes")]
    pub max_bytes: u64,
}

/// Default of `jit_cache.dir`.
pub const DEFAULT_JIT_DIR: &str = "/var/cache/gpuarch/jit";

impl Default for JitCacheConfig {
    fn default() -> Self {
        Self {
            enable: false,
            dir: PathBuf::from(DEFAULT_JIT_DIR),
            scope: JitScope::Image,
            max_bytes: 20 << 30,
        }
    }
}

/// Which containers share a JIT cache. Whatever is in a cache runs in every
/// container given it, so a scope is a trust boundary; every scope is also
/// split by the container's (host) uid, so a cache is only ever written by
/// one user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JitScope {
    /// Containers of one uid running one image (as the runtime names it:
    /// containerd's CRI and CRI-O do; Docker and podman do not, and their
    /// containers get no cache under this scope), and in one Kubernetes
    /// namespace where the engine names it (containerd's
    /// `io.kubernetes.cri.sandbox-namespace`): two tenants running one
    /// image as one uid never share.
    #[default]
    Image,
    /// Containers of one uid: for nodes where the uid is the tenant.
    Uid,
    /// Containers of one uid in one Kubernetes namespace, as the engine
    /// names it (containerd's `io.kubernetes.cri.sandbox-namespace`; a
    /// pod's own `io.kubernetes.pod.namespace` is a claim, not taken).
    Namespace,
    /// Every container of one uid: for trusted single-tenant nodes.
    Shared,
}

impl std::fmt::Display for JitScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Image => "image",
            Self::Uid => "uid",
            Self::Namespace => "namespace",
            Self::Shared => "shared",
        })
    }
}

/// Where `gpuarch-hook` and `gpuarch-runtime` put their lines. Never the
/// process's stderr unless asked, or a terminal: run by an engine, that
/// stderr is the container's own (the shim's on `create`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Default `auto`. `GPUARCH_LOG` (a target, a level, or both:
    /// `stderr,debug`) overrides it and `level`.
    pub to: LogTarget,
    pub level: LogLevel,
    /// The file of `to: file`, and of `auto` on a host with neither a
    /// journal nor `/dev/log`. Its directory is not created: without it
    /// the lines are dropped. Default [`DEFAULT_LOG_FILE`].
    pub file: PathBuf,
    /// Past this size the file is renamed to `<file>.1` (replacing the old
    /// one) and a new one started. Default 1 MiB; 4096 to 1 GiB.
    #[serde(deserialize_with = "log_max_bytes")]
    pub max_bytes: u64,
}

/// Where the hook and the shim log when nothing better is there.
pub const DEFAULT_LOG_FILE: &str = "/run/gpuarch/gpuarch.log";

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            to: LogTarget::Auto,
            level: LogLevel::Info,
            file: PathBuf::from(DEFAULT_LOG_FILE),
            max_bytes: 1 << 20,
        }
    }
}

fn log_max_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "max_bytes", 4096..=(1 << 30))
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogTarget {
    /// stderr when it is a terminal, else the journal, else syslog's
    /// `/dev/log`, else `file`.
    #[default]
    Auto,
    Journal,
    Syslog,
    File,
    Stderr,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
}

impl std::str::FromStr for LogTarget {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "auto" => Self::Auto,
            "journal" => Self::Journal,
            "syslog" => Self::Syslog,
            "file" => Self::File,
            "stderr" => Self::Stderr,
            _ => return Err(()),
        })
    }
}

impl std::str::FromStr for LogLevel {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "error" => Self::Error,
            "warn" => Self::Warn,
            "info" => Self::Info,
            "debug" => Self::Debug,
            _ => return Err(()),
        })
    }
}

/// What gpuarchd does on its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Seconds between inventory refreshes from NVML. Default 60; 1 to
    /// 86400. After a failed refresh the daemon retries sooner (1 s, 2 s,
    /// 4 s, ... up to this interval).
    #[serde(deserialize_with = "refresh_interval_s")]
    pub refresh_interval_s: u64,
    /// Budget of one NVML read, in milliseconds; past it the refresh counts
    /// as failed and the inventory is marked stale. Default 10000; 1 to
    /// 600000.
    #[serde(deserialize_with = "nvml_timeout_ms")]
    pub nvml_timeout_ms: u64,
    /// The inventory snapshot: where gpuarchd writes it (unless started
    /// with `--snapshot`, read at start) and where the hook, the shim and
    /// `gpuarchctl --offline` read it (unless `GPUARCH_INVENTORY` names
    /// another). A config key, because the shim runs in the environment of
    /// whatever started it (the system containerd under Docker), not one
    /// the admin set. Default [`DEFAULT_SNAPSHOT`].
    pub snapshot: PathBuf,
}

/// Where the inventory snapshot is by default.
pub const DEFAULT_SNAPSHOT: &str = "/run/gpuarch/inventory.json";

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            refresh_interval_s: 60,
            nvml_timeout_ms: 10_000,
            snapshot: PathBuf::from(DEFAULT_SNAPSHOT),
        }
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

fn refresh_interval_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "refresh_interval_s", 1..=86_400)
}

fn nvml_timeout_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "nvml_timeout_ms", 1..=600_000)
}

/// gpuarchd as an NRI plugin of containerd or CRI-O: every container a
/// Kubernetes pod creates gets its Plan without a runtime handler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NriConfig {
    /// Register with the runtime's NRI socket. Default false.
    pub enable: bool,
    /// The runtime's NRI socket. Default [`DEFAULT_NRI_SOCKET`].
    pub socket: PathBuf,
    /// Where gpuarch stands among the runtime's plugins, which it calls in
    /// ascending order: two digits, `00` to `99`. Default `"50"`.
    #[serde(deserialize_with = "nri_index")]
    pub index: String,
    /// Pods of these runtime handlers are left to `gpuarch-runtime`, which
    /// also reads the image: a pod gets one Plan, not two. Default
    /// `["gpuarch"]`, the handler `gpuarchctl engine containerd` adds.
    pub skip_handlers: Vec<String>,
}

/// Default of `nri.socket`: where containerd and CRI-O listen.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";

impl Default for NriConfig {
    fn default() -> Self {
        Self {
            enable: false,
            socket: PathBuf::from(DEFAULT_NRI_SOCKET),
            index: "50".to_owned(),
            skip_handlers: vec!["gpuarch".to_owned()],
        }
    }
}

fn nri_index<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    // A YAML `index: 50` is a number; `"05"` keeps its zero.
    let v = serde_yaml::Value::deserialize(d)?;
    let s = match v {
        serde_yaml::Value::String(s) => s,
        serde_yaml::Value::Number(n) => n.to_string(),
        _ => {
            return Err(serde::de::Error::custom(
                "nri.index must be two digits, 00 to 99",
            ));
        }
    };
    let s = if s.len() == 1 { format!("0{s}") } else { s };
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s)
    } else {
        Err(serde::de::Error::custom(format!(
            "nri.index {s:?} must be two digits, 00 to 99"
        )))
    }
}

/// Limits of one `gpuarch-hook` or `gpuarch-runtime` invocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HookConfig {
    /// Wall-clock budget for planning one container, in milliseconds. Past
    /// it the container starts unchanged (or, with `strict`, fails). Default
    /// 5000; 1 to 60000.
    #[serde(deserialize_with = "timeout_ms")]
    pub timeout_ms: u64,
    /// Where the consumers read from each image are kept, by image. Used
    /// only when the directory exists (gpuarch's tmpfiles.d makes it, mode
    /// 0700); the hook never creates it. Default `/run/gpuarch/images`.
    pub image_cache: PathBuf,
    /// Where each GPU container's Plan is kept for `gpuarchctl why`
    /// ([`crate::record`]). Used only when the directory exists
    /// (tmpfiles.d makes it, mode 0700). Default `/run/gpuarch/containers`.
    pub record_dir: PathBuf,
}

/// [`HookConfig::image_cache`]'s default.
pub const DEFAULT_IMAGE_CACHE: &str = "/run/gpuarch/images";
/// [`HookConfig::record_dir`]'s default.
pub const DEFAULT_RECORD_DIR: &str = "/run/gpuarch/containers";

impl Default for HookConfig {
    fn default() -> Self {
        Self {
            timeout_ms: 5000,
            image_cache: PathBuf::from(DEFAULT_IMAGE_CACHE),
            record_dir: PathBuf::from(DEFAULT_RECORD_DIR),
        }
    }
}

fn timeout_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "timeout_ms", 1..=60_000)
}

/// What `gpuarch-runtime` runs, and what it adds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Absolute path of the runtime. Default: the first of `runc`, `crun`
    /// found on PATH (never `gpuarch-runtime` itself). It may be another
    /// shim, such as `nvidia-container-runtime`.
    pub path: Option<PathBuf>,
    /// In each container given a Plan, also write `/run/gpuarch/env` and
    /// `/etc/profile.d/gpuarch.sh`: `docker exec` and `kubectl exec` start
    /// processes with the env the engine stored, not the bundle's, so only
    /// these files carry the Plan to them. The shim writes them into the
    /// rootfs before the runtime starts; where a mount in the config would
    /// cover them, it adds gpuarch-hook's `createContainer` stage instead
    /// (one more process start). Default false: it writes into the
    /// container's own filesystem, and costs each GPU container's start
    /// (docs/BENCHMARKS.md).
    pub env_files: bool,
}

/// The kernel cache: where packages come from, where builds are kept, and
/// where the hook finds what to mount.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KernelsConfig {
    /// Directory holding one directory per package, each with a
    /// `manifest.json` (written by gpuarchd). Default
    /// `/var/lib/gpuarch/kernels`; a missing directory means no kernel mounts.
    pub mount_root: PathBuf,
    /// Directories searched for kernel packages (`<dir>/<name>/kernel.yaml`).
    /// Default `/usr/share/gpuarch/kernels.d`, `/etc/gpuarch/kernels.d`; a
    /// package in a later directory replaces one of the same name.
    pub package_dirs: Vec<PathBuf>,
    /// The content-addressed store. Default `/var/cache/gpuarch`.
    pub cache_dir: PathBuf,
    /// Size above which least recently used builds are evicted (pinned and
    /// mounted ones never are). Default 10 GiB.
    #[serde(deserialize_with = "max_bytes")]
    pub max_bytes: u64,
    /// Builds run at once. Default 2; 1 to 64.
    #[serde(deserialize_with = "workers")]
    pub workers: u64,
    /// Build every package for the host's architectures when gpuarchd starts
    /// and when a package changes. Default true.
    pub prewarm: bool,
    /// Wall-clock limit of one build, in seconds. Default 600; 1 to 86400.
    #[serde(deserialize_with = "build_timeout_s")]
    pub build_timeout_s: u64,
    /// Directories searched first for NVRTC (`libnvrtc.so.13` or `.12`), the CUDA
    /// headers and build tools: a CUDA install (`/usr/local/cuda`) or the
    /// `nvidia/` directory of NVIDIA's Python wheels. After them come the
    /// system library path, `/usr/local/cuda` and the wheels in Python's
    /// site-packages. Default: none.
    pub cuda_dirs: Vec<PathBuf>,
    /// Where the hook leaves a request for a build it found missing, for
    /// gpuarchd to build. Default `/run/gpuarch/kernel-requests`.
    pub spool_dir: PathBuf,
    /// Where the hook lays out each container's view of its packages:
    /// their `manifest.json` and hard links of the builds' files, so that
    /// all of them are one mount. Default (null): `<cache_dir>/views`. It must be
    /// on the store's filesystem for hard links; elsewhere each build is
    /// bound on its own, one mount more per build (see [`Self::view_dir`]).
    pub view_dir: Option<PathBuf>,
    /// A registry that shares builds between nodes. Default (null): none.
    pub remote: Option<RemoteConfig>,
}

/// `kernels.remote`: an OCI registry repository holding builds, one
/// artifact per store key (its tag). On a miss gpuarchd pulls before it
/// builds; with `push`, what it builds is pushed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `host[:port]/path`, no tag or digest: `registry.example:5000/gpuarch/kernels`.
    pub repository: String,
    /// Push each build made here. Default false.
    #[serde(default)]
    pub push: bool,
    /// A JSON file `{"username": ..., "password": ...}`, root's and readable
    /// by no one else. Default: anonymous.
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// Plain HTTP instead of TLS. Only for a registry on this host's
    /// loopback; refused for any other host. Default false.
    #[serde(default)]
    pub plain_http: bool,
    /// PEM file of CA certificates to trust besides the system's. Default: none.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Budget of one entry's pull, in milliseconds; past it the build runs
    /// here. Default 20000; 100 to 3600000.
    #[serde(
        default = "default_pull_timeout_ms",
        deserialize_with = "pull_timeout_ms"
    )]
    pub pull_timeout_ms: u64,
}

fn default_pull_timeout_ms() -> u64 {
    20_000
}

fn pull_timeout_ms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "pull_timeout_ms", 100..=3_600_000)
}

impl RemoteConfig {
    /// Why `repository` is not a repository reference gpuarch can use, if
    /// it is not: a registry host, then a lowercase path, and no tag or digest
    /// (the tag is each entry's key).
    pub fn check(&self) -> Result<(), String> {
        let r = &self.repository;
        let (host, path) = r
            .split_once('/')
            .ok_or_else(|| format!("kernels.remote.repository {r:?} needs a registry host and a path (host[:port]/path)"))?;
        if host.is_empty() || !(host.contains('.') || host.contains(':') || host == "localhost") {
            return Err(format!(
                "kernels.remote.repository {r:?}: {host:?} is not a registry host (it needs a '.', a port, or localhost)"
            ));
        }
        let path_ok = !path.is_empty()
            && path.split('/').all(|c| {
                !c.is_empty()
                    && c.bytes().all(|b| {
                        b.is_ascii_lowercase()
                            || b.is_ascii_digit()
                            || matches!(b, b'.' | b'_' | b'-')
                    })
                    && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            });
        if !path_ok || r.contains('@') {
            return Err(format!(
                "kernels.remote.repository {r:?}: the path must be lowercase components (a-z, 0-9, '.', '_', '-') with no tag or digest"
            ));
        }
        if self.plain_http && !self.is_loopback() {
            return Err(format!(
                "kernels.remote.plain_http is only for a registry on loopback (localhost, 127.0.0.1, [::1]), not {host}"
            ));
        }
        Ok(())
    }

    /// The registry part: `host[:port]`.
    pub fn registry(&self) -> &str {
        self.repository
            .split_once('/')
            .map_or(&self.repository, |(h, _)| h)
    }

    /// The path in the registry: `gpuarch/kernels`.
    pub fn path(&self) -> &str {
        self.repository.split_once('/').map_or("", |(_, p)| p)
    }

    /// The registry's host and port: the port written, else 80 for
    /// `plain_http` and 443 for TLS.
    pub fn host_and_port(&self) -> (&str, u16) {
        let reg = self.registry();
        match reg.rsplit_once(':') {
            Some((h, port)) if !h.ends_with(':') => match port.parse() {
                Ok(p) => (h, p),
                Err(_) => (reg, self.default_port()),
            },
            _ => (reg, self.default_port()),
        }
    }

    fn default_port(&self) -> u16 {
        if self.plain_http { 80 } else { 443 }
    }

    fn is_loopback(&self) -> bool {
        let (host, _) = self.host_and_port();
        host == "localhost"
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|a| a.is_loopback())
    }
}

impl Default for KernelsConfig {
    fn default() -> Self {
        Self {
            mount_root: PathBuf::from(DEFAULT_MOUNT_ROOT),
            package_dirs: vec![
                PathBuf::from("/usr/share/gpuarch/kernels.d"),
                PathBuf::from("/etc/gpuarch/kernels.d"),
            ],
            cache_dir: PathBuf::from("/var/cache/gpuarch"),
            max_bytes: 10 << 30,
            workers: 2,
            prewarm: true,
            build_timeout_s: 600,
            cuda_dirs: Vec::new(),
            spool_dir: PathBuf::from("/run/gpuarch/kernel-requests"),
            view_dir: None,
            remote: None,
        }
    }
}

impl KernelsConfig {
    /// Where views are laid out: `view_dir`, else `<cache_dir>/views`.
    pub fn view_dir(&self) -> PathBuf {
        self.view_dir
            .clone()
            .unwrap_or_else(|| self.cache_dir.join("views"))
    }

    /// Every path of the section, with its key, for the absolute-path check.
    fn paths(&self) -> Vec<(String, &PathBuf)> {
        let mut v = vec![
            ("kernels.mount_root".to_owned(), &self.mount_root),
            ("kernels.cache_dir".to_owned(), &self.cache_dir),
            ("kernels.spool_dir".to_owned(), &self.spool_dir),
        ];
        v.extend(
            self.view_dir
                .iter()
                .map(|p| ("kernels.view_dir".to_owned(), p)),
        );
        v.extend(
            self.package_dirs
                .iter()
                .map(|p| ("kernels.package_dirs".to_owned(), p)),
        );
        v.extend(
            self.cuda_dirs
                .iter()
                .map(|p| ("kernels.cuda_dirs".to_owned(), p)),
        );
        if let Some(r) = &self.remote {
            v.extend(
                r.credentials
                    .iter()
                    .map(|p| ("kernels.remote.credentials".to_owned(), p)),
            );
            v.extend(
                r.ca_file
                    .iter()
                    .map(|p| ("kernels.remote.ca_file".to_owned(), p)),
            );
        }
        v
    }
}

fn max_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "max_bytes", 1 << 20..=u64::MAX)
}

fn workers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "workers", 1..=64)
}

fn build_timeout_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "build_timeout_s", 1..=86_400)
}

/// A kernel package name (or a file name inside a package or build): one
/// plain path component, safe on the host and inside a container.
pub fn valid_package_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 128
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

/// Default of `kernels.mount_root`.
pub const DEFAULT_MOUNT_ROOT: &str = "/var/lib/gpuarch/kernels";

/// How the Plan's variables are injected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvConfig {
    /// Replace values the container already sets. Default `false`.
    #[serde(rename = "override")]
    pub override_existing: bool,
    /// Variables never to inject. Default: none.
    pub disable: BTreeSet<EnvVar>,
    /// Opt-in variables to inject ([`EnvVar::opt_in`]:
    /// `ACCELERATE_MIXED_PRECISION`). Default: none.
    pub enable: BTreeSet<EnvVar>,
    /// The CUDA toolkit to build arch lists for when the container says
    /// none (no `CUDA_VERSION`, no `NVIDIA_REQUIRE_CUDA`, no annotation
    /// `io.gpuarch.cuda-version`). Default: none, and then each GPU's exact
    /// capability (see [`crate::toolkit`]).
    pub cuda_version: Option<crate::arch::CudaVersion>,
}

/// A config that could not be read, with where in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", location.map(|(l, c)| format!("line {l}, column {c}: ")).unwrap_or_default())]
pub struct ConfigError {
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
    pub reason: String,
}

impl Config {
    /// Parse the YAML text of a config file. An empty file (or one of only
    /// comments) is the default config.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let err = |e: serde_yaml::Error| ConfigError {
            location: e.location().map(|l| (l.line(), l.column())),
            reason: e.to_string(),
        };
        let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(err)?;
        if value.is_null() {
            return Ok(Self::default());
        }
        let cfg: Self = serde_yaml::from_str(text).map_err(err)?;
        if let Some(p) = &cfg.runtime.path
            && !p.is_absolute()
        {
            return Err(ConfigError {
                location: None,
                reason: format!("runtime.path must be absolute, not {}", p.display()),
            });
        }
        if !cfg.log.file.is_absolute() {
            return Err(ConfigError {
                location: None,
                reason: format!("log.file must be absolute, not {}", cfg.log.file.display()),
            });
        }
        if let Some(v) = cfg.env.enable.iter().find(|v| !v.opt_in()) {
            let opt_in: Vec<&str> = EnvVar::ALL
                .iter()
                .filter(|v| v.opt_in())
                .map(|v| v.name())
                .collect();
            return Err(ConfigError {
                location: None,
                reason: format!(
                    "env.enable: {v} is set by default (env.enable is for the opt-in ones: {})",
                    opt_in.join(", ")
                ),
            });
        }
        if let Some(r) = &cfg.kernels.remote {
            r.check().map_err(|reason| ConfigError {
                location: None,
                reason,
            })?;
        }
        if !cfg.export.nfd_file.is_absolute()
            || cfg
                .export
                .nfd_file
                .file_name()
                .is_none_or(|n| n.to_string_lossy().starts_with('.'))
        {
            return Err(ConfigError {
                location: None,
                reason: format!(
                    "export.nfd_file must be an absolute path to a file NFD reads (not a dot-file), not {}",
                    cfg.export.nfd_file.display()
                ),
            });
        }
        if !cfg.jit_cache.dir.is_absolute() || cfg.jit_cache.dir.parent().is_none() {
            return Err(ConfigError {
                location: None,
                reason: format!(
                    "jit_cache.dir must be an absolute path below /, not {}",
                    cfg.jit_cache.dir.display()
                ),
            });
        }
        if let Some((key, p)) = cfg
            .kernels
            .paths()
            .into_iter()
            .find(|(_, p)| !p.is_absolute())
        {
            return Err(ConfigError {
                location: None,
                reason: format!("{key} must be absolute, not {}", p.display()),
            });
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_a_full_file() {
        assert_eq!(Config::from_yaml("").unwrap(), Config::default());
        assert_eq!(Config::from_yaml("# nothing\n").unwrap(), Config::default());
        let c =
            Config::from_yaml("strict: true\nenv:\n  override: true\n  disable: [GPUARCH_FP8]\n")
                .unwrap();
        assert!(c.strict && c.env.override_existing);
        assert_eq!(c.env.disable, [EnvVar::Fp8].into());
        let c = Config::from_yaml(
            "hook: {timeout_ms: 250}\nruntime: {path: /usr/bin/crun}\nkernels: {mount_root: /srv/k}\n",
        )
        .unwrap();
        assert_eq!(c.hook.timeout_ms, 250);
        assert_eq!(
            c.runtime.path.as_deref(),
            Some(std::path::Path::new("/usr/bin/crun"))
        );
        assert_eq!(c.kernels.mount_root, PathBuf::from("/srv/k"));
        let c =
            Config::from_yaml("daemon: {refresh_interval_s: 5, nvml_timeout_ms: 250}\n").unwrap();
        assert_eq!(c.daemon.refresh_interval_s, 5);
        assert_eq!(c.daemon.nvml_timeout_ms, 250);
        assert_eq!(Config::default().daemon.refresh_interval_s, 60);
        let c = Config::from_yaml(
            "kernels: {workers: 4, prewarm: false, max_bytes: 1048576, cuda_dirs: [/opt/cuda]}\n",
        )
        .unwrap();
        assert_eq!((c.kernels.workers, c.kernels.prewarm), (4, false));
        assert_eq!(c.kernels.max_bytes, 1 << 20);
        assert_eq!(c.kernels.cuda_dirs, [PathBuf::from("/opt/cuda")]);
        let e = Config::from_yaml("kernels: {workers: 0}\n").unwrap_err();
        assert!(e.to_string().contains("workers 0 is out of range"), "{e}");
        let e = Config::from_yaml("kernels: {package_dirs: [pkgs]}\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("kernels.package_dirs must be absolute"),
            "{e}"
        );
    }

    #[test]
    fn jit_caches_are_off_until_enabled_and_scopes_are_named() {
        let c = Config::default().jit_cache;
        assert!(!c.enable);
        assert_eq!(
            (c.scope, c.dir.to_str()),
            (JitScope::Image, Some(DEFAULT_JIT_DIR))
        );
        let c = Config::from_yaml("jit_cache: {enable: true, scope: namespace, dir: /srv/jit}\n")
            .unwrap()
            .jit_cache;
        assert!(c.enable);
        assert_eq!(
            (c.scope, c.dir),
            (JitScope::Namespace, PathBuf::from("/srv/jit"))
        );
        let e = Config::from_yaml("jit_cache:\n  scope: everyone\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");
        assert!(e.reason.contains("everyone"), "{e}");
        for dir in ["jit", "/"] {
            let e = Config::from_yaml(&format!("jit_cache: {{dir: {dir}}}\n")).unwrap_err();
            assert!(e.reason.contains("jit_cache.dir must be"), "{e}");
        }
    }

    #[test]
    fn a_remote_names_a_repository_and_plain_http_stays_on_loopback() {
        assert_eq!(Config::default().kernels.remote, None);
        let c = Config::from_yaml("kernels:\n  remote:\n    repository: 127.0.0.1:5000/gpuarch/kernels\n    plain_http: true\n")
            .unwrap();
        let r = c.kernels.remote.unwrap();
        assert_eq!(
            (r.registry(), r.push, r.pull_timeout_ms),
            ("127.0.0.1:5000", false, 20_000)
        );
        for (repo, plain, why) in [
            ("gpuarch/kernels", false, "not a registry host"),
            (
                "registry.example",
                false,
                "needs a registry host and a path",
            ),
            ("registry.example/Kernels", false, "lowercase"),
            ("registry.example/k:tag", false, "lowercase"),
            ("registry.example/k@sha256:00", false, "no tag or digest"),
            (
                "registry.example:5000/k",
                true,
                "only for a registry on loopback",
            ),
            (
                "127.0.0.1.evil.example/k",
                true,
                "only for a registry on loopback",
            ),
        ] {
            let y = format!(
                "kernels:\n  remote:\n    repository: \"{repo}\"\n    plain_http: {plain}\n"
            );
            let e = Config::from_yaml(&y).unwrap_err();
            assert!(e.reason.contains(why), "{repo}: {e}");
        }
        for ok in ["localhost:5000/k", "[::1]:5000/k"] {
            let y =
                format!("kernels:\n  remote:\n    repository: \"{ok}\"\n    plain_http: true\n");
            assert!(Config::from_yaml(&y).is_ok(), "{ok}");
        }
        let e = Config::from_yaml(
            "kernels:\n  remote:\n    repository: r.example/k\n    pull_timeout_ms: 5\n",
        )
        .unwrap_err();
        assert!(e.reason.contains("pull_timeout_ms"), "{e}");
    }

    #[test]
    fn the_nfd_export_is_off_until_enabled_and_names_a_file() {
        let c = Config::default().export;
        assert!(!c.nfd);
        assert_eq!(c.nfd_file, PathBuf::from(DEFAULT_NFD_FILE));
        let c = Config::from_yaml("export: {nfd: true, nfd_file: /srv/features.d/gpus}\n")
            .unwrap()
            .export;
        assert!(c.nfd);
        assert_eq!(c.nfd_file, PathBuf::from("/srv/features.d/gpus"));
        for f in ["gpuarch", "/srv/features.d/.gpuarch", "/"] {
            let e = Config::from_yaml(&format!("export: {{nfd_file: \"{f}\"}}\n")).unwrap_err();
            assert!(e.reason.contains("export.nfd_file must be"), "{f}: {e}");
        }
        let e = Config::from_yaml("export:\n  nfd: yes please\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");
    }

    #[test]
    fn only_opt_in_variables_may_be_enabled() {
        let c = Config::from_yaml("env:\n  enable: [ACCELERATE_MIXED_PRECISION]\n").unwrap();
        assert_eq!(c.env.enable, [EnvVar::AccelerateMixedPrecision].into());
        let e = Config::from_yaml("env:\n  enable: [GPUARCH_DTYPE]\n").unwrap_err();
        assert!(
            e.reason.contains("GPUARCH_DTYPE is set by default")
                && e.reason.contains("ACCELERATE_MIXED_PRECISION"),
            "{e}"
        );
    }

    #[test]
    fn the_default_toolkit_is_a_cuda_version_quoted_or_not() {
        use crate::arch::CudaVersion;
        for text in [
            "env:\n  cuda_version: \"12.8\"\n",
            "env:\n  cuda_version: 12.8\n",
        ] {
            let c = Config::from_yaml(text).unwrap();
            assert_eq!(c.env.cuda_version, Some(CudaVersion::new(12, 8)), "{text}");
        }
        let e = Config::from_yaml("env:\n  cuda_version: twelve\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");
        assert!(e.reason.contains("twelve"), "{e}");
    }

    #[test]
    fn mistakes_name_the_line_and_the_key() {
        let e = Config::from_yaml("strict: false\nenv:\n  overide: true\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(3), "{e}");
        assert!(e.to_string().contains("overide"), "{e}");

        let e = Config::from_yaml("env:\n  disable: [GPUARCH_FP9]\n").unwrap_err();
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");
        assert!(
            e.to_string().contains("unknown variable 'GPUARCH_FP9'"),
            "{e}"
        );

        let e = Config::from_yaml("strict: [\n").unwrap_err();
        assert!(e.location.is_some(), "{e}");

        let e = Config::from_yaml("hook:\n  timeout_ms: 0\n").unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");

        let e = Config::from_yaml("runtime:\n  path: runc\n").unwrap_err();
        assert!(
            e.to_string().contains("runtime.path must be absolute"),
            "{e}"
        );

        let e = Config::from_yaml("daemon:\n  refresh_interval_s: 0\n").unwrap_err();
        assert!(
            e.to_string()
                .contains("refresh_interval_s 0 is out of range"),
            "{e}"
        );
        assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");

        let e = Config::from_yaml("strict: maybe\n").unwrap_err();
        assert!(e.to_string().starts_with("line 1"), "{e}");
    }

    #[test]
    fn nri_index_is_two_digits_however_yaml_spells_it() {
        for (yaml, want) in [
            ("50", "50"),
            ("\"05\"", "05"),
            ("7", "07"),
            ("\"99\"", "99"),
        ] {
            let c = Config::from_yaml(&format!("nri:\n  index: {yaml}\n")).unwrap();
            assert_eq!(c.nri.index, want, "{yaml}");
        }
        for bad in ["100", "\"5a\"", "-1", "[1]", "\"\""] {
            let e = Config::from_yaml(&format!("nri:\n  index: {bad}\n")).unwrap_err();
            assert!(e.to_string().contains("two digits"), "{bad}: {e}");
        }
        assert_eq!(
            Config::default().nri.socket,
            PathBuf::from(DEFAULT_NRI_SOCKET)
        );
        assert!(!Config::default().nri.enable);
    }
}
