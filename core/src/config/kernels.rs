//! `kernels`: the kernel cache: where packages come from, where builds are
//! kept, where the hook finds what to mount, and the registry builds are
//! shared through.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Invalid, in_range};

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
    /// The address space of one build's worker process (NVRTC runs in
    /// one, never in gpuarchd), in MiB; past it the build fails. Default
    /// 4096; 256 to 1048576.
    #[serde(deserialize_with = "build_memory_mib")]
    pub build_memory_mib: u64,
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
    pub fn check(&self) -> Result<(), Invalid> {
        let r = &self.repository;
        let (host, path) = r
            .split_once('/')
            .ok_or_else(|| Invalid::RepositoryNoPath(r.clone()))?;
        if host.is_empty() || !(host.contains('.') || host.contains(':') || host == "localhost") {
            return Err(Invalid::RegistryHost {
                repository: r.clone(),
                host: host.to_owned(),
            });
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
            return Err(Invalid::RepositoryPath(r.clone()));
        }
        if self.plain_http && !self.is_loopback() {
            return Err(Invalid::PlainHttp(host.to_owned()));
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
            build_memory_mib: 4096,
            cuda_dirs: Vec::new(),
            spool_dir: PathBuf::from("/run/gpuarch/kernel-requests"),
            view_dir: None,
            remote: None,
        }
    }
}

impl KernelsConfig {
    /// Where consumers' own libraries are imported and their trees laid
    /// out: `<cache_dir>/libraries`.
    pub fn libraries_dir(&self) -> PathBuf {
        self.cache_dir.join("libraries")
    }

    /// Where views are laid out: `view_dir`, else `<cache_dir>/views`.
    pub fn view_dir(&self) -> PathBuf {
        self.view_dir
            .clone()
            .unwrap_or_else(|| self.cache_dir.join("views"))
    }

    /// The registry reference is usable, and every path is absolute.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        if let Some(r) = &self.remote {
            r.check()?;
        }
        match self.paths().into_iter().find(|(_, p)| !p.is_absolute()) {
            Some((key, p)) => Err(Invalid::NotAbsolute {
                key,
                path: p.clone(),
            }),
            None => Ok(()),
        }
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

pub(super) fn max_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "max_bytes", 1 << 20..=u64::MAX)
}

fn workers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "workers", 1..=64)
}

fn build_timeout_s<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "build_timeout_s", 1..=86_400)
}

fn build_memory_mib<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    in_range(d, "build_memory_mib", 256..=1_048_576)
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
