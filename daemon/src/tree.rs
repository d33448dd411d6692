//! Sizing and removing a tree a container wrote (a JIT cache), by handle.
//!
//! Root walks what another uid controls, while that uid may be changing
//! it. So:
//! - every directory is opened relative to its parent's descriptor with
//!   `O_NOFOLLOW | O_DIRECTORY`: one swapped for a symlink (even with
//!   `RENAME_EXCHANGE` mid-walk) is never followed, only counted as itself;
//! - no path is ever built, so no depth is too deep (a tree deeper than
//!   `PATH_MAX` is counted and removed like any other);
//! - one descriptor is held at a time: the walk climbs back with `..` and
//!   checks it reached the very directory it came from (device, inode);
//!   a directory moved elsewhere meanwhile ends the walk with an error
//!   rather than letting it wander;
//! - a file with several names (hard links) counts once;
//! - another filesystem mounted inside is not entered.

use std::collections::HashSet;

use nix::libc;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid out buffer; fd is live.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

fn open_dir_at(dir: libc::c_int, name: &CStr, nofollow: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: a live dir fd (or AT_FDCWD) and a NUL-terminated name.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags) })?;
    // SAFETY: the kernel just gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open `path`'s directory for a walk: its last component is not followed
/// (the directories above it are root's).
fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    open_dir_at(libc::AT_FDCWD, &c, true)
}

/// One entry of a directory: its name and what `fstatat` (no follow) says.
struct Entry {
    name: CString,
    st: libc::stat,
}

/// Every entry of the directory at `fd` but `.` and `..`.
fn entries(fd: &OwnedFd) -> io::Result<Vec<Entry>> {
    // A fresh open file description, so reading it moves nobody's offset.
    let dup = open_dir_at(fd.as_raw_fd(), c".", false)?;
    // SAFETY: fdopendir takes ownership of a live directory fd.
    let dir = unsafe { libc::fdopendir(std::os::fd::IntoRawFd::into_raw_fd(dup)) };
    if dir.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: dir is a live DIR*; readdir's entry is valid until the
        // next call, and copied out before it.
        let ent = unsafe { libc::readdir(dir) };
        if ent.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        // SAFETY: zeroed stat buffer, live fd, NUL-terminated name.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = unsafe {
            libc::fstatat(
                fd.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r == 0 {
            out.push(Entry { name, st });
        }
    }
    // SAFETY: dir is live and closed once.
    unsafe { libc::closedir(dir) };
    Ok(out)
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// What the walk does at each step.
trait Visit {
    /// A non-directory entry of `dir`.
    fn file(&mut self, dir: &OwnedFd, e: &Entry) -> io::Result<()>;
    /// A directory entered (its own stat).
    fn enter(&mut self, st: &libc::stat);
    /// Subdirectory `name` of `dir`, walked through and left.
    fn left(&mut self, dir: &OwnedFd, name: &CStr) -> io::Result<()>;
}

/// A directory being walked (on the root's device: no other is entered).
struct Frame {
    ino: u64,
    /// The name it was entered by, in its parent (empty for the root).
    name: CString,
    pending: Vec<CString>,
}

/// The subdirectories of `cur`, after visiting every other entry.
fn subdirs(cur: &OwnedFd, v: &mut impl Visit) -> io::Result<Vec<CString>> {
    let mut dirs = Vec::new();
    for e in entries(cur)? {
        if is_dir(&e.st) {
            dirs.push(e.name);
        } else {
            v.file(cur, &e)?;
        }
    }
    Ok(dirs)
}

fn walk(root: OwnedFd, v: &mut impl Visit) -> io::Result<()> {
    let st = fstat(&root)?;
    let dev = st.st_dev;
    v.enter(&st);
    let pending = subdirs(&root, v)?;
    let mut cur = root;
    let mut stack = vec![Frame {
        ino: st.st_ino,
        name: CString::default(),
        pending,
    }];
    while let Some(top) = stack.last_mut() {
        if let Some(name) = top.pending.pop() {
            // Not followed if it became a link; skipped if gone.
            let Ok(fd) = open_dir_at(cur.as_raw_fd(), &name, true) else {
                continue;
            };
            let st = fstat(&fd)?;
            if st.st_dev != dev {
                continue;
            }
            v.enter(&st);
            let pending = subdirs(&fd, v)?;
            stack.push(Frame {
                ino: st.st_ino,
                name,
                pending,
            });
            cur = fd;
            continue;
        }
        let done = stack.pop().unwrap_or_else(|| unreachable!());
        let Some(parent) = stack.last() else { break };
        let up = open_dir_at(cur.as_raw_fd(), c"..", false)?;
        let st = fstat(&up)?;
        if (st.st_dev, st.st_ino) != (dev, parent.ino) {
            return Err(io::Error::other(
                "a directory was moved while it was walked",
            ));
        }
        cur = up;
        v.left(&cur, &done.name)?;
    }
    Ok(())
}

struct Size {
    total: u64,
    linked: HashSet<(u64, u64)>,
}

impl Visit for Size {
    fn file(&mut self, _: &OwnedFd, e: &Entry) -> io::Result<()> {
        if e.st.st_nlink > 1 && !self.linked.insert((e.st.st_dev, e.st.st_ino)) {
            return Ok(());
        }
        self.total = self.total.saturating_add(e.st.st_blocks as u64 * 512);
        Ok(())
    }
    fn enter(&mut self, st: &libc::stat) {
        self.total = self.total.saturating_add(st.st_blocks as u64 * 512);
    }
    fn left(&mut self, _: &OwnedFd, _: &CStr) -> io::Result<()> {
        Ok(())
    }
}

/// Bytes allocated to the directory `path` and everything in it, as the
/// module says; with the error that cut the walk short, if one did (the
/// bytes are then those counted until it).
pub fn size(path: &Path) -> (u64, Option<io::Error>) {
    let mut s = Size {
        total: 0,
        linked: HashSet::new(),
    };
    let r = open_root(path).and_then(|fd| walk(fd, &mut s));
    (s.total, r.err())
}

struct Remove;

impl Visit for Remove {
    fn file(&mut self, dir: &OwnedFd, e: &Entry) -> io::Result<()> {
        // SAFETY: live dir fd, NUL-terminated name.
        match cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), e.name.as_ptr(), 0) }) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }
    fn enter(&mut self, _: &libc::stat) {}
    fn left(&mut self, dir: &OwnedFd, name: &CStr) -> io::Result<()> {
        // SAFETY: live dir fd, NUL-terminated name.
        let r = unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
        match cvt(r) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ => Ok(()),
        }
    }
}

/// Remove the directory `path` and everything in it, as the module says
/// (a symlink is removed, never followed).
pub fn remove(path: &Path) -> io::Result<()> {
    walk(open_root(path)?, &mut Remove)?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    let parent = open_root(parent)?;
    let name = CString::new(path.file_name().unwrap_or_default().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    Remove.left(&parent, &name)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A chain of `depth` directories of 8-byte names under `top`, made by
    /// handle (the path is far past PATH_MAX), a file of `bytes` at the
    /// bottom.
    pub(crate) fn deep(top: &Path, depth: usize, bytes: usize) {
        std::fs::create_dir(top).unwrap();
        let mut cur = open_root(top).unwrap();
        for _ in 0..depth {
            // SAFETY: live fd and a NUL-terminated name.
            unsafe { libc::mkdirat(cur.as_raw_fd(), c"dddddddd".as_ptr(), 0o755) };
            cur = open_dir_at(cur.as_raw_fd(), c"dddddddd", true).unwrap();
        }
        // SAFETY: live fd and a NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                cur.as_raw_fd(),
                c"big".as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                0o644,
            )
        };
        // SAFETY: the fd was just opened.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        std::io::Write::write_all(&mut f, &vec![7u8; bytes]).unwrap();
    }

    #[test]
    fn a_tree_deeper_than_path_max_is_counted_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("c");
        deep(&top, 3000, 1 << 20);
        let (n, e) = size(&top);
        assert!(e.is_none(), "{e:?}");
        assert!(n >= 1 << 20, "{n}");
        remove(&top).unwrap();
        assert!(!top.exists());
    }

    #[test]
    fn hard_links_count_once_and_symlinks_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("c");
        std::fs::create_dir(&top).unwrap();
        std::fs::write(top.join("f"), vec![1u8; 1 << 20]).unwrap();
        let one = size(&top).0;
        for i in 0..500 {
            std::fs::hard_link(top.join("f"), top.join(format!("l{i}"))).unwrap();
        }
        let many = size(&top).0;
        // The directory grew by 500 names; the data is counted once.
        assert!(many < one + (256 << 10), "{one} -> {many}");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("precious"), vec![2u8; 4 << 20]).unwrap();
        symlink(&outside, top.join("link")).unwrap();
        assert!(size(&top).0 < many + 8192);
        // The root itself a link: refused, not followed.
        let l = tmp.path().join("l");
        symlink(&outside, &l).unwrap();
        assert!(size(&l).1.is_some());
        assert!(remove(&l).is_err());
        remove(&top).unwrap();
        assert!(!top.exists());
        assert!(outside.join("precious").exists());
    }
}
