//! What the discovery of an image's environments looked at ([`Probing`]),
//! so that a later start can tell, with a `stat` for each, that nothing it
//! depended on changed, and take what it found without listing a
//! directory (no `getdents`, whose cost an image chooses).
//!
//! Every answer discovery gets comes from a path's directory or file: a
//! directory listed or looked in (its entries change its modification
//! time), a file read (`pyvenv.cfg`, `/etc/passwd`), a link read (its
//! directory's times change when it is replaced), a path found absent.
//! Each is recorded with what identifies it then (inode and times, or
//! the error), and compared again with [`Probe::holds`].

use std::cell::RefCell;
use std::path::PathBuf;

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::envs::parent;
use super::tree::{Tree, without_dev};
use super::{Budget, Stop};

/// One path discovery looked at, and what identified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub rel: String,
    /// Inode and times of each layer's entry; else the error's number.
    pub seen: Result<Vec<[i64; 5]>, i32>,
}

impl Probe {
    fn of<T: Tree>(tree: &T, rel: &str) -> Self {
        Self {
            rel: rel.to_owned(),
            seen: tree.ident(rel).map_err(|e| e as i32),
        }
    }

    /// Whether `tree` still shows `rel` as it was seen.
    pub fn holds<T: Tree>(&self, tree: &T) -> bool {
        Self::of(tree, &self.rel) == *self
    }
}

/// `T`, recording each path the calls depend on.
pub struct Probing<'a, T: Tree> {
    pub inner: &'a T,
    pub probes: RefCell<Vec<Probe>>,
}

impl<'a, T: Tree> Probing<'a, T> {
    pub fn new(inner: &'a T) -> Self {
        Self {
            inner,
            probes: RefCell::new(Vec::new()),
        }
    }

    fn record(&self, rel: &str) {
        if !self.recorded(rel) {
            let probe = Probe::of(self.inner, rel);
            self.probes.borrow_mut().push(probe);
        }
    }

    fn recorded(&self, rel: &str) -> bool {
        self.probes.borrow().iter().any(|q| q.rel == rel)
    }

    /// Record `rel` as `seen`, already known: a lookup saved.
    fn record_seen(&self, rel: &str, seen: Result<Vec<[i64; 5]>, i32>) {
        if !self.recorded(rel) {
            self.probes.borrow_mut().push(Probe {
                rel: rel.to_owned(),
                seen,
            });
        }
    }
}

impl<T: Tree> Tree for Probing<'_, T> {
    type Dir = T::Dir;

    fn try_clone(&self) -> std::io::Result<Self> {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }

    fn dir(&self, rel: &str) -> Result<T::Dir, Errno> {
        // What identifies a directory is that of the handle opened on it,
        // and a name not there is not there for `ident` either: recorded
        // from the lookup itself. Any other failure (`ENOTDIR`: `ident`
        // would find the file) is looked up again as `ident` sees it.
        let got = self.inner.dir(rel);
        match &got {
            Ok(d) => match self.inner.identity(d) {
                id if !id.is_empty() => self.record_seen(rel, Ok(without_dev(&id))),
                _ => self.record(rel),
            },
            Err(Errno::ENOENT) => self.record_seen(rel, Err(Errno::ENOENT as i32)),
            Err(_) => self.record(rel),
        }
        got
    }

    fn has_entry(&self, dir: &T::Dir, name: &str) -> bool {
        // Its directory was recorded when it was opened.
        self.inner.has_entry(dir, name)
    }

    fn names(
        &self,
        dir: &T::Dir,
        budget: &mut Budget,
        each: &mut dyn FnMut(&str, Option<nix::dir::Type>),
    ) -> Result<(), Stop> {
        self.inner.names(dir, budget, each)
    }

    fn identity(&self, dir: &T::Dir) -> Vec<[i64; 6]> {
        self.inner.identity(dir)
    }

    fn read_link(&self, rel: &str) -> Result<PathBuf, Errno> {
        self.record(parent(rel));
        self.record(rel);
        self.inner.read_link(rel)
    }

    fn read_regular(&self, rel: &str, max: usize) -> Result<Vec<u8>, Errno> {
        let (read, seen) = self.inner.read_regular_seen(rel, max);
        self.record_seen(rel, seen.map_err(|e| e as i32));
        read
    }

    fn open_regular(&self, rel: &str) -> Result<Option<(std::fs::File, u64)>, Errno> {
        self.record(rel);
        self.inner.open_regular(rel)
    }

    fn is_dir(&self, rel: &str) -> Result<bool, Errno> {
        self.record(rel);
        self.inner.is_dir(rel)
    }

    fn ident(&self, rel: &str) -> Result<Vec<[i64; 5]>, Errno> {
        self.inner.ident(rel)
    }
}
