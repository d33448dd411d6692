//! NVML where there is no snapshot: read by `gpuarchctl --offline devices
//! --json` in a process of its own, never in the hook's.
//!
//! The hook and the shim are static binaries (a container start pays for
//! their start-up, and static costs about half of a dynamic one's). A
//! static glibc program can `dlopen` a library only if the host's libc is
//! the very glibc it was linked with, and the driver's
//! `libnvidia-ml.so.1` needs the host's. gpuarchctl is dynamic, beside the
//! hook, and prints the snapshot gpuarchd would write. A driver call that
//! hangs is then a process killed when the budget is spent, not a thread
//! left behind.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuarch_core::snapshot::{self, Snapshot};

/// gpuarchctl where the package installs it, when it is not beside the
/// running program.
pub const GPUARCHCTL: &str = "/usr/bin/gpuarchctl";

/// Why NVML gave no inventory.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error(transparent)]
    Budget(#[from] crate::budget::BudgetError),
    #[error("cannot run {}: {error}", ctl.display())]
    Run { ctl: PathBuf, error: String },
    #[error("{}", .0.trim())]
    Failed(String),
    #[error("{} printed no snapshot: {error}", ctl.display())]
    Output { ctl: PathBuf, error: String },
}

/// The gpuarchctl to run: beside this program (the package's /usr/bin, a
/// build tree), else [`GPUARCHCTL`].
pub fn gpuarchctl() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.parent()?.join("gpuarchctl")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(GPUARCHCTL))
}

/// The inventory from NVML, read by gpuarchctl within `budget`; the child
/// is killed when the budget is spent, and when this program dies.
pub fn read(budget: Duration) -> Result<Snapshot, NvmlError> {
    let deadline = Instant::now() + budget;
    let ctl = gpuarchctl();
    let run_err = |error: String| NvmlError::Run {
        ctl: ctl.clone(),
        error,
    };
    // What root runs is the file checked (the trust rule), run through
    // its descriptor.
    let file = gpuarch_fs::trust::open(&ctl).map_err(|e| run_err(e.to_string()))?;
    let mut cmd = Command::new(format!("/proc/self/fd/{}", file.as_raw_fd()));
    cmd.arg0("gpuarchctl")
        .args(["--offline", "devices", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            // Killed with the thread that started it (and so with this
            // process): a hung driver call never outlives the hook.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| run_err(e.to_string()))?;
    drop(file);
    let out = collect(&mut child, deadline);
    let _ = child.kill();
    let status = child.wait().map_err(|e| run_err(e.to_string()))?;
    let (stdout, stderr) = out.ok_or(crate::budget::BudgetError::Elapsed(budget))?;
    if !status.success() {
        let why = String::from_utf8_lossy(&stderr);
        let why = why.strip_prefix("gpuarchctl: ").unwrap_or(&why);
        return Err(NvmlError::Failed(why.to_string()));
    }
    Snapshot::from_json(&stdout).map_err(|e| NvmlError::Output {
        ctl: ctl.clone(),
        error: e.to_string(),
    })
}

/// The child's stdout (at most a snapshot's bound, plus one byte) and
/// stderr (4 KiB), read until both close; None past the deadline.
fn collect(child: &mut Child, deadline: Instant) -> Option<(Vec<u8>, Vec<u8>)> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut stdout = child.stdout.take()?;
    let mut stderr = child.stderr.take()?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_open, mut err_open) = (true, true);
    let mut buf = [0u8; 16 << 10];
    while out_open || err_open {
        let left = deadline.checked_duration_since(Instant::now())?;
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let (ready_out, ready_err) = {
            let mut fds = Vec::with_capacity(2);
            if out_open {
                fds.push(PollFd::new(
                    std::os::fd::AsFd::as_fd(&stdout),
                    PollFlags::POLLIN,
                ));
            }
            if err_open {
                fds.push(PollFd::new(
                    std::os::fd::AsFd::as_fd(&stderr),
                    PollFlags::POLLIN,
                ));
            }
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            let mut it = fds.iter();
            let o = out_open && it.next().is_some_and(ready);
            let e = err_open && it.next().is_some_and(ready);
            (o, e)
        };
        if ready_out {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.len() > snapshot::MAX_BYTES {
                        // Over the bound: refused as it is, unread further.
                        return Some((out, err));
                    }
                }
            }
        }
        if ready_err {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => {
                    let room = 4096usize.saturating_sub(err.len());
                    err.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
    }
    Some((out, err))
}
