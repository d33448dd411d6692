//! The container's loader cache, rebuilt by the host's ldconfig without
//! ever letting it reach the host.
//!
//! ldconfig follows every path the image names: `/etc/ld.so.conf` and its
//! includes, the directories it scans, `/etc/ld.so.cache`,
//! `/var/cache/ldconfig`. `ldconfig -r ROOTFS` only chroots, and at
//! createContainer the rootfs has `/proc` mounted, whose `/proc/N/root` are
//! magic links to the host's tree (the runtime's init has not pivoted yet):
//! an image could have root write soname links, an aux-cache or a cache
//! into any host directory.
//!
//! So ldconfig runs in a child that, before it execs:
//! 1. takes a mount namespace of its own, private, so nothing it does
//!    propagates back;
//! 2. binds the rootfs onto itself and `pivot_root`s into it, then detaches
//!    the old root: the host's tree is no longer reachable by any path;
//! 3. detaches every procfs mount under the rootfs (found in the mount
//!    table before the fork), so no magic link is left;
//! 4. drops every capability but `CAP_DAC_OVERRIDE` and
//!    `CAP_DAC_READ_SEARCH` from its bounding set and sets `no_new_privs`:
//!    ldconfig can still write files another uid (a user namespace's root)
//!    owns, but nothing can mount a new procfs or undo the above;
//! 5. execs the host's ldconfig through a descriptor opened on the host,
//!    with an empty environment but `PATH`. That ldconfig must be
//!    statically linked: a dynamic one would be started by the image's own
//!    loader, as root.
//!
//! This is the approach of NVIDIA's update-ldcache hook (a pivot_root
//! into the container's root in new namespaces), with the container's
//! procfs detached rather than replaced and capabilities dropped.
//!
//! The child runs between `fork` and `exec` of a possibly multi-threaded
//! process, so it only makes system calls on data prepared before the
//! fork: no allocation, no locks.

use std::ffi::{CString, OsStr};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Capabilities ldconfig keeps: writing and reading files owned by another
/// uid (a user-namespaced container's root).
/// (`CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH`, linux/capability.h.)
const KEEP_CAPS: [libc::c_int; 2] = [1, 2];
const CAP_LAST: libc::c_int = 63;
const PROC_SUPER_MAGIC: libc::c_long = 0x9fa0;
/// ldconfig's own messages are short; more than this is cut.
const MAX_OUTPUT: u64 = 64 << 10;

/// Everything the child needs, made before the fork.
struct Prepared {
    rootfs: CString,
    /// Procfs mount points under the rootfs, as paths inside it,
    /// shallowest first.
    procs: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    bin: OwnedFd,
}

/// Rebuild the loader cache of the container whose root is `rootfs` (a
/// path in the caller's mount namespace, the engine's) with the host's
/// ldconfig at `bin`, adding `dirs` (paths inside the container).
pub fn run(
    bin: &Path,
    rootfs: &Path,
    dirs: &[String],
    path_env: &str,
) -> Result<(), LdconfigError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |error| LdconfigError::Io { path, error }
    };
    let rootfs = std::fs::canonicalize(rootfs).map_err(io(rootfs))?;
    let file = std::fs::File::open(bin).map_err(io(bin))?;
    let interp = interpreter(&file).map_err(|error| LdconfigError::NotElf {
        bin: bin.to_owned(),
        error,
    })?;
    if let Some(interp) = interp {
        return Err(LdconfigError::Dynamic {
            bin: bin.to_owned(),
            interp,
        });
    }
    let mountinfo =
        std::fs::read("/proc/self/mountinfo").map_err(io(Path::new("/proc/self/mountinfo")))?;
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| LdconfigError::Nul);
    let mut procs = proc_mounts_under(&mountinfo, &rootfs);
    procs.sort_by(|a, b| (a.as_os_str().len(), a).cmp(&(b.as_os_str().len(), b)));
    procs.dedup();
    let prepared = Prepared {
        rootfs: cstr(rootfs.as_os_str().as_bytes())?,
        procs: procs
            .iter()
            .map(|p| cstr(p.as_os_str().as_bytes()))
            .collect::<Result<_, _>>()?,
        argv: std::iter::once(Ok(c"ldconfig".to_owned()))
            .chain(dirs.iter().map(|d| cstr(d.as_bytes())))
            .collect::<Result<_, _>>()?,
        env: vec![cstr(format!("PATH={path_env}").as_bytes())?],
        bin: file.into(),
    };
    spawn_and_wait(&prepared, bin)
}

fn spawn_and_wait(p: &Prepared, bin: &Path) -> Result<(), LdconfigError> {
    let (argv, envp) = (crate::exec::ptrs(&p.argv), crate::exec::ptrs(&p.env));
    let procs: Vec<*const libc::c_char> = p.procs.iter().map(|a| a.as_ptr()).collect();
    let devnull = std::fs::File::open("/dev/null").map_err(|error| LdconfigError::Io {
        path: "/dev/null".into(),
        error,
    })?;
    let (rd, wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| LdconfigError::Sys {
            call: "pipe",
            error: e.into(),
        })?;
    // SAFETY: the child only makes system calls on memory prepared above
    // (no allocation, no locks) and ends in execveat or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(LdconfigError::Sys {
            call: "fork",
            error: std::io::Error::last_os_error(),
        });
    }
    if pid == 0 {
        // SAFETY: in the child of fork; see `child`.
        unsafe {
            child(
                p.rootfs.as_ptr(),
                &procs,
                p.bin.as_raw_fd(),
                &argv,
                &envp,
                devnull.as_raw_fd(),
                wr.as_raw_fd(),
            )
        }
    }
    drop(wr);
    let mut out = Vec::new();
    let _ = std::fs::File::from(rd)
        .take(MAX_OUTPUT)
        .read_to_end(&mut out);
    let status = loop {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break status;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(LdconfigError::Sys {
                call: "waitpid",
                error: e,
            });
        }
    };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out);
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let how = if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else {
        format!("signal {}", libc::WTERMSIG(status))
    };
    Err(LdconfigError::Failed {
        bin: bin.to_owned(),
        how,
        last: last.to_owned(),
    })
}

/// Why the container's loader cache was not rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum LdconfigError {
    #[error("{}: {error}", path.display())]
    Io {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("{}: {error}", bin.display())]
    NotElf {
        bin: std::path::PathBuf,
        error: ElfError,
    },
    #[error(
        "{} is dynamically linked (through {interp}): inside the container it would be \
         loaded by the image's own loader, as root; install a statically linked ldconfig \
         (Debian's and Ubuntu's ldconfig.real are)",
        bin.display()
    )]
    Dynamic {
        bin: std::path::PathBuf,
        interp: String,
    },
    #[error("a path holds a NUL byte")]
    Nul,
    #[error("{call}: {error}")]
    Sys {
        call: &'static str,
        error: std::io::Error,
    },
    #[error("{} exited with {how}: {last}", bin.display())]
    Failed {
        bin: std::path::PathBuf,
        how: String,
        last: String,
    },
}

/// Why a file is not an ELF file whose interpreter can be read.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file: {0}")]
    Read(std::io::Error),
    #[error("not a 64-bit little-endian ELF file")]
    NotElf64,
    #[error("bad program headers")]
    ProgramHeaders,
    #[error("program header {index}: {error}")]
    ProgramHeader { index: u64, error: std::io::Error },
    #[error("PT_INTERP: {0}")]
    Interp(std::io::Error),
}

/// Write `msg` and the current errno's number to `fd`, then `_exit(127)`.
///
/// # Safety
/// Async-signal-safe: only `write` and `_exit`.
unsafe fn die(fd: libc::c_int, msg: &[u8]) -> ! {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let mut num = [0u8; 12];
    let mut i = num.len();
    let mut n = errno.unsigned_abs();
    loop {
        i -= 1;
        num[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    // SAFETY: plain writes of live buffers, then _exit.
    unsafe {
        libc::write(fd, msg.as_ptr().cast(), msg.len());
        libc::write(fd, b": errno ".as_ptr().cast(), 8);
        libc::write(fd, num[i..].as_ptr().cast(), num.len() - i);
        libc::write(fd, b"\n".as_ptr().cast(), 1);
        libc::_exit(127)
    }
}

/// The child: confine, then exec ldconfig. Never returns.
///
/// # Safety
/// Called only in the child of `fork`, with pointers to NUL-terminated
/// strings and NULL-terminated arrays that outlive the call.
unsafe fn child(
    rootfs: *const libc::c_char,
    procs: &[*const libc::c_char],
    bin: libc::c_int,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    stdin: libc::c_int,
    out: libc::c_int,
) -> ! {
    // SAFETY: each call is a system call on prepared data; failures end
    // the child through `die`.
    unsafe {
        if libc::dup2(stdin, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(out, 2) < 0 {
            die(out, b"gpuarch: dup2");
        }
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            die(2, b"gpuarch: unshare(CLONE_NEWNS)");
        }
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            die(2, b"gpuarch: making / private");
        }
        if libc::mount(
            rootfs,
            rootfs,
            none,
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ) != 0
        {
            die(2, b"gpuarch: binding the rootfs onto itself");
        }
        if libc::chdir(rootfs) != 0 {
            die(2, b"gpuarch: chdir to the rootfs");
        }
        let dot = c".".as_ptr();
        if libc::syscall(libc::SYS_pivot_root, dot, dot) != 0 {
            die(2, b"gpuarch: pivot_root into the rootfs");
        }
        // The old root is stacked under the new one at "/": detach it.
        if libc::umount2(dot, libc::MNT_DETACH) != 0 {
            die(2, b"gpuarch: detaching the old root");
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            die(2, b"gpuarch: chdir /");
        }
        // Shallowest first: detaching a procfs mount takes every mount
        // under it along, and a mount stacked on another at the same point
        // comes off one at a time.
        let is_proc = |p: *const libc::c_char| {
            let mut st: libc::statfs = std::mem::zeroed();
            libc::statfs(p, &mut st) == 0 && st.f_type as libc::c_long == PROC_SUPER_MAGIC
        };
        for &p in procs {
            while is_proc(p) {
                if libc::umount2(p, libc::MNT_DETACH) != 0 {
                    break;
                }
            }
        }
        for &p in procs {
            if is_proc(p) {
                die(
                    2,
                    b"gpuarch: a procfs mount in the rootfs could not be detached",
                );
            }
        }
        for cap in 0..=CAP_LAST {
            if KEEP_CAPS.contains(&cap) {
                continue;
            }
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                && *libc::__errno_location() != libc::EINVAL
            {
                die(2, b"gpuarch: dropping capabilities");
            }
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            die(2, b"gpuarch: no_new_privs");
        }
        crate::exec::execveat_fd(bin, argv, envp);
        die(2, b"gpuarch: execveat of the host's ldconfig")
    }
}

/// The procfs mounts at or under `rootfs` in a mount table
/// (`/proc/self/mountinfo`), as absolute paths inside the rootfs.
fn proc_mounts_under(mountinfo: &[u8], rootfs: &Path) -> Vec<PathBuf> {
    let root = rootfs.as_os_str().as_bytes();
    let mut out = Vec::new();
    for line in mountinfo.split(|&b| b == b'\n') {
        let Some(sep) = line.windows(3).position(|w| w == b" - ") else {
            continue;
        };
        let fstype = line[sep + 3..].split(|&b| b == b' ').next().unwrap_or(b"");
        if fstype != b"proc" {
            continue;
        }
        let Some(point) = line[..sep].split(|&b| b == b' ').nth(4) else {
            continue;
        };
        let point = unescape(point);
        let rel = if point == root {
            &b"/"[..]
        } else if point.starts_with(root) && point.get(root.len()) == Some(&b'/') {
            &point[root.len()..]
        } else {
            continue;
        };
        out.push(PathBuf::from(OsStr::from_bytes(rel)));
    }
    out
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// The ELF interpreter (`PT_INTERP`) of a 64-bit little-endian ELF file, if
/// it has one; an error if it is not such a file.
fn interpreter(file: &std::fs::File) -> Result<Option<String>, ElfError> {
    use std::os::unix::fs::FileExt;
    let mut h = [0u8; 64];
    file.read_exact_at(&mut h, 0).map_err(ElfError::Read)?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let (phoff, phentsize, phnum) = (u64_at(&h, 32), u16_at(&h, 54), u16_at(&h, 56));
    if phentsize < 56 || phnum > 512 {
        return Err(ElfError::ProgramHeaders);
    }
    for i in 0..u64::from(phnum) {
        let mut ph = [0u8; 56];
        file.read_exact_at(&mut ph, phoff + i * u64::from(phentsize))
            .map_err(|error| ElfError::ProgramHeader { index: i, error })?;
        if u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == 3 {
            let (off, size) = (u64_at(&ph, 8), u64_at(&ph, 32).min(4096));
            let mut name = vec![0u8; size as usize];
            file.read_exact_at(&mut name, off)
                .map_err(ElfError::Interp)?;
            let name = String::from_utf8_lossy(&name);
            return Ok(Some(name.trim_end_matches('\0').to_owned()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn procfs_mounts_under_the_rootfs_are_found_and_others_are_not() {
        let table = b"22 1 0:5 / /proc rw - proc proc rw\n\
            100 99 0:50 / /b/root\\040fs rw - overlay overlay rw\n\
            101 100 0:51 / /b/root\\040fs/proc rw,nosuid - proc proc rw\n\
            102 101 0:52 / /b/root\\040fs/proc/acpi ro - tmpfs tmpfs ro\n\
            103 100 0:5 / /b/root\\040fs/host/proc ro - proc proc rw\n\
            104 1 0:53 / /b/root\\040fs2/proc rw - proc proc rw\n\
            105 100 0:54 / /b/root\\040fs/sys ro - sysfs sysfs ro\n";
        let found = proc_mounts_under(table, Path::new("/b/root fs"));
        assert_eq!(found, [PathBuf::from("/proc"), PathBuf::from("/host/proc")]);
        assert_eq!(
            proc_mounts_under(table, Path::new("/b/root fs/proc")),
            [PathBuf::from("/")]
        );
    }

    #[test]
    fn a_dynamically_linked_ldconfig_is_refused_and_a_static_one_is_not() {
        // The test binary itself is dynamically linked.
        let exe = std::fs::File::open("/proc/self/exe").unwrap();
        let interp = interpreter(&exe).unwrap();
        assert!(
            interp.as_deref().is_some_and(|i| i.contains("ld-linux")),
            "{interp:?}"
        );
        let tmp = tempfile::tempdir().unwrap();
        let e = run(&std::env::current_exe().unwrap(), tmp.path(), &[], "/bin").unwrap_err();
        assert!(e.to_string().contains("dynamically linked"), "{e}");
        let text = tmp.path().join("script");
        std::fs::write(&text, "#!/bin/sh\n").unwrap();
        let e = run(&text, tmp.path(), &[], "/bin").unwrap_err();
        assert!(e.to_string().contains("not an ELF file"), "{e}");
        // The host's own (Debian's, Ubuntu's ldconfig.real) is static.
        let ld = crate::stage::LDCONFIG
            .iter()
            .map(Path::new)
            .find(|p| p.is_file());
        if let Some(ld) = ld {
            let f = std::fs::File::open(ld).unwrap();
            assert_eq!(interpreter(&f).unwrap(), None, "{}", ld.display());
        }
    }
}
