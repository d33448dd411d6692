//! The two ways the image read sees an image's files (`Tree`): a rootfs
//! directory ([`Root`], the hook's and the shim's, resolved by the kernel
//! inside it), and the image's layer directories as a snapshotter keeps
//! them ([`Layers`], gpuarchd's on the NRI path, where no rootfs is
//! mounted yet), merged as overlayfs merges them.
//!
//! [`Layers`] resolves every path itself, one name at a time, with
//! `openat(O_NOFOLLOW)` and `fstatat(AT_SYMLINK_NOFOLLOW)` relative to a
//! handle inside one layer: the kernel never follows a link and never
//! takes `..`, so no name an image holds leads out of its layers. A link
//! is read and taken again from the merged view's `/` (absolute) or its
//! directory (relative), `..` lexically; at most [`MAX_LINKS`] of them.
//! A whiteout (a character device 0:0) hides what the layers below have
//! at its name; an opaque directory (`trusted.overlay.opaque` or, for a
//! rootless snapshotter, `user.overlay.opaque` set to `y`) hides the
//! directories below it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use super::{Budget, Stop};
use crate::rootfs::{Root, is_regular};

/// Most links followed in one path, as the kernel's own limit.
pub const MAX_LINKS: usize = 40;
/// Most layers of one image (Docker builds at most 127). Each layer costs
/// a descriptor for the image and one for each directory of the path
/// being walked: with 128, a walk holds under 400.
pub const MAX_LAYERS: usize = 128;

/// What the image read needs of an image's files. Paths are relative to
/// the image's `/` and already free of `..` (see `envs::rel_of`).
pub(crate) trait Tree {
    /// A directory, resolved, to look names up in and to list.
    type Dir;

    /// Another handle on the same files, for the reader's thread.
    fn try_clone(&self) -> std::io::Result<Self>
    where
        Self: Sized;
    /// Past `until`, fail every lookup (`ETIMEDOUT`): a tree whose each
    /// lookup is many system calls stops with the read's budget.
    fn until(&mut self, _until: Instant) {}
    /// The first error that was not the answer "no such entry" (a lookup
    /// past the deadline, no descriptor left): where there was one, what
    /// was not found may be there, and nothing is proven absent.
    fn trouble(&self) -> Option<Errno> {
        None
    }
    /// Directory `rel`, links followed.
    fn dir(&self, rel: &str) -> Result<Self::Dir, Errno>;
    /// Whether `dir` has an entry `name` (a link is not followed).
    fn has_entry(&self, dir: &Self::Dir, name: &str) -> bool;
    /// Each name in `dir` with its type as the filesystem gives it (a
    /// link is a link), under the budget.
    fn names(
        &self,
        dir: &Self::Dir,
        budget: &mut Budget,
        each: &mut dyn FnMut(&str, Option<Type>),
    ) -> Result<(), Stop>;
    /// What identifies `dir` and the version of its entries: device and
    /// inode, modification and change times, of each directory it is
    /// made of.
    fn identity(&self, dir: &Self::Dir) -> Vec<[i64; 6]>;
    /// The target of link `rel`; `EINVAL` when it is not a link.
    fn read_link(&self, rel: &str) -> Result<PathBuf, Errno>;
    /// The first `max` bytes of regular file `rel`, links followed.
    fn read_regular(&self, rel: &str, max: usize) -> Result<Vec<u8>, Errno>;
    /// Regular file `rel`, links followed, opened to read, and its size;
    /// `None` when it is anything else (never opened then: a FIFO would
    /// block, a device's open may act on it).
    fn open_regular(&self, rel: &str) -> Result<Option<(std::fs::File, u64)>, Errno>;
    /// [`Tree::read_regular`], and [`Tree::ident`] of the same `rel`;
    /// where both come from one lookup, one lookup.
    #[allow(clippy::type_complexity)]
    fn read_regular_seen(
        &self,
        rel: &str,
        max: usize,
    ) -> (Result<Vec<u8>, Errno>, Result<Vec<[i64; 5]>, Errno>) {
        (self.read_regular(rel, max), self.ident(rel))
    }
    /// Whether `rel`, links followed, is a directory.
    fn is_dir(&self, rel: &str) -> Result<bool, Errno>;
    /// What identifies `rel`, links followed, and the version of what it
    /// holds: inode, modification and change times (not the device, which
    /// an overlay mount makes anew for each container), of each layer's
    /// entry that shows.
    fn ident(&self, rel: &str) -> Result<Vec<[i64; 5]>, Errno>;
}

/// `identity` without its device.
pub(crate) fn without_dev(id: &[[i64; 6]]) -> Vec<[i64; 5]> {
    id.iter().map(|i| [i[1], i[2], i[3], i[4], i[5]]).collect()
}

fn identity_of(st: &FileStat) -> [i64; 6] {
    [
        st.st_dev as i64,
        st.st_ino as i64,
        st.st_mtime,
        st.st_mtime_nsec,
        st.st_ctime,
        st.st_ctime_nsec,
    ]
}

fn rel_path(rel: &str) -> &Path {
    if rel.is_empty() {
        Path::new(".")
    } else {
        Path::new(rel)
    }
}

/// Each name of directory `dir`, under the budget; with its type where
/// the filesystem gives one.
fn list(
    dir: BorrowedFd<'_>,
    budget: &mut Budget,
    mut each: impl FnMut(&str, Option<Type>),
) -> Result<(), Stop> {
    let Ok(fd) = nix::unistd::dup(dir) else {
        return Ok(());
    };
    let Ok(mut d) = nix::dir::Dir::from_fd(fd) else {
        return Ok(());
    };
    for e in d.iter() {
        let Ok(e) = e else { break };
        budget.take()?;
        if let Ok(name) = e.file_name().to_str()
            && name != "."
            && name != ".."
        {
            each(name, e.file_type());
        }
    }
    Ok(())
}

impl Tree for Root {
    type Dir = OwnedFd;

    fn try_clone(&self) -> std::io::Result<Self> {
        Root::try_clone(self)
    }

    fn dir(&self, rel: &str) -> Result<OwnedFd, Errno> {
        self.open_dir_read(rel_path(rel))
    }

    fn has_entry(&self, dir: &OwnedFd, name: &str) -> bool {
        Root::has_entry(dir, name)
    }

    fn names(
        &self,
        dir: &OwnedFd,
        budget: &mut Budget,
        each: &mut dyn FnMut(&str, Option<Type>),
    ) -> Result<(), Stop> {
        // overlayfs lists a whiteout where the directory comes from one
        // layer alone, though the name is not there to look up (an image
        // whose layer deletes what no layer below it holds): it is not
        // an entry, as it is not in the layers' own merge.
        list(dir.as_fd(), budget, |name, kind| {
            let gone = maybe_whiteout(kind)
                && match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => is_whiteout(&st),
                    Err(e) => e == Errno::ENOENT,
                };
            if !gone {
                each(name, kind);
            }
        })
    }

    fn identity(&self, dir: &OwnedFd) -> Vec<[i64; 6]> {
        fstat(dir.as_fd())
            .map(|st| vec![identity_of(&st)])
            .unwrap_or_default()
    }

    fn read_link(&self, rel: &str) -> Result<PathBuf, Errno> {
        Root::read_link(self, Path::new(rel))
    }

    fn read_regular(&self, rel: &str, max: usize) -> Result<Vec<u8>, Errno> {
        Root::read_regular(self, Path::new(rel), max)
    }

    fn open_regular(&self, rel: &str) -> Result<Option<(std::fs::File, u64)>, Errno> {
        let (path, st) = self.lookup(rel_path(rel))?;
        if !is_regular(&st) {
            return Ok(None);
        }
        let file = Root::open_looked_up(&path, &st)?;
        Ok(Some((file, size_of(&st))))
    }

    fn read_regular_seen(
        &self,
        rel: &str,
        max: usize,
    ) -> (Result<Vec<u8>, Errno>, Result<Vec<[i64; 5]>, Errno>) {
        match self.lookup(rel_path(rel)) {
            Ok((path, st)) => (
                Root::read_looked_up(path, &st, max),
                Ok(without_dev(&[identity_of(&st)])),
            ),
            Err(e) => (Err(e), Err(e)),
        }
    }

    fn is_dir(&self, rel: &str) -> Result<bool, Errno> {
        let st = self.stat(rel_path(rel))?;
        Ok(st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR)
    }

    fn ident(&self, rel: &str) -> Result<Vec<[i64; 5]>, Errno> {
        let st = self.stat(rel_path(rel))?;
        Ok(without_dev(&[identity_of(&st)]))
    }
}

/// An image as its layer directories, the top one first, merged as
/// overlayfs merges them.
#[derive(Debug)]
pub struct Layers {
    layers: Vec<OwnedFd>,
    until: Option<Instant>,
    trouble: std::cell::Cell<Option<Errno>>,
}

/// A directory of the merged view: the directory at its path in each
/// layer that shows through, the top one first.
#[derive(Debug)]
pub struct LayerDir {
    parts: Vec<OwnedFd>,
}

/// What a name of the merged view is.
enum Node {
    Dir(LayerDir),
    Link(PathBuf),
    /// Anything else: its directory in the layer that shows it, its name
    /// there, its status.
    Other(OwnedFd, String, FileStat),
}

/// The first `max` bytes of entry `name` of a layer's directory `parent`,
/// where `st` (its status, looked up) and the file opened say it is a
/// regular file.
fn read_other(parent: &OwnedFd, name: &str, st: &FileStat, max: usize) -> Result<Vec<u8>, Errno> {
    if !is_regular(st) {
        return Err(Errno::EINVAL);
    }
    crate::rootfs::read_prefix(open_other(parent, name)?, max)
}

/// Entry `name` of a layer's directory `parent`, opened to read where it
/// is still the regular file that was looked at.
fn open_other(parent: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    let fd = openat(
        parent.as_fd(),
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if !is_regular(&fstat(fd.as_fd())?) {
        return Err(Errno::EINVAL);
    }
    Ok(fd)
}

fn size_of(st: &FileStat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

fn is_whiteout(st: &FileStat) -> bool {
    st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFCHR && st.st_rdev == 0
}

/// Whether a name listed as `kind` may be a whiteout (a character device,
/// or a type the listing does not give).
fn maybe_whiteout(kind: Option<Type>) -> bool {
    matches!(kind, Some(Type::CharacterDevice) | None)
}

/// Whether entry `name` of directory `dir` is a whiteout.
fn is_whiteout_at(dir: BorrowedFd<'_>, name: &str) -> bool {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| is_whiteout(&st))
}

/// Whether directory `fd` is opaque (hides the same directory in the
/// layers below).
fn is_opaque(fd: &OwnedFd) -> bool {
    ["trusted.overlay.opaque\0", "user.overlay.opaque\0"]
        .iter()
        .any(|name| {
            let mut value = [0u8; 2];
            // SAFETY: `name` is NUL-terminated, `value` is a live buffer
            // of the length given, and `fd` is an open descriptor.
            let n = unsafe {
                nix::libc::fgetxattr(
                    fd.as_raw_fd(),
                    name.as_ptr().cast(),
                    value.as_mut_ptr().cast(),
                    value.len(),
                )
            };
            n == 1 && value[0] == b'y'
        })
}

/// The names of a path, without `.` and empty ones; `..` kept (taken
/// lexically by the walk).
fn components(path: &Path) -> impl Iterator<Item = String> + '_ {
    path.to_str()
        .unwrap_or("\0")
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
}

impl Layers {
    /// The layers at `dirs`, the top one first: host paths the runtime
    /// named (a snapshotter's directories), opened as they are.
    pub fn open(dirs: &[PathBuf]) -> std::io::Result<Self> {
        if dirs.is_empty() || dirs.len() > MAX_LAYERS {
            return Err(std::io::Error::other(format!(
                "{} layers (1 to {MAX_LAYERS} are read)",
                dirs.len()
            )));
        }
        let layers = dirs
            .iter()
            .map(|d| {
                openat(
                    nix::fcntl::AT_FDCWD,
                    d,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| std::io::Error::other(format!("{}: {e}", d.display())))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            layers,
            until: None,
            trouble: std::cell::Cell::new(None),
        })
    }

    /// Whether the read's deadline has passed.
    fn late(&self) -> bool {
        self.until.is_some_and(|t| Instant::now() > t)
    }

    /// `e`, kept where it is the first error that is not an answer.
    fn keep(&self, e: Errno) -> Errno {
        let answer = matches!(
            e,
            Errno::ENOENT | Errno::ENOTDIR | Errno::EINVAL | Errno::ELOOP | Errno::ENAMETOOLONG
        );
        if !answer && self.trouble.get().is_none() {
            self.trouble.set(Some(e));
        }
        e
    }

    fn top(&self) -> Result<LayerDir, Errno> {
        Ok(LayerDir {
            parts: self
                .layers
                .iter()
                .map(|l| l.try_clone().map_err(|_| Errno::EMFILE))
                .collect::<Result<_, _>>()?,
        })
    }

    /// `name` in merged directory `dir`.
    fn lookup(&self, dir: &LayerDir, name: &str) -> Result<Node, Errno> {
        self.lookup_in(dir, name).map_err(|e| self.keep(e))
    }

    fn lookup_in(&self, dir: &LayerDir, name: &str) -> Result<Node, Errno> {
        if self.late() {
            return Err(Errno::ETIMEDOUT);
        }
        let mut dirs = Vec::new();
        for part in &dir.parts {
            let st = match fstatat(part.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            let kind = st.st_mode & nix::libc::S_IFMT;
            if is_whiteout(&st) || (kind != nix::libc::S_IFDIR && !dirs.is_empty()) {
                // Hides this name in the layers below.
                break;
            }
            match kind {
                nix::libc::S_IFDIR => {
                    let d = openat(part.as_fd(), name, DIR_FLAGS, Mode::empty())?;
                    let opaque = is_opaque(&d);
                    dirs.push(d);
                    if opaque {
                        break;
                    }
                }
                nix::libc::S_IFLNK => {
                    let target = nix::fcntl::readlinkat(part.as_fd(), name)?;
                    return Ok(Node::Link(PathBuf::from(target)));
                }
                _ => {
                    let parent = part.try_clone().map_err(|_| Errno::EMFILE)?;
                    return Ok(Node::Other(parent, name.to_owned(), st));
                }
            }
        }
        if dirs.is_empty() {
            Err(Errno::ENOENT)
        } else {
            Ok(Node::Dir(LayerDir { parts: dirs }))
        }
    }

    /// What `rel` names in the merged view; its last link followed where
    /// `follow` says so.
    fn walk(&self, rel: &str, follow: bool) -> Result<Node, Errno> {
        let mut pending: std::collections::VecDeque<String> = components(Path::new(rel)).collect();
        let mut at: Vec<String> = Vec::new();
        let mut cur = self.top()?;
        let mut links = 0;
        while let Some(name) = pending.pop_front() {
            if name == ".." {
                at.pop();
                cur = self.reopen(&at)?;
                continue;
            }
            let last = pending.is_empty();
            match self.lookup(&cur, &name)? {
                Node::Dir(d) => {
                    cur = d;
                    at.push(name);
                }
                Node::Link(target) if !last || follow => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(Errno::ELOOP);
                    }
                    if target.is_absolute() {
                        at.clear();
                        cur = self.top()?;
                    }
                    for c in components(&target).collect::<Vec<_>>().into_iter().rev() {
                        pending.push_front(c);
                    }
                }
                node if last => return Ok(node),
                _ => return Err(Errno::ENOTDIR),
            }
        }
        Ok(Node::Dir(cur))
    }

    /// The merged directory at `at`, a path of directories already walked.
    fn reopen(&self, at: &[String]) -> Result<LayerDir, Errno> {
        let mut cur = self.top()?;
        for name in at {
            match self.lookup(&cur, name)? {
                Node::Dir(d) => cur = d,
                _ => return Err(Errno::ENOTDIR),
            }
        }
        Ok(cur)
    }
}

impl Tree for Layers {
    type Dir = LayerDir;

    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self {
            layers: self
                .layers
                .iter()
                .map(OwnedFd::try_clone)
                .collect::<Result<_, _>>()?,
            until: self.until,
            trouble: std::cell::Cell::new(None),
        })
    }

    fn until(&mut self, until: Instant) {
        self.until = Some(until);
    }

    fn trouble(&self) -> Option<Errno> {
        self.trouble.get()
    }

    fn dir(&self, rel: &str) -> Result<LayerDir, Errno> {
        match self.walk(rel, true)? {
            Node::Dir(d) => Ok(d),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn has_entry(&self, dir: &LayerDir, name: &str) -> bool {
        if self.late() {
            self.keep(Errno::ETIMEDOUT);
            return false;
        }
        for part in &dir.parts {
            match fstatat(part.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => return !is_whiteout(&st),
                Err(Errno::ENOENT) => {}
                Err(e) => {
                    self.keep(e);
                    return false;
                }
            }
        }
        false
    }

    fn names(
        &self,
        dir: &LayerDir,
        budget: &mut Budget,
        each: &mut dyn FnMut(&str, Option<Type>),
    ) -> Result<(), Stop> {
        // A name shows from the top layer that has it, as what it is
        // there, unless that one is a whiteout; one layer alone needs no
        // record of names seen.
        let mut seen = std::collections::HashSet::new();
        let many = dir.parts.len() > 1;
        for part in &dir.parts {
            list(part.as_fd(), budget, |name, kind| {
                if many && !seen.insert(name.to_owned()) {
                    return;
                }
                if maybe_whiteout(kind) && is_whiteout_at(part.as_fd(), name) {
                    return;
                }
                each(name, kind);
            })?;
        }
        Ok(())
    }

    fn identity(&self, dir: &LayerDir) -> Vec<[i64; 6]> {
        dir.parts
            .iter()
            .filter_map(|p| fstat(p.as_fd()).ok())
            .map(|st| identity_of(&st))
            .collect()
    }

    fn read_link(&self, rel: &str) -> Result<PathBuf, Errno> {
        match self.walk(rel, false)? {
            Node::Link(target) => Ok(target),
            _ => Err(Errno::EINVAL),
        }
    }

    fn read_regular(&self, rel: &str, max: usize) -> Result<Vec<u8>, Errno> {
        let Node::Other(parent, name, st) = self.walk(rel, true)? else {
            return Err(Errno::EINVAL);
        };
        read_other(&parent, &name, &st, max)
    }

    fn open_regular(&self, rel: &str) -> Result<Option<(std::fs::File, u64)>, Errno> {
        match self.walk(rel, true)? {
            Node::Other(parent, name, st) if is_regular(&st) => {
                let fd = open_other(&parent, &name)?;
                Ok(Some((std::fs::File::from(fd), size_of(&st))))
            }
            _ => Ok(None),
        }
    }

    fn read_regular_seen(
        &self,
        rel: &str,
        max: usize,
    ) -> (Result<Vec<u8>, Errno>, Result<Vec<[i64; 5]>, Errno>) {
        match self.walk(rel, true) {
            Err(e) => (Err(e), Err(e)),
            Ok(Node::Dir(d)) => (Err(Errno::EINVAL), Ok(without_dev(&self.identity(&d)))),
            Ok(Node::Link(_)) => (Err(Errno::EINVAL), Err(Errno::ELOOP)),
            Ok(Node::Other(parent, name, st)) => (
                read_other(&parent, &name, &st, max),
                Ok(without_dev(&[identity_of(&st)])),
            ),
        }
    }

    fn is_dir(&self, rel: &str) -> Result<bool, Errno> {
        Ok(matches!(self.walk(rel, true)?, Node::Dir(_)))
    }

    fn ident(&self, rel: &str) -> Result<Vec<[i64; 5]>, Errno> {
        match self.walk(rel, true)? {
            Node::Dir(d) => Ok(without_dev(&self.identity(&d))),
            Node::Other(_, _, st) => Ok(without_dev(&[identity_of(&st)])),
            Node::Link(_) => Err(Errno::ELOOP),
        }
    }
}
