//! Writing files inside a container's root filesystem without ever leaving
//! it. The rootfs belongs to whoever owns the container, and the hook runs as
//! root: every path is resolved by the kernel with `openat2(RESOLVE_IN_ROOT)`
//! against a handle on the rootfs, so a symlink such as `/run -> /etc` on the
//! host resolves to the rootfs's own `/etc`, never the host's.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::{Mode, fchmod, mkdirat};

/// Something inside the rootfs could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot open the container rootfs {path}: {errno}")]
    Open { path: PathBuf, errno: Errno },
    #[error(
        "openat2 is not available (Linux 5.6 or later is needed to write inside a container safely)"
    )]
    NoOpenat2,
    #[error("{path} inside the container: {what}: {errno}")]
    Inside {
        path: PathBuf,
        what: &'static str,
        errno: Errno,
    },
    #[error("{path} is not a plain relative path inside the container")]
    BadPath { path: PathBuf },
}

/// Whether `st` is a regular file's.
pub(crate) fn is_regular(st: &nix::sys::stat::FileStat) -> bool {
    st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG
}

/// The first `max` bytes of open file `fd` (a header block is what is
/// wanted: the rest is left unread, not refused).
pub(crate) fn read_prefix(fd: OwnedFd, max: usize) -> Result<Vec<u8>, Errno> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::from(fd)
        .take(max as u64)
        .read_to_end(&mut out)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)))?;
    Ok(out)
}

/// A handle on a container's root filesystem.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

const IN_ROOT: ResolveFlag = ResolveFlag::RESOLVE_IN_ROOT.union(ResolveFlag::RESOLVE_NO_MAGICLINKS);

fn inside<'a>(path: &'a Path, what: &'static str) -> impl Fn(Errno) -> RootfsError + 'a {
    move |errno| match errno {
        Errno::ENOSYS => RootfsError::NoOpenat2,
        errno => RootfsError::Inside {
            path: Path::new("/").join(path),
            what,
            errno,
        },
    }
}

impl Root {
    /// Open the rootfs at `path` (a host path the engine chose, or
    /// `/proc/PID/root` of the container's process).
    pub fn open(path: &Path) -> Result<Self, RootfsError> {
        let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC);
        let fd = openat2(nix::fcntl::AT_FDCWD, path, how).map_err(|errno| match errno {
            Errno::ENOSYS => RootfsError::NoOpenat2,
            errno => RootfsError::Open {
                path: path.to_owned(),
                errno,
            },
        })?;
        Ok(Self { fd })
    }

    /// A path-only handle on directory `rel`, resolved inside the rootfs:
    /// to resolve further names from, or look one up with
    /// [`Root::has_entry`].
    pub fn open_dir(&self, rel: &Path) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(IN_ROOT);
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        openat2(self.fd.as_fd(), rel, how)
    }

    /// Open directory `rel` (relative to the container's `/`) for reading
    /// its entries; symlinks on the way resolve inside the rootfs.
    pub fn open_dir_read(&self, rel: &Path) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(IN_ROOT);
        openat2(self.fd.as_fd(), rel, how)
    }

    /// Another handle on the same rootfs (for a reader on another thread).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
        })
    }

    /// The status of `rel`, symlinks on the way (and at its end) resolved
    /// inside the rootfs. Nothing is opened for reading.
    pub fn stat(&self, rel: &Path) -> Result<nix::sys::stat::FileStat, Errno> {
        self.lookup(rel).map(|(_, st)| st)
    }

    /// Whether directory `dir` (from [`Root::open_dir`]) has an entry
    /// `name` (a link is not followed: one `fstatat`).
    pub fn has_entry(dir: &OwnedFd, name: &str) -> bool {
        nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
    }

    /// The target of symlink `rel` (its directory resolved inside the
    /// rootfs; the link itself not followed). `EINVAL` when it is not a
    /// link.
    pub fn read_link(&self, rel: &Path) -> Result<PathBuf, Errno> {
        let name = rel.file_name().ok_or(Errno::EINVAL)?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let dir = self.open_dir(parent)?;
        nix::fcntl::readlinkat(dir.as_fd(), name).map(PathBuf::from)
    }

    /// The first `max` bytes of regular file `rel`. Anything else (a FIFO,
    /// which would block, a device node, whose open may act on a device)
    /// is refused before it is opened for reading: it is looked up as a
    /// path only, checked, and only a regular file is reopened to read.
    pub fn read_regular(&self, rel: &Path, max: usize) -> Result<Vec<u8>, Errno> {
        let (path, st) = self.lookup(rel)?;
        Self::read_looked_up(path, &st, max)
    }

    /// A path-only handle on `rel` (links resolved inside the rootfs) and
    /// its status.
    pub fn lookup(&self, rel: &Path) -> Result<(OwnedFd, nix::sys::stat::FileStat), Errno> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(IN_ROOT);
        let path = openat2(self.fd.as_fd(), rel, how)?;
        let st = nix::sys::stat::fstat(path.as_fd())?;
        Ok((path, st))
    }

    /// The first `max` bytes of what [`Root::lookup`] found, where `st`
    /// says it is a regular file: only then is it reopened to read.
    pub fn read_looked_up(
        path: OwnedFd,
        st: &nix::sys::stat::FileStat,
        max: usize,
    ) -> Result<Vec<u8>, Errno> {
        let file = Self::open_looked_up(&path, st)?;
        read_prefix(OwnedFd::from(file), max)
    }

    /// What [`Root::lookup`] found, opened to read, where `st` says it is
    /// a regular file (never a device or a FIFO).
    pub fn open_looked_up(
        path: &OwnedFd,
        st: &nix::sys::stat::FileStat,
    ) -> Result<std::fs::File, Errno> {
        if !is_regular(st) {
            return Err(Errno::EINVAL);
        }
        let reopen = OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY);
        let fd = openat2(
            nix::fcntl::AT_FDCWD,
            Path::new(&format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(path)
            )),
            reopen,
        )?;
        Ok(std::fs::File::from(fd))
    }

    /// Open directory `rel` (relative to the container's `/`), creating the
    /// missing parts with `mode`. Every prefix is resolved from the rootfs,
    /// so symlinks on the way are followed as the container would see them.
    pub fn mkdir_all(&self, rel: &Path, mode: u32) -> Result<OwnedFd, RootfsError> {
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => names.push(n),
                Component::RootDir | Component::CurDir => {}
                _ => {
                    return Err(RootfsError::BadPath {
                        path: rel.to_owned(),
                    });
                }
            }
        }
        let mut dir = self
            .open_dir(Path::new(""))
            .map_err(inside(Path::new(""), "open"))?;
        let mut prefix = PathBuf::new();
        for name in names {
            prefix.push(name);
            dir = match self.open_dir(&prefix) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    // `dir` is the resolved parent: create the one name in it.
                    match mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(mode)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(inside(&prefix, "mkdir")(e)),
                    }
                    self.open_dir(&prefix)
                        .map_err(inside(&prefix, "open after mkdir (a dangling symlink?)"))?
                }
                Err(e) => return Err(inside(&prefix, "open")(e)),
            };
        }
        Ok(dir)
    }

    /// Bind-mount host directory `source` read-only (and nosuid, nodev,
    /// noexec) at directory `rel` inside the rootfs, creating `rel` as
    /// [`Root::mkdir_all`] does. For the createContainer stage, which runs
    /// in the container's own mount namespace.
    ///
    /// `rel` is resolved once, to a handle, and the mount is attached to
    /// that handle with the new mount API: a detached copy of `source`
    /// (`open_tree`) is made read-only (`mount_setattr`) before it is
    /// attached (`move_mount`), so it is never visible writable, and
    /// nothing is looked up a second time for a swapped path to redirect
    /// (a remount through a second lookup once failed on a decoy
    /// and left the store mounted read-write). Returns the mount, for
    /// [`Mounted::undo`].
    pub fn bind_read_only(&self, source: &Path, rel: &Path) -> Result<Mounted, RootfsError> {
        let target = self.mkdir_all(rel, 0o755)?;
        let tree = mountapi::open_tree(source).map_err(inside(rel, "open_tree of the source"))?;
        mountapi::set_read_only(&tree).map_err(inside(rel, "make the mount read-only"))?;
        mountapi::move_mount(&tree, &target).map_err(inside(rel, "attach the mount"))?;
        Ok(Mounted {
            tree,
            rel: rel.to_owned(),
        })
    }

    /// Bind-mount the host directory open at `source` read-write (but
    /// nosuid and nodev) at directory `rel` inside the rootfs, as
    /// [`Root::bind_read_only`] does, from the handle: the source is not
    /// looked up by path again.
    pub fn bind_writable(&self, source: &OwnedFd, rel: &Path) -> Result<Mounted, RootfsError> {
        let target = self.mkdir_all(rel, 0o755)?;
        let tree =
            mountapi::open_tree_at(source).map_err(inside(rel, "open_tree of the source"))?;
        mountapi::set_attrs(&tree, mountapi::NOSUID_NODEV)
            .map_err(inside(rel, "make the mount nosuid,nodev"))?;
        mountapi::move_mount(&tree, &target).map_err(inside(rel, "attach the mount"))?;
        Ok(Mounted {
            tree,
            rel: rel.to_owned(),
        })
    }

    /// Replace file `rel` with `contents`: written to a temporary name in the
    /// same directory, then renamed over, so a reader sees the old file or
    /// the new one. A symlink at `rel` is replaced, never followed.
    ///
    /// The temporary file is created new (`O_EXCL`) under an unpredictable
    /// name, so nothing the image placed there beforehand is ever opened: at
    /// prestart the hook runs in the host's device cgroup, and a device node
    /// at a guessable name would have been written through to the host
    /// device. A name that exists is skipped for another.
    pub fn write_file(&self, rel: &Path, contents: &[u8], mode: u32) -> Result<(), RootfsError> {
        self.write_file_named(rel, contents, mode, &mut |_| random_suffix())
    }

    /// [`Root::write_file`] with the temporary names' suffixes from `suffix`
    /// (attempt number in), so a test can make names collide.
    fn write_file_named(
        &self,
        rel: &Path,
        contents: &[u8],
        mode: u32,
        suffix: &mut dyn FnMut(u32) -> String,
    ) -> Result<(), RootfsError> {
        let bad = || RootfsError::BadPath {
            path: rel.to_owned(),
        };
        let name = rel.file_name().ok_or_else(bad)?;
        let parent = rel.parent().ok_or_else(bad)?;
        let dir = self.mkdir_all(parent, 0o755)?;
        let how = OpenHow::new()
            .flags(
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
            )
            .mode(Mode::from_bits_truncate(mode))
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let mut attempt = 0;
        let (fd, tmp_name) = loop {
            let mut tmp_name = std::ffi::OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".gpuarch-{}", suffix(attempt)));
            match openat2(dir.as_fd(), Path::new(&tmp_name), how) {
                Ok(fd) => break (fd, tmp_name),
                Err(Errno::EEXIST) if attempt < 16 => attempt += 1,
                Err(e) => return Err(inside(rel, "create")(e)),
            }
        };
        // O_EXCL made it; a regular file is all it can be. Checked anyway,
        // before a byte is written.
        let st = nix::sys::stat::fstat(fd.as_fd()).map_err(inside(rel, "stat"))?;
        if !is_regular(&st) {
            return Err(inside(rel, "create (not a regular file)")(Errno::EEXIST));
        }
        let written = fchmod(fd.as_fd(), Mode::from_bits_truncate(mode))
            .map_err(inside(rel, "chmod"))
            .and_then(|()| {
                std::fs::File::from(fd).write_all(contents).map_err(|e| {
                    inside(rel, "write")(Errno::from_raw(
                        e.raw_os_error().unwrap_or(nix::libc::EIO),
                    ))
                })
            })
            .and_then(|()| {
                renameat(dir.as_fd(), Path::new(&tmp_name), dir.as_fd(), name)
                    .map_err(inside(rel, "rename"))
            });
        if written.is_err() {
            let _ = nix::unistd::unlinkat(
                dir.as_fd(),
                Path::new(&tmp_name),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        written
    }
}

/// A mount [`Root::bind_read_only`] made: its detached-then-attached tree.
#[derive(Debug)]
pub struct Mounted {
    tree: OwnedFd,
    rel: PathBuf,
}

impl Mounted {
    /// Take the mount down again (lazily, as `umount -l`), through its own
    /// handle: for a stage that fails after some of its mounts were made.
    pub fn undo(self) -> Result<(), RootfsError> {
        use std::os::fd::AsRawFd;
        let at = PathBuf::from(format!("/proc/self/fd/{}", self.tree.as_raw_fd()));
        nix::mount::umount2(&at, nix::mount::MntFlags::MNT_DETACH)
            .map_err(inside(&self.rel, "unmount"))
    }
}

/// The new mount API (Linux 5.12), which nix does not wrap yet.
mod mountapi {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::path::Path;

    use nix::errno::Errno;
    use nix::libc;

    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_NOEXEC: u64 = 0x8;

    /// `struct mount_attr` (linux/mount.h).
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }

    /// A detached recursive copy of the mount tree at `source`.
    pub fn open_tree(source: &Path) -> Result<OwnedFd, Errno> {
        let path =
            CString::new(source.as_os_str().as_encoded_bytes()).map_err(|_| Errno::EINVAL)?;
        let flags =
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
        // SAFETY: a valid NUL-terminated path and plain flags; the result
        // is a new fd or -1.
        let fd =
            unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: the kernel just returned this fd, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }

    /// A detached recursive copy of the mount tree at the directory handle
    /// `dir`.
    pub fn open_tree_at(dir: &OwnedFd) -> Result<OwnedFd, Errno> {
        let flags = OPEN_TREE_CLONE
            | libc::O_CLOEXEC as libc::c_uint
            | libc::AT_RECURSIVE as libc::c_uint
            | libc::AT_EMPTY_PATH as libc::c_uint;
        // SAFETY: a live fd, an empty NUL-terminated path and plain flags;
        // the result is a new fd or -1.
        let fd =
            unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), c"".as_ptr(), flags) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: the kernel just returned this fd, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }

    pub const NOSUID_NODEV: u64 = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;

    /// Read-only, nosuid, nodev and noexec, on every mount of the tree.
    pub fn set_read_only(tree: &OwnedFd) -> Result<(), Errno> {
        set_attrs(
            tree,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        )
    }

    /// Set mount attributes `set` on every mount of the tree.
    pub fn set_attrs(tree: &OwnedFd, set: u64) -> Result<(), Errno> {
        let attr = MountAttr {
            attr_set: set,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        let flags = (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint;
        // SAFETY: `tree` is a live fd, the empty path is NUL-terminated and
        // `attr` is a mount_attr of the size given.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                flags,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        if r < 0 { Err(Errno::last()) } else { Ok(()) }
    }

    /// Attach the detached `tree` onto the directory handle `target`.
    pub fn move_mount(tree: &OwnedFd, target: &OwnedFd) -> Result<(), Errno> {
        // SAFETY: two live fds and NUL-terminated empty paths.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                target.as_raw_fd(),
                c"".as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            )
        };
        if r < 0 { Err(Errno::last()) } else { Ok(()) }
    }
}

/// 64 unpredictable bits, as hex: std's hasher keys come from the OS's
/// random source once per process, and the clock and a counter make each
/// call differ.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    #[test]
    fn writes_inside_and_never_outside() {
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = tmp.path().join("rootfs");
        let host = tmp.path().join("host");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        // Absolute and relative escapes.
        symlink(&host, rootfs.join("run")).unwrap();
        symlink("../../host", rootfs.join("etc/profile.d")).unwrap();

        let root = Root::open(&rootfs).unwrap();
        // /run points at a path the rootfs lacks: refused, host untouched.
        let e = root
            .write_file(Path::new("run/gpuarch/env"), b"A=1\n", 0o644)
            .unwrap_err();
        assert!(e.to_string().contains("/run inside the container"), "{e}");
        assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0, "host touched");
        // Once the rootfs has that path, the link resolves to it.
        let inner = rootfs.join(host.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::create_dir_all(rootfs.join("host")).unwrap();
        root.write_file(Path::new("run/gpuarch/env"), b"A=1\n", 0o644)
            .unwrap();
        root.write_file(
            Path::new("/etc/profile.d/gpuarch.sh"),
            b"export A=1\n",
            0o644,
        )
        .unwrap();
        assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0, "host touched");
        let inner = inner.join("gpuarch/env");
        assert_eq!(std::fs::read(&inner).unwrap(), b"A=1\n");
        let meta = std::fs::metadata(&inner).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        // `../..` from /etc stops at the rootfs's `/`.
        assert_eq!(
            std::fs::read(rootfs.join("host/gpuarch.sh")).unwrap(),
            b"export A=1\n"
        );
    }

    #[test]
    fn a_symlinked_file_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = tmp.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("run/gpuarch")).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        symlink(&victim, rootfs.join("run/gpuarch/env")).unwrap();
        let root = Root::open(&rootfs).unwrap();
        root.write_file(Path::new("run/gpuarch/env"), b"A=1\n", 0o644)
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let env = rootfs.join("run/gpuarch/env");
        assert!(!env.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&env).unwrap(), b"A=1\n");
    }

    /// Whatever the image put at a temporary name (a FIFO, a socket, a
    /// device node) is skipped, never opened: the FIFO would block the
    /// hook and a device node would be written through to the host.
    #[test]
    fn things_at_temporary_names_are_never_opened() {
        use nix::sys::stat::{SFlag, mknod};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run/gpuarch");
        std::fs::create_dir_all(&dir).unwrap();
        let at = |n: u32| dir.join(format!(".env.gpuarch-taken{n}"));
        mknod(&at(0), SFlag::S_IFIFO, Mode::from_bits_truncate(0o666), 0).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(at(1)).unwrap();
        // A character device where root may make one (/dev/null's numbers:
        // harmless if written), else a second FIFO.
        let dev = mknod(
            &at(2),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        );
        if dev.is_err() {
            mknod(&at(2), SFlag::S_IFIFO, Mode::from_bits_truncate(0o666), 0).unwrap();
        }
        let root = Root::open(tmp.path()).unwrap();
        let mut tried = Vec::new();
        root.write_file_named(Path::new("run/gpuarch/env"), b"A=1\n", 0o644, &mut |n| {
            tried.push(n);
            format!("taken{n}")
        })
        .unwrap();
        assert_eq!(
            tried,
            [0, 1, 2, 3],
            "each taken name skipped, the fourth used"
        );
        assert_eq!(std::fs::read(dir.join("env")).unwrap(), b"A=1\n");
        for n in 0..3 {
            let t = std::fs::symlink_metadata(at(n)).unwrap().file_type();
            assert!(!t.is_file(), "{n} replaced by a file");
        }
        // Every name taken: an error, nothing written.
        let e = root
            .write_file_named(Path::new("run/gpuarch/env"), b"B=2\n", 0o644, &mut |_| {
                "taken0".into()
            })
            .unwrap_err();
        assert!(e.to_string().contains("File exists"), "{e}");
        assert_eq!(std::fs::read(dir.join("env")).unwrap(), b"A=1\n");
    }

    #[test]
    fn temporary_names_differ() {
        let a: std::collections::HashSet<String> = (0..1000).map(|_| random_suffix()).collect();
        assert_eq!(a.len(), 1000);
    }

    #[test]
    fn dotdot_and_missing_roots_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::open(tmp.path()).unwrap();
        assert!(matches!(
            root.write_file(Path::new("../x"), b"", 0o644),
            Err(RootfsError::BadPath { .. })
        ));
        let e = Root::open(&tmp.path().join("nope")).unwrap_err();
        assert!(
            e.to_string().contains("cannot open the container rootfs"),
            "{e}"
        );
    }
}
