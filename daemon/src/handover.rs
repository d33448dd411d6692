//! A restart without a gap: on `SIGUSR2` gpuarchd starts the program it
//! was started as (after a package upgrade, the new binary at the same
//! path) as its successor, and keeps serving until the successor takes
//! over:
//!
//! 1. the successor reads the inventory and registers with the runtime's
//!    NRI socket while the old gpuarchd is still registered (the two never
//!    plan the same container: [`crate::nri::claims`]), then says `ready`
//!    on a socket the old one gave it (fd 3);
//! 2. the old gpuarchd, the unit's main process, tells systemd that the
//!    successor is (`MAINPID=`; `NotifyAccess=main` accepts it from the
//!    main process alone, so nothing else in the unit can) and answers
//!    `go`;
//! 3. the successor takes `io.gpuarch1` (and `io.gpuarch1.Admin`); the old
//!    one, told by the bus, leaves NRI and exits 0.
//!
//! So at every moment one gpuarchd is registered and answering. A
//! successor that is not ready within [`READY_WITHIN`] is stopped, and one
//! that fails before step 2 ends; either way the old gpuarchd serves on.
//! One that fails after step 2 is a main process that failed, and systemd
//! restarts the service (`Restart=on-failure`).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::state::Shared;

/// Set in the successor's environment: the old gpuarchd's pid.
pub const ENV: &str = "GPUARCH_HANDOVER";

/// The successor's end of the socket to the old gpuarchd.
const FD: RawFd = 3;

/// How long a successor waits to be registered with NRI before it says
/// it is ready all the same (NRI's pods are then planned by nobody from
/// the old one's exit until it registers).
pub const REGISTER_WITHIN: Duration = Duration::from_secs(3);

/// How long the old gpuarchd waits for its successor's `ready`.
pub const READY_WITHIN: Duration = Duration::from_secs(10);

/// How long a successor waits for the old gpuarchd's `go`.
const GO_WITHIN: Duration = Duration::from_secs(2);

/// The program this gpuarchd runs, as a path: read at start, so that
/// after an upgrade it names the file now at that path, not the old
/// inode (`/proc/self/exe` then reads "... (deleted)").
pub fn program_at_start() -> Option<PathBuf> {
    std::env::current_exe().ok()
}

/// The gpuarchd this process is to replace.
#[derive(Debug)]
pub struct Predecessor {
    pub pid: u32,
    channel: UnixStream,
}

/// This process is a successor: the old gpuarchd, and the socket to it
/// (fd 3, a Unix socket). Read once: the fd is taken.
pub fn predecessor() -> Option<Predecessor> {
    let pid = std::env::var(ENV).ok()?.parse().ok()?;
    // SAFETY: fstat of a descriptor number, into a zeroed plain struct.
    let is_socket = unsafe {
        let mut st: nix::libc::stat = std::mem::zeroed();
        nix::libc::fstat(FD, &mut st) == 0 && st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFSOCK
    };
    if !is_socket {
        warn!("{ENV} is set, but fd {FD} is not the socket to the gpuarchd it names");
        return None;
    }
    // SAFETY: fd 3 is an open socket (checked above) that the old
    // gpuarchd left to this process alone, and nothing else here owns it.
    let channel = unsafe { UnixStream::from_raw_fd(FD) };
    let _ = nix::fcntl::fcntl(
        &channel,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    Some(Predecessor { pid, channel })
}

impl Predecessor {
    /// Say `ready` and wait for `go`: the old gpuarchd has made this
    /// process the service's main process and this one may take the bus
    /// name. Blocking.
    pub fn ready(mut self) -> std::io::Result<()> {
        self.channel.write_all(b"ready\n")?;
        self.channel.set_read_timeout(Some(GO_WITHIN))?;
        let mut line = String::new();
        BufReader::new(&self.channel).read_line(&mut line)?;
        if line.trim_end() == "go" {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "gpuarchd pid {} did not answer go (it said {:?})",
                self.pid,
                line.trim_end()
            )))
        }
    }
}

/// Start `program` with this process's arguments as its successor and
/// lead the handover from this side on a thread of its own; the
/// successor's pid.
pub fn spawn(program: &Path, shared: Arc<Shared>) -> std::io::Result<u32> {
    // From before the successor can register until this one exits, or
    // the successor did not take over.
    shared.set_claiming(true);
    let spawned = start(program);
    if spawned.is_err() {
        shared.set_claiming(false);
    }
    let (mut child, ours) = spawned?;
    let pid = child.id();
    info!(
        "SIGUSR2: started {} (pid {pid}) to take over; serving until it has",
        program.display()
    );
    std::thread::spawn(move || {
        match lead(ours, pid, crate::sdnotify::notify) {
            Ok(()) => info!("the successor (pid {pid}) is ready: it is the main process now"),
            Err(e) => {
                warn!("the successor (pid {pid}) did not take over: {e}; serving on");
                let _ = child.kill();
                shared.set_claiming(false);
            }
        }
        match child.wait() {
            Ok(s) => warn!("the successor gpuarchd (pid {pid}) ended while this one serves: {s}"),
            Err(e) => warn!("the successor gpuarchd (pid {pid}): {e}"),
        }
    });
    Ok(pid)
}

/// `program` started with this process's arguments and the socket at fd 3;
/// this side of the socket.
fn start(program: &Path) -> std::io::Result<(std::process::Child, UnixStream)> {
    let (ours, theirs) = UnixStream::pair()?;
    let fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new(program);
    cmd.args(std::env::args_os().skip(1))
        .env(ENV, std::process::id().to_string())
        // systemd set it to this pid: the successor, once main, pings.
        .env_remove("WATCHDOG_PID")
        .stdin(std::process::Stdio::null());
    // SAFETY: between fork and exec only dup2 and fcntl, both
    // async-signal-safe, on descriptors this process owns.
    unsafe {
        cmd.pre_exec(move || {
            let r = if fd == FD {
                nix::libc::fcntl(FD, nix::libc::F_SETFD, 0)
            } else {
                nix::libc::dup2(fd, FD)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    Ok((child, ours))
}

/// The old gpuarchd's side: wait for `ready`, make the successor the
/// main process, say `go`.
fn lead(
    channel: UnixStream,
    pid: u32,
    notify: impl Fn(&str) -> std::io::Result<bool>,
) -> std::io::Result<()> {
    channel.set_read_timeout(Some(READY_WITHIN))?;
    let mut line = String::new();
    BufReader::new(&channel).read_line(&mut line)?;
    if line.trim_end() != "ready" {
        return Err(std::io::Error::other(format!(
            "it ended or said {:?} before it was ready",
            line.trim_end()
        )));
    }
    notify(&format!("MAINPID={pid}"))?;
    (&channel).write_all(b"go\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_passes_to_the_successor_only_once_it_is_ready() {
        let said = std::sync::Mutex::new(Vec::new());
        let (old, new) = UnixStream::pair().unwrap();
        let successor = Predecessor {
            pid: 1,
            channel: new,
        };
        std::thread::scope(|s| {
            let t = s.spawn(|| successor.ready());
            lead(old, 42, |m| {
                said.lock().unwrap().push(m.to_owned());
                Ok(true)
            })
            .unwrap();
            t.join().unwrap().unwrap();
        });
        assert_eq!(*said.lock().unwrap(), ["MAINPID=42"]);
    }

    #[test]
    fn a_successor_that_ends_or_says_otherwise_is_not_made_main() {
        let notify = |m: &str| -> std::io::Result<bool> { panic!("said {m}") };
        let (old, new) = UnixStream::pair().unwrap();
        drop(new);
        assert!(lead(old, 42, notify).is_err());
        let (old, mut new) = UnixStream::pair().unwrap();
        new.write_all(b"MAINPID=1\n").unwrap();
        let e = lead(old, 42, notify).unwrap_err();
        assert!(e.to_string().contains("MAINPID=1"), "{e}");
    }

    #[test]
    fn a_successor_without_go_does_not_take_over() {
        let (old, new) = UnixStream::pair().unwrap();
        let successor = Predecessor {
            pid: 7,
            channel: new,
        };
        let t = std::thread::spawn(move || successor.ready());
        let mut line = String::new();
        BufReader::new(&old).read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        (&old).write_all(b"no\n").unwrap();
        let e = t.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("did not answer go"), "{e}");
    }
}
