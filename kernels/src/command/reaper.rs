//! A build's reaper: the process gpuarchd starts for a `command` build is
//! not the build. Between fork and exec it makes itself a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`) and forks the build, which execs
//! in a process group of its own. Every process the build starts and then
//! leaves (a `setsid` daemon, a double fork) is re-parented to the reaper,
//! not to init: so when the build exits, or gpuarchd sends the reaper
//! `SIGTERM` at the build's time limit, the reaper kills the build's group
//! and then, round after round, every child it has until none is left,
//! and exits with the build's status (`128 + N` for a signal).
//!
//! No capability, namespace or cgroup is needed (the unit has
//! `RestrictNamespaces=yes` and `ProtectControlGroups=yes`). The children
//! come from `/proc/self/task/PID/children`; a kernel without it
//! (`CONFIG_PROC_CHILDREN`) has only the build's group killed, as before.
//!
//! All of it runs in a child of a threaded program, before exec: only
//! async-signal-safe system calls, no allocation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::libc;

/// Set by the reaper's `SIGTERM` handler: the build's time is up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Most rounds of killing what is left (each kills every child listed).
const MAX_ROUNDS: usize = 4096;

/// In the child gpuarchd forked, before exec. Returns (`Ok`) in the build,
/// which then execs; the reaper never returns.
///
/// # Safety
/// Only between fork and exec (a `pre_exec` closure).
pub(super) unsafe fn become_reaper() -> std::io::Result<()> {
    // SAFETY: plain system calls on this process, with valid arguments;
    // the handler only stores to an atomic.
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_term as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut term: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut term);
        libc::sigaddset(&mut term, libc::SIGTERM);
        let reaper = libc::getpid();
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                // The build: its own group (which a kill of the reaper's
                // does not reach), and it dies with the reaper. exec puts
                // SIGTERM back to its default.
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != reaper {
                    libc::_exit(127);
                }
                Ok(())
            }
            build => {
                // No descriptor but the standard three: the spawning
                // process waits for its exec-error pipe to close, which
                // the build's exec does for its own copy.
                close_from(3);
                libc::sigprocmask(libc::SIG_UNBLOCK, &term, std::ptr::null_mut());
                libc::_exit(reap(build))
            }
        }
    }
}

/// Close every descriptor from `first` on.
///
/// # Safety
/// Closes descriptors this process may still mean to use: only in the
/// reaper, which uses none.
unsafe fn close_from(first: u32) {
    // SAFETY: close_range and close on descriptors, no memory.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) == 0 {
            return;
        }
        let mut lim: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as i32
        } else {
            1024
        };
        for fd in first as i32..max {
            libc::close(fd);
        }
    }
}

/// Wait for the build (reaping what is re-parented here meanwhile) until it
/// exits or `SIGTERM` comes; then kill all that is left. The exit code.
fn reap(build: libc::pid_t) -> libc::c_int {
    let mut code = 128 + libc::SIGKILL;
    loop {
        let mut st = 0;
        // SAFETY: waitpid with a valid status pointer.
        let got = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
        if got == build {
            code = if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                128 + libc::WTERMSIG(st)
            };
            break;
        }
        if got > 0 {
            continue;
        }
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 5_000_000,
        };
        // SAFETY: a valid timespec; an interruption (SIGTERM) only ends it.
        unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
    }
    // SAFETY: a signal to the build's group.
    unsafe { libc::kill(-build, libc::SIGKILL) };
    kill_children();
    code
}

/// Kill every child of this process, reap them, and again with what was
/// re-parented meanwhile, until none is left.
fn kill_children() {
    let mut path = [0u8; 64];
    let Some(path) = children_path(&mut path) else {
        return;
    };
    let mut buf = [0u8; 4096];
    for _ in 0..MAX_ROUNDS {
        let n = read_file(path, &mut buf);
        let mut pids = [0 as libc::pid_t; 512];
        let mut count = 0;
        let mut cur: Option<libc::pid_t> = None;
        // Each pid ends at a separator; one more ends the last.
        for &b in buf[..n].iter().chain([&b' ']) {
            if b.is_ascii_digit() {
                cur = Some(cur.unwrap_or(0) * 10 + libc::pid_t::from(b - b'0'));
            } else if let Some(p) = cur.take()
                && count < pids.len()
            {
                pids[count] = p;
                count += 1;
            }
        }
        if count == 0 {
            // Nothing listed: reap any that exited between, and stop.
            let mut st = 0;
            // SAFETY: waitpid with a valid status pointer.
            while unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) } > 0 {}
            return;
        }
        for &p in &pids[..count] {
            // SAFETY: signals to a child of this process and its group.
            unsafe {
                libc::kill(p, libc::SIGKILL);
                libc::kill(-p, libc::SIGKILL);
            }
        }
        for &p in &pids[..count] {
            let mut st = 0;
            // SAFETY: waitpid with a valid status pointer.
            unsafe { libc::waitpid(p, &mut st, 0) };
        }
    }
}

/// `/proc/self/task/PID/children`, NUL-terminated, in `buf`.
fn children_path(buf: &mut [u8; 64]) -> Option<&[u8]> {
    // SAFETY: getpid has no preconditions.
    let mut pid = unsafe { libc::getpid() } as u32;
    let mut digits = [0u8; 10];
    let mut nd = 0;
    loop {
        digits[nd] = b'0' + (pid % 10) as u8;
        nd += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    let head = b"/proc/self/task/";
    let tail = b"/children\0";
    let mut at = 0;
    for &b in head
        .iter()
        .chain(digits[..nd].iter().rev())
        .chain(tail.iter())
    {
        *buf.get_mut(at)? = b;
        at += 1;
    }
    Some(&buf[..at])
}

/// What fits of the file at NUL-terminated `path` into `buf`; 0 when it
/// cannot be read.
fn read_file(path: &[u8], buf: &mut [u8]) -> usize {
    // SAFETY: `path` is NUL-terminated; `buf` is valid for its length.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let mut n = 0;
        while n < buf.len() {
            let got = libc::read(fd, buf[n..].as_mut_ptr().cast(), buf.len() - n);
            if got <= 0 {
                break;
            }
            n += got as usize;
        }
        libc::close(fd);
        n
    }
}

/// gpuarchd's side at the time limit: `SIGTERM` to the reaper, which
/// kills all the build left and exits; after 5 s, the reaper killed.
pub(super) fn stop(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    super::kill_group(child.id());
    let _ = child.wait();
}
