//! The `command` backend: run a package's own build for one target.
//!
//! The sources are copied into `${SRC}` (so the build cannot change the
//! package), the command runs in a fresh work directory with a clean
//! environment (`PATH` of the CUDA tool directories and `/usr/bin:/bin`,
//! `HOME` and `TMPDIR` in the work directory, `LANG=C`, and `ARCH`,
//! `CAPABILITY`, `TORCH_CUDA_ARCH_LIST`, `OUT`, `SRC`, `VARIANT`), below
//! a reaper of its own ([`reaper`]): when it ends or overruns its time,
//! every process it started dies, including one that left its process
//! group and session (`setsid`).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuarch_core::arch::Target;

use crate::error::BuildError;

mod reaper;

/// At most this much of a failed build's output is kept.
const MAX_LOG: usize = 16 << 10;

/// Values of the template variables for one build.
#[derive(Debug, Clone)]
pub struct Vars {
    pub arch: Target,
    pub out: PathBuf,
    pub src: PathBuf,
    pub variant: String,
}

impl Vars {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ARCH", self.arch.to_string()),
            ("CAPABILITY", self.arch.cap.to_string()),
            ("TORCH_CUDA_ARCH_LIST", self.arch.cap.to_string()),
            ("OUT", self.out.display().to_string()),
            ("SRC", self.src.display().to_string()),
            ("VARIANT", self.variant.clone()),
        ]
    }

    /// `${NAME}` replaced by its value; an unknown name is the package's
    /// error, so the build is refused.
    pub fn expand(&self, s: &str) -> Result<String, BuildError> {
        let pairs = self.pairs();
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let after = &rest[i + 2..];
            let j = after
                .find('}')
                .ok_or_else(|| BuildError::Rejected(format!("unclosed ${{ in {s:?}")))?;
            let name = &after[..j];
            let v = pairs.iter().find(|(k, _)| *k == name).ok_or_else(|| {
                BuildError::Rejected(format!("unknown variable ${{{name}}} in {s:?}"))
            })?;
            out.push_str(&v.1);
            rest = &after[j + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// A build program: where it was found, and the file itself, opened once
/// and checked there ([`gpuarch_fs::trust::open`]). What is digested for
/// the build key and what runs is that file, never the path looked up
/// again.
#[derive(Debug)]
pub struct Program {
    pub path: PathBuf,
    pub file: std::fs::File,
}

/// Resolve `argv[0]`: a path with a `/` as given (relative to the sources),
/// a bare name on `path`. The program runs as gpuarchd's user, root: one
/// that another user owns or could write is refused
/// ([`gpuarch_fs::trust`]).
fn resolve(prog: &str, src: &Path, path: &[PathBuf]) -> Result<Program, BuildError> {
    let found = if prog.contains('/') {
        src.join(prog)
    } else {
        path.iter()
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                BuildError::Tool(format!(
                    "{prog} not found on the build PATH ({})",
                    path.iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                ))
            })?
    };
    let file = gpuarch_fs::trust::open(&found)
        .map_err(|e| BuildError::Tool(format!("build program {prog}: {e}")))?;
    Ok(Program { path: found, file })
}

/// The build's PATH: the CUDA tool directories, then the system's.
pub fn build_path(tool_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut v = tool_dirs.to_vec();
    for d in ["/usr/local/bin", "/usr/bin", "/bin"] {
        v.push(PathBuf::from(d));
    }
    v
}

/// The program `argv[0]` names, for the build key (its content is digested).
pub fn program(argv0: &str, src: &Path, tool_dirs: &[PathBuf]) -> Result<Program, BuildError> {
    resolve(argv0, src, &build_path(tool_dirs))
}

/// Run one build. `work` is an empty directory; outputs go to `vars.out`.
pub fn run(
    argv: &[String],
    env: &BTreeMap<String, String>,
    vars: &Vars,
    work: &Path,
    tool_dirs: &[PathBuf],
    timeout: Duration,
) -> Result<String, BuildError> {
    let expanded: Vec<String> = argv
        .iter()
        .map(|a| vars.expand(a))
        .collect::<Result<_, _>>()?;
    let path = build_path(tool_dirs);
    let prog = resolve(&expanded[0], &vars.src, &path)?;
    let path_var = std::env::join_paths(&path).map_err(|e| BuildError::Tool(e.to_string()))?;
    let log_path = work.join("build.log");
    let log = std::fs::File::create(&log_path).map_err(|e| BuildError::Tool(e.to_string()))?;
    // Run through the descriptor: /proc/self/fd/N names, in the child,
    // the file opened and checked here; left open across exec so that a
    // script's interpreter can read it by that name too.
    let fd = prog.file.as_raw_fd();
    let mut cmd = Command::new(format!("/proc/self/fd/{fd}"));
    cmd.arg0(&expanded[0]);
    // SAFETY: between fork and exec only async-signal-safe calls: fcntl
    // on a descriptor the parent keeps open until the child is waited
    // for, then `reaper::become_reaper` (see there).
    unsafe {
        cmd.pre_exec(move || {
            nix::fcntl::fcntl(
                std::os::fd::BorrowedFd::borrow_raw(fd),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .map(drop)
            .map_err(std::io::Error::from)?;
            reaper::become_reaper()
        });
    }
    cmd.args(&expanded[1..])
        .current_dir(work)
        .env_clear()
        .env("PATH", path_var)
        .env("HOME", work)
        .env("TMPDIR", work)
        .env("LANG", "C")
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map_err(|e| BuildError::Tool(e.to_string()))?,
        )
        .stderr(log)
        .process_group(0);
    for (k, v) in vars.pairs() {
        cmd.env(k, v);
    }
    for (k, v) in env {
        cmd.env(k, vars.expand(v)?);
    }
    // A script written just before may still be open for writing in a
    // child another thread forked meanwhile (until that child execs):
    // exec then fails with ETXTBSY. That passes within milliseconds.
    let mut tries = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => {
                break r.map_err(|e| {
                    BuildError::Tool(format!("cannot run {}: {e}", prog.path.display()))
                })?;
            }
        }
    };
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() >= timeout => {
                // The reaper kills the command and every process it left,
                // then exits; killed itself only if it does not.
                reaper::stop(&mut child);
                return Err(BuildError::Tool(format!(
                    "{} ran past its {} s limit and was killed, with every process it started",
                    expanded[0],
                    timeout.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(BuildError::Tool(e.to_string())),
        }
    };
    // The reaper has killed whatever the command left running.
    kill_group(child.id());
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open(&log_path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut f = f;
        if len > MAX_LOG as u64 {
            use std::io::Seek;
            let _ = f.seek(std::io::SeekFrom::Start(len - MAX_LOG as u64));
        }
        let _ = f.take(MAX_LOG as u64).read_to_string(&mut text);
    }
    let _ = std::fs::remove_file(&log_path);
    if status.success() {
        Ok(text)
    } else {
        Err(BuildError::Rejected(format!(
            "{} exited with {status}: {}",
            expanded[0],
            text.trim_end()
        )))
    }
}

/// SIGKILL to the process group `pid` leads (a build and all it started).
pub(crate) fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
