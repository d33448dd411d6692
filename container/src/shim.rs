//! `gpuarch-runtime`: registered with an engine as its OCI runtime (Docker
//! `daemon.json` `runtimes`, containerd runtime options), it applies the
//! Plan to the bundle's `config.json` on `create` (and `run`), then execs the
//! real runtime with the arguments it was given. Every other subcommand goes
//! straight through; the exit code is always the runtime's.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpuarch_core::oci;
use gpuarch_core::plan::Plan;

use crate::context::{self, Context};
use crate::edit::{self, HookError};

/// Set in the real runtime's environment: a shim that finds it set was
/// started by itself (a `runtime.path` pointing back at the shim) and stops.
pub const ACTIVE_ENV: &str = "GPUARCH_RUNTIME_ACTIVE";

/// Runtimes tried on PATH, in order, when the config names none.
pub const DEFAULT_RUNTIMES: [&str; 2] = ["runc", "crun"];

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("no OCI runtime: none of {} found on PATH (set runtime.path in the config)", DEFAULT_RUNTIMES.join(", "))]
    NoRuntime,
    #[error("runtime.path {0} is not an executable file")]
    BadRuntime(PathBuf),
    #[error("runtime.path {0} is gpuarch-runtime itself")]
    IsSelf(PathBuf),
    /// The runtime runs as root: another user's, or a writable one, is
    /// never started.
    #[error("OCI runtime {runtime}: {error}")]
    Untrusted {
        runtime: PathBuf,
        error: gpuarch_inventory::trust::Untrusted,
    },
    #[error("{path}: {error}")]
    Config { path: PathBuf, error: oci::OciError },
    #[error("{path}: {error}")]
    Edit { path: PathBuf, error: HookError },
    #[error("cannot replace {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl ShimError {
    /// Whether the start must fail whatever `strict` says.
    pub fn refuses(&self) -> bool {
        matches!(self, Self::Edit { error, .. } if error.refuses())
    }
}

/// Global options of runc and crun that take a value as the next argument.
const GLOBAL_WITH_VALUE: [&str; 7] = [
    "--root",
    "--log",
    "--log-format",
    "--log-level",
    "--criu",
    "--rootless",
    "--cgroup-manager",
];

/// What the shim needs from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// `create`, `run`, `state`, ...; `None` for `--version` and the like.
    pub command: Option<String>,
    /// The bundle of a `create` or `run`: `--bundle`/`-b`, else the current
    /// directory (`None` here).
    pub bundle: Option<PathBuf>,
    /// The global `--log` an engine passes (containerd's shim, podman's
    /// conmon), where the runtime's error is read back from.
    pub log: Option<PathBuf>,
    /// `--log-format json`.
    pub log_json: bool,
    /// The container id of a `create`, `run` or `delete`: its one
    /// positional argument.
    pub id: Option<String>,
}

/// Options of `create` and `run` (runc's and crun's) that take a value.
const COMMAND_WITH_VALUE: [&str; 4] = ["bundle", "b", "console-socket", "pid-file"];

impl Invocation {
    pub fn parse(args: &[OsString]) -> Self {
        let mut i = 0;
        let mut command = None;
        let mut log = None;
        let mut log_json = false;
        while i < args.len() {
            let a = args[i].to_string_lossy();
            if a == "--" {
                i += 1;
                break;
            }
            if a.starts_with('-') {
                // urfave/cli (runc) also takes long options with one dash.
                let name = a.split('=').next().unwrap_or("");
                let long = if name.starts_with("--") || name.len() == 2 {
                    name.to_owned()
                } else {
                    format!("-{name}")
                };
                let takes_value = GLOBAL_WITH_VALUE.contains(&long.as_str());
                let value = match a.split_once('=') {
                    Some((_, v)) => Some(OsString::from(v)),
                    None if takes_value => args.get(i + 1).cloned(),
                    None => None,
                };
                match (long.as_str(), value) {
                    ("--log", Some(v)) => log = Some(PathBuf::from(v)),
                    ("--log-format", Some(v)) => log_json = v == "json",
                    _ => {}
                }
                if takes_value && !a.contains('=') {
                    i += 1;
                }
                i += 1;
                continue;
            }
            command = Some(a.into_owned());
            i += 1;
            break;
        }
        if command.is_none() && i < args.len() {
            command = Some(args[i].to_string_lossy().into_owned());
            i += 1;
        }
        let mut bundle = None;
        let mut id = None;
        if matches!(command.as_deref(), Some("create" | "run" | "delete")) {
            let rest = &args[i..];
            let mut j = 0;
            while j < rest.len() {
                let a = rest[j].to_string_lossy();
                if a == "--" {
                    id = rest.get(j + 1).map(|v| v.to_string_lossy().into_owned());
                    break;
                }
                match a.strip_prefix("--").or_else(|| a.strip_prefix('-')) {
                    Some(name) if !name.contains('=') && COMMAND_WITH_VALUE.contains(&name) => {
                        j += 1
                    }
                    Some(_) => {}
                    None => id = Some(a.into_owned()),
                }
                j += 1;
            }
        }
        if matches!(command.as_deref(), Some("create" | "run")) {
            let rest = &args[i..];
            let mut j = 0;
            while j < rest.len() {
                let a = rest[j].to_string_lossy();
                if a == "--" {
                    break;
                }
                let value = match a.as_ref() {
                    "--bundle" | "-bundle" | "-b" | "--b" => rest.get(j + 1).map(PathBuf::from),
                    _ => ["--bundle=", "-bundle=", "-b=", "--b="]
                        .iter()
                        .find_map(|p| a.strip_prefix(p))
                        .map(PathBuf::from),
                };
                if value.is_some() {
                    bundle = value;
                }
                j += 1;
            }
        }
        Self {
            command,
            bundle,
            log,
            log_json,
            id,
        }
    }

    pub fn creates(&self) -> bool {
        matches!(self.command.as_deref(), Some("create" | "run"))
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

fn executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The real runtime: `configured` when set, else the first of
/// [`DEFAULT_RUNTIMES`] on `path_env`; never `myself`. Opened and checked
/// once ([`open_runtime`]), for [`exec_runtime`].
pub fn find_runtime(
    configured: Option<&Path>,
    path_env: Option<&OsStr>,
    myself: &Path,
) -> Result<Runtime, ShimError> {
    if let Some(p) = configured {
        if same_file(p, myself) {
            return Err(ShimError::IsSelf(p.to_owned()));
        }
        if !executable(p) {
            return Err(ShimError::BadRuntime(p.to_owned()));
        }
        return open_runtime(p.to_owned());
    }
    let dirs: Vec<PathBuf> = path_env
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    for name in DEFAULT_RUNTIMES {
        for d in &dirs {
            let p = d.join(name);
            if executable(&p) && !same_file(&p, myself) {
                return open_runtime(p);
            }
        }
    }
    Err(ShimError::NoRuntime)
}

/// The runtime [`find_runtime`] found, opened once and checked as
/// opened ([`gpuarch_inventory::trust::open`]): [`exec_runtime`] runs
/// exactly this file, whatever happens to its path meanwhile.
#[derive(Debug)]
pub struct Runtime {
    pub path: PathBuf,
    file: std::fs::File,
}

/// Open the runtime at `path` for [`exec_runtime`].
fn open_runtime(path: PathBuf) -> Result<Runtime, ShimError> {
    use gpuarch_inventory::trust::{self, OpenError};
    match trust::open(&path) {
        Ok(file) => Ok(Runtime { path, file }),
        Err(OpenError::Untrusted(error)) => Err(ShimError::Untrusted {
            runtime: path,
            error,
        }),
        Err(OpenError::Io { .. }) => Err(ShimError::BadRuntime(path)),
    }
}

/// Exec `rt` through its descriptor (`execveat(AT_EMPTY_PATH)`) with
/// `args` and this process's environment plus `extra`. Returns only on
/// failure. The descriptor is left open across the exec so that a script
/// runtime's interpreter can read it as `/dev/fd/N`.
pub fn exec_runtime(
    rt: &Runtime,
    args: &[std::ffi::OsString],
    extra: (&str, &str),
) -> std::io::Error {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let cstr = |b: &[u8]| {
        CString::new(b).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let build = || -> std::io::Result<(Vec<CString>, Vec<CString>)> {
        let argv = std::iter::once(cstr(rt.path.as_os_str().as_bytes()))
            .chain(args.iter().map(|a| cstr(a.as_bytes())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut envp = Vec::new();
        for (k, v) in std::env::vars_os() {
            if k.as_bytes() == extra.0.as_bytes() {
                continue;
            }
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(cstr(&kv)?);
        }
        envp.push(cstr(format!("{}={}", extra.0, extra.1).as_bytes())?);
        Ok((argv, envp))
    };
    let (argv, envp) = match build() {
        Ok(v) => v,
        Err(e) => return e,
    };
    let (argv_p, envp_p) = (crate::exec::ptrs(&argv), crate::exec::ptrs(&envp));
    let fd = rt.file.as_raw_fd();
    // SAFETY: a live fd, and arrays from `ptrs` over strings that outlive
    // the calls.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, 0);
        crate::exec::execveat_fd(fd, &argv_p, &envp_p)
    }
}

/// Apply the Plan to `<bundle>/config.json`. A no-op Plan leaves the file
/// as it was; otherwise it is replaced atomically (a temporary file in the
/// bundle renamed over it) with its mode and owner kept.
pub fn rewrite_bundle(bundle: &Path, ctx: &Context) -> Result<Plan, ShimError> {
    let path = bundle.join("config.json");
    let cfg_err = |error| ShimError::Config {
        path: path.clone(),
        error,
    };
    let (bytes, mut config, meta) = context::read_config_file(&path).map_err(cfg_err)?;
    let plan = edit::edit_in(&mut config, ctx, Some(bundle)).map_err(|e| ShimError::Edit {
        path: path.clone(),
        error: edit::locate(e, &bytes),
    })?;
    if plan.is_noop() {
        return Ok(plan);
    }
    let bytes = serde_json::to_vec(&config).map_err(|e| ShimError::Edit {
        path: path.clone(),
        error: e.into(),
    })?;
    let tmp = bundle.join(format!(".config.json.gpuarch-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        f.write_all(&bytes)?;
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|error| {
        let _ = std::fs::remove_file(&tmp);
        ShimError::Write {
            path: path.clone(),
            error,
        }
    })?;
    let mut plan = plan;
    if ctx.env_files && !edit::has_hook_entry(&config) && !edit::env_files_hidden(&config) {
        plan.notes.push(write_env_files(bundle, ctx));
    }
    Ok(plan)
}

/// `runtime.env_files` in this process: `/run/gpuarch/env` and
/// `/etc/profile.d/gpuarch.sh` written into the rootfs the engine prepared,
/// before the runtime runs (no `createContainer` process to start). The
/// same code as that stage, on the same handle-based paths inside the
/// rootfs; no mount of the container is in place yet, so nothing in it can
/// block, and no mount hides the files (the caller checked). A failure is
/// a note: the container starts with the Plan in its env all the same.
fn write_env_files(bundle: &Path, ctx: &Context) -> String {
    let state = crate::stage::State {
        bundle: bundle.to_owned(),
        pid: 0,
        id: None,
    };
    match crate::stage::run(crate::stage::Stage::BeforeRuntime, &state, ctx) {
        Ok(out) => out.plan.notes.last().cloned().unwrap_or_default(),
        Err(e) => format!("runtime.env_files: {e}; exec sessions will not find the Plan in files"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit::tests::ctx;
    use gpuarch_core::config::Config;
    use serde_json::{Value, json};

    fn inv(args: &[&str]) -> Invocation {
        Invocation::parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn finds_the_command_and_the_bundle_as_engines_call_it() {
        // As Docker/containerd call runc.
        let i = inv(&[
            "--root",
            "/run/docker/runtime-runc/moby",
            "--log",
            "/x/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/p",
            "id",
        ]);
        assert_eq!(i.command.as_deref(), Some("create"));
        assert_eq!(i.bundle.as_deref(), Some(Path::new("/b")));
        assert_eq!(i.log.as_deref(), Some(Path::new("/x/log.json")));
        assert!(i.log_json);
        assert_eq!(i.id.as_deref(), Some("id"));
        // The id wherever the options put it, and a value never taken for it.
        for (args, want) in [
            (
                &["create", "--console-socket", "/s", "c1", "--no-pivot"][..],
                Some("c1"),
            ),
            (
                &["create", "--bundle=/b", "--pid-file=/p", "c2"],
                Some("c2"),
            ),
            (&["delete", "--force", "c3"], Some("c3")),
            (&["run", "-d", "--", "-odd"], Some("-odd")),
            (&["create", "--bundle", "/b"], None),
            (&["start", "c4"], None),
        ] {
            assert_eq!(inv(args).id.as_deref(), want, "{args:?}");
        }
        // As conmon calls it for podman.
        let p = inv(&["--log-format=json", "--log=/c/oci-log", "create", "id"]);
        assert_eq!(p.log.as_deref(), Some(Path::new("/c/oci-log")));
        assert!(p.log_json);
        assert!(!inv(&["--log", "/l", "run", "id"]).log_json);
        assert_eq!(
            inv(&["run", "-b", "/c", "id"]).bundle.as_deref(),
            Some(Path::new("/c"))
        );
        assert_eq!(
            inv(&["--root=/r", "create", "--bundle=/d", "id"])
                .bundle
                .as_deref(),
            Some(Path::new("/d"))
        );
        assert_eq!(inv(&["create", "id"]).bundle, None);
        let start = inv(&["--root", "/r", "start", "-b", "/x"]);
        assert_eq!(start.command.as_deref(), Some("start"));
        assert!(!start.creates() && start.bundle.is_none());
        assert_eq!(inv(&["--version"]).command, None);
    }

    #[test]
    fn the_runtime_is_configured_or_found_and_never_the_shim() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = |name: &str| {
            let p = tmp.path().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let me = bin("gpuarch-runtime");
        let crun = bin("crun");
        let path = tmp.path().as_os_str();
        assert_eq!(find_runtime(None, Some(path), &me).unwrap().path, crun);
        std::os::unix::fs::symlink(&me, tmp.path().join("runc")).unwrap();
        assert_eq!(
            find_runtime(None, Some(path), &me).unwrap().path,
            crun,
            "a runc that is the shim is skipped"
        );
        assert!(matches!(
            find_runtime(Some(&me), None, &me),
            Err(ShimError::IsSelf(_))
        ));
        assert!(matches!(
            find_runtime(Some(Path::new("/nonexistent/runc")), None, &me),
            Err(ShimError::BadRuntime(_))
        ));
        assert!(matches!(
            find_runtime(None, None, &me),
            Err(ShimError::NoRuntime)
        ));
    }

    #[test]
    fn rewrites_config_json_atomically_keeping_its_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("config.json");
        let original = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}, "root": {"path": "rootfs"}, "x-vendor": {"a": [1]}});
        std::fs::write(&path, original.to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let plan = rewrite_bundle(tmp.path(), &ctx(Config::default())).unwrap();
        assert_eq!(plan.env_get("TORCH_CUDA_ARCH_LIST"), Some("7.5"));
        let got: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(
            got["process"]["env"]
                .as_array()
                .unwrap()
                .contains(&json!("GPUARCH_DTYPE=float16"))
        );
        assert_eq!(got["x-vendor"], original["x-vendor"]);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
            0o600
        );
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "no temporary file left"
        );

        // No GPU: the file is not even rewritten.
        std::fs::write(&path, "{\"process\": {\"env\": []}}  ").unwrap();
        rewrite_bundle(tmp.path(), &ctx(Config::default())).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"{\"process\": {\"env\": []}}  "
        );

        std::fs::write(
            &path,
            "{\"process\": {\"env\": \"NVIDIA_VISIBLE_DEVICES=0\"}}",
        )
        .unwrap();
        let e = rewrite_bundle(tmp.path(), &ctx(Config::default()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.json") && e.contains("at line 1, column"),
            "{e}"
        );

        std::fs::write(&path, "{").unwrap();
        let e = rewrite_bundle(tmp.path(), &ctx(Config::default()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.json") && e.contains("not valid JSON"),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"{");
    }
}
