//! Start a batch of commands at once and time each container's start:
//! its first line seen by a watcher at real-time priority, its CPU time
//! from `wait4`.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The first line every container prints.
pub(super) const UP: &str = "up";

/// Start every command at once and wait for all: the batch's wall time and
/// for each command, the time until its container printed its first line
/// (the process inside is running: the container has started), its CPU
/// time and its output.
///
/// One thread starts them all and watches their output. It runs at a
/// real-time priority where the kernel allows it, so that when a first line
/// arrives it is there to see it at once; a thread of normal priority
/// waits its turn behind the 150 containers it is timing, and that wait
/// (tens of milliseconds, different every time) was in every figure.
/// Children get normal priority back (`SCHED_RESET_ON_FORK`).
pub(super) fn batch(cmds: Vec<Command>) -> (Duration, Vec<Run>) {
    let t0 = Instant::now();
    // A thread of its own, so that the real-time policy ends with the batch.
    let runs = std::thread::spawn(move || watch(cmds)).join().unwrap();
    (t0.elapsed(), runs)
}

/// How one container's start went.
pub(super) struct Run {
    /// From the command's start to the container's first line.
    pub(super) up: Duration,
    /// CPU time (user and system) of the command and everything it waited
    /// for: the shim, the runtime, the runtime's children and the container.
    pub(super) cpu: Duration,
    pub(super) out: Output,
}

/// One command being watched.
struct Watched {
    child: std::process::Child,
    start: Instant,
    up: Option<Duration>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// stdout and stderr, until each ends.
    open: [Option<std::os::fd::OwnedFd>; 2],
}

/// Read what is there on every ready pipe; note the first line's time.
fn drain(all: &mut [Watched], wait_ms: u16) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut at = Vec::new();
    let mut fds = Vec::new();
    for (w, x) in all.iter().enumerate() {
        for (k, fd) in x.open.iter().enumerate() {
            if let Some(fd) = fd {
                at.push((w, k));
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
        }
    }
    if fds.is_empty() {
        return;
    }
    poll(&mut fds, PollTimeout::from(wait_ms)).unwrap();
    let ready: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(true)).collect();
    drop(fds);
    let now = Instant::now();
    for ((w, k), ready) in at.into_iter().zip(ready) {
        if !ready {
            continue;
        }
        let x = &mut all[w];
        let mut buf = [0u8; 65536];
        let n = nix::unistd::read(x.open[k].as_ref().unwrap(), &mut buf).unwrap();
        if n == 0 {
            x.open[k] = None;
            continue;
        }
        if k == 0 {
            x.stdout.extend_from_slice(&buf[..n]);
            if x.up.is_none() && buf[..n].contains(&b'\n') {
                x.up = Some(now - x.start);
            }
        } else {
            x.stderr.extend_from_slice(&buf[..n]);
        }
    }
}

/// Start `cmds` one right after the other, watching the output of those
/// already started between starts, then until every one has ended.
fn watch(cmds: Vec<Command>) -> Vec<Run> {
    realtime();
    let mut all: Vec<Watched> = Vec::new();
    for mut c in cmds {
        let start = Instant::now();
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let open = [
            Some(child.stdout.take().unwrap().into()),
            Some(child.stderr.take().unwrap().into()),
        ];
        all.push(Watched {
            child,
            start,
            up: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
            open,
        });
        drain(&mut all, 0);
    }
    while all.iter().any(|x| x.open.iter().any(Option::is_some)) {
        drain(&mut all, 1000);
    }
    all.into_iter().map(reap).collect()
}

/// This thread at a real-time priority, its children not; where the kernel
/// refuses, say so once and go on at normal priority.
fn realtime() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: a plain syscall on this thread with a valid, live parameter.
    let r = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if r != 0 {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            eprintln!(
                "note: no real-time priority for the watching thread ({}): start times include its waits",
                std::io::Error::last_os_error()
            )
        });
    }
}

/// Wait for an ended command: its status and, from `wait4`, the CPU time of
/// it and of the descendants it waited for.
fn reap(x: Watched) -> Run {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = x.child.id() as libc::pid_t;
    // SAFETY: `pid` is our child, not yet reaped (Child::wait is never
    // called on it); both pointers are to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Run {
        up: x.up.unwrap_or(Duration::MAX),
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        out: Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout: x.stdout,
            stderr: x.stderr,
        },
    }
}
