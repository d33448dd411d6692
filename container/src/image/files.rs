//! An image's files for a reader off a start's path (the image audit):
//! a rootfs ([`Root`], the hook's) or a snapshot's layers ([`Layers`],
//! gpuarchd's on the NRI path), each resolved inside the image exactly as
//! the image read resolves it. A link in the image never leads out of it,
//! and nothing but a regular file is opened.

use std::time::Duration;

use gpuarch_core::oci::ContainerView;
use nix::dir::Type;
use nix::errno::Errno;

use super::tree::Tree;
use super::{Budget, MAX_ENTRIES, Stop, envs, read_within};
use crate::rootfs::Root;

/// An image's files: its rootfs or its layers.
#[derive(Clone, Copy, Debug)]
pub enum Files<'a> {
    Root(&'a Root),
    Layers(&'a super::Layers),
}

/// Run `$body` with `$t` bound to the tree, whichever it is.
macro_rules! with_tree {
    ($files:expr, $t:ident => $body:expr) => {
        match $files {
            Files::Root($t) => $body,
            Files::Layers($t) => $body,
        }
    };
}

impl Files<'_> {
    /// The site directories (paths inside the image, without the leading
    /// `/`) of the image's Python environments for the process of
    /// `view`, found as the image read finds them, and what was not
    /// read; with a reader's own bounds. Err: a bound was reached.
    pub fn sites(
        &self,
        view: &ContainerView,
        max: usize,
        deadline: Duration,
    ) -> Result<(Vec<String>, Vec<String>), Stop> {
        let mut budget = Budget::new(max, deadline);
        with_tree!(*self, t => {
            let found = envs::discover(t, view, &mut budget)?;
            Ok((
                found.sites.into_iter().map(|s| s.rel).collect(),
                found.unread,
            ))
        })
    }

    /// The image read's key of this image for the process of `view`
    /// (what identifies its environments), read anew with bounds that are
    /// not a start's: the image audit checks with it that what it opened
    /// is the image a start read.
    pub fn identify(&self, view: &ContainerView) -> Option<String> {
        let (deadline, wait) = (Duration::from_secs(10), Duration::from_secs(12));
        with_tree!(*self, t => read_within(t, view, None, MAX_ENTRIES, deadline, wait))
            .0
            .image_key
    }

    /// The names in directory `rel`, links followed to it, sorted, with
    /// their types (a link is a link); at most `max` entries read.
    pub fn list(&self, rel: &str, max: usize) -> Result<Vec<(String, Option<Type>)>, Errno> {
        let mut names = Vec::new();
        let mut budget = Budget::new(max, Duration::from_secs(3600));
        let listed = with_tree!(*self, t => {
            let dir = t.dir(rel)?;
            t.names(&dir, &mut budget, &mut |n, ty| names.push((n.to_owned(), ty)))
        });
        // Past `max` entries, the names read are what is listed.
        let _: Result<(), Stop> = listed;
        names.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(names)
    }

    /// The first `max` bytes of regular file `rel`, links followed.
    pub fn read_regular(&self, rel: &str, max: usize) -> Result<Vec<u8>, Errno> {
        with_tree!(*self, t => Tree::read_regular(t, rel, max))
    }

    /// Regular file `rel`, links followed, opened to read, and its size;
    /// `None` when it is anything else, which is not opened.
    pub fn open_regular(&self, rel: &str) -> Result<Option<(std::fs::File, u64)>, Errno> {
        with_tree!(*self, t => Tree::open_regular(t, rel))
    }
}
