//! CRI-O's images, read where containers/storage keeps them. At NRI's
//! CreateContainer, CRI-O has made the container's storage under the
//! container's own id (its writable layer on the image's top layer) and
//! mounted it. gpuarchd reads the image's layers, not that mount (which
//! the annotation `io.kubernetes.cri-o.MountPoint` names): a layer
//! directory is the same for every container of the image, so a read is
//! kept per image, as under containerd; the mount is a new directory per
//! container, in CRI-O's mount namespace. gpuarchd looks the id up
//! in the store's container list, which only the runtime writes, and takes
//! the layers from the overlay driver's records of the container's layer:
//!
//! - `<root>/overlay-containers/containers.json` (and the
//!   `volatile-containers.json` of a transient store, in the runroot):
//!   the container's `layer`;
//! - `<root>/overlay/<layer>/lower`: the layers below it, top first, as
//!   `l/<link>` names separated by `:`;
//! - `<root>/overlay/l/<link>`: a symlink to `../<layer id>/diff`, the
//!   layer's directory, which gpuarchd rebuilds from the id it checked
//!   rather than follow.
//!
//! A link not in `<root>/overlay/l` is looked for in each additional image
//! store (`nri.storage_image_stores`), as containers/storage looks, and the
//! layer's directory is then that store's.
//!
//! The vfs driver keeps a whole copy per layer, each its parent's with
//! its own changes made: the image's top layer (the parent of the
//! container's, in `<root>/vfs-layers/layers.json`) is the whole image,
//! the same directory for every container of it. A container's layer
//! without a parent recorded is read from its own copy, a new directory
//! per container.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use gpuarch_container::context::ReadError;
use gpuarch_core::config::STORAGE_DRIVERS;
use serde::Deserialize;

/// Longest container list read (about 64,000 containers).
pub const MAX_LIST: u64 = 64 << 20;
/// Longest `lower` file read: containers/storage's 500 layers of
/// `l/` + 26 characters + `:` take 14,500 bytes.
const MAX_LOWER: u64 = 64 << 10;
/// containers/storage's own limit on lower layers.
const MAX_LOWERS: usize = 500;

/// Why a container's layers cannot be taken from containers/storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{0:?} (nri.storage_root, nri.storage_image_stores) is not an absolute path")]
    Relative(PathBuf),
    #[error("no containers/storage at {} (CRI-O's root: nri.storage_root, else crio.conf's root, else storage.conf's graphroot): no overlay-containers or vfs-containers in it", .0.display())]
    NoStore(PathBuf),
    #[error("no container {id:.80?} in containers/storage at {} (CRI-O's root)", .root.display())]
    NoContainer { id: String, root: PathBuf },
    #[error("{}: {error}", .path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: over {} bytes", .path.display(), .limit)]
    TooLong { path: PathBuf, limit: u64 },
    #[error("{}: not a containers/storage list: {error}", .path.display())]
    List {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("the layer id {0:.80?} is not one containers/storage makes")]
    LayerId(String),
    #[error("{}: {entry:.80?} is not a layer link (l/NAME)", .path.display())]
    Lower { path: PathBuf, entry: String },
    #[error("{}: over {MAX_LOWERS} layers", .0.display())]
    TooManyLayers(PathBuf),
    #[error("the container's layer has no image layers below it ({} is missing)", .0.display())]
    NoLower(PathBuf),
    #[error("{} is missing, and in no additional image store (nri.storage_image_stores, storage.conf's additionalimagestores, crio.conf's storage_option): the layer is in a store gpuarchd is not told of", .0.display())]
    NoLink(PathBuf),
    #[error("{}: links to {target:.200?}, not to ../<layer>/diff", .link.display())]
    LinkTarget { link: PathBuf, target: String },
}

/// An entry of containers/storage's lists: a container's (its `layer`) or
/// a layer's (its `parent`). The rest is skipped unread, and nothing is
/// copied but for the entry looked for.
#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(default)]
    layer: Option<Cow<'a, str>>,
    #[serde(default)]
    parent: Option<Cow<'a, str>>,
}

/// What an entry names: its layer, or its parent.
#[derive(Clone, Copy)]
enum Field {
    Layer,
    Parent,
}

impl Entry<'_> {
    fn get(self, field: Field) -> Option<String> {
        match field {
            Field::Layer => self.layer,
            Field::Parent => self.parent,
        }
        .map(Cow::into_owned)
    }
}

/// CRI-O's containers/storage: its root, runroot and additional image
/// stores.
#[derive(Debug, Clone)]
pub struct Storage {
    root: PathBuf,
    runroot: PathBuf,
    image_stores: Vec<PathBuf>,
}

impl Storage {
    pub fn new(root: &Path, runroot: &Path, image_stores: &[PathBuf]) -> Self {
        Self {
            root: root.to_owned(),
            runroot: runroot.to_owned(),
            image_stores: image_stores.to_vec(),
        }
    }

    /// The root, then each additional image store, as containers/storage
    /// looks a layer up.
    fn stores(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.root).chain(&self.image_stores)
    }

    /// `field` of entry `id` in the first of the store's lists `kind`
    /// (`overlay-containers`, `vfs-layers`) that names it: the root's
    /// `<name>.json` and `volatile-<name>.json`, and a transient store's
    /// `volatile-<name>.json` in the runroot.
    fn find_in(
        &self,
        kind: &str,
        name: &str,
        id: &str,
        field: Field,
    ) -> Result<Option<Option<String>>, StorageError> {
        let lists = [
            self.root.join(kind).join(format!("{name}.json")),
            self.root.join(kind).join(format!("volatile-{name}.json")),
            self.runroot
                .join(kind)
                .join(format!("volatile-{name}.json")),
        ];
        for list in &lists {
            if let Some(found) = find(list, id, field)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The layer directories of container `id`'s image, the top one first.
    pub fn layers(&self, id: &str) -> Result<Vec<PathBuf>, StorageError> {
        if let Some(p) = self.stores().find(|p| !p.is_absolute()) {
            return Err(StorageError::Relative(p.clone()));
        }
        let mut stores = 0;
        for driver in STORAGE_DRIVERS {
            let kind = format!("{driver}-containers");
            if !self.root.join(&kind).is_dir() {
                continue;
            }
            stores += 1;
            if let Some(layer) = self.find_in(&kind, "containers", id, Field::Layer)? {
                let layer = layer.unwrap_or_default();
                if !is_id(&layer) {
                    return Err(StorageError::LayerId(layer));
                }
                return match driver {
                    "overlay" => self.overlay_lowers(&layer),
                    _ => self.vfs_image(&layer),
                };
            }
        }
        if stores == 0 {
            return Err(StorageError::NoStore(self.root.clone()));
        }
        Err(StorageError::NoContainer {
            id: id.to_owned(),
            root: self.root.clone(),
        })
    }

    /// The vfs driver's whole image under container layer `layer`: its
    /// parent's copy, in the root or an additional image store; the
    /// container's own where no parent is recorded.
    fn vfs_image(&self, layer: &str) -> Result<Vec<PathBuf>, StorageError> {
        let parent = self.find_in("vfs-layers", "layers", layer, Field::Parent)?;
        if let Some(p) = parent.flatten().filter(|p| !p.is_empty()) {
            if !is_id(&p) {
                return Err(StorageError::LayerId(p));
            }
            if let Some(dir) = self
                .stores()
                .map(|s| s.join("vfs/dir").join(&p))
                .find(|d| d.is_dir())
            {
                return Ok(vec![dir]);
            }
        }
        Ok(vec![self.root.join("vfs/dir").join(layer)])
    }

    /// The overlay driver's lower layers of `layer`, top first.
    fn overlay_lowers(&self, layer: &str) -> Result<Vec<PathBuf>, StorageError> {
        let home = self.root.join("overlay");
        let path = home.join(layer).join("lower");
        let text = match read_bounded(&path, MAX_LOWER) {
            Ok(t) => t,
            Err(StorageError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(StorageError::NoLower(path));
            }
            Err(e) => return Err(e),
        };
        let text = String::from_utf8_lossy(&text);
        let names: Vec<&str> = text.trim_end_matches('\n').split(':').collect();
        if names.len() > MAX_LOWERS {
            return Err(StorageError::TooManyLayers(path));
        }
        names
            .iter()
            .map(|entry| {
                let link = entry
                    .strip_prefix("l/")
                    .filter(|n| is_link_name(n))
                    .ok_or_else(|| StorageError::Lower {
                        path: path.clone(),
                        entry: (*entry).to_owned(),
                    })?;
                // The root's own links first, then each image store's.
                for h in self.stores().map(|s| s.join("overlay")) {
                    let at = h.join("l").join(link);
                    let target = match std::fs::read_link(&at) {
                        Ok(t) => t.to_string_lossy().into_owned(),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(error) => return Err(StorageError::Io { path: at, error }),
                    };
                    return match target
                        .strip_prefix("../")
                        .and_then(|t| t.strip_suffix("/diff"))
                    {
                        Some(id) if is_id(id) => Ok(h.join(id).join("diff")),
                        _ => Err(StorageError::LinkTarget { link: at, target }),
                    };
                }
                Err(StorageError::NoLink(home.join("l").join(link)))
            })
            .collect()
    }
}

/// `field` of entry `id` in the list at `path` (`Some(None)` where the
/// entry has none); `None` where the list is missing or does not name it.
fn find(path: &Path, id: &str, field: Field) -> Result<Option<Option<String>>, StorageError> {
    let bytes = match read_bounded(path, MAX_LIST) {
        Ok(b) => b,
        Err(StorageError::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // A store that never held a container may keep an empty file.
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    // The list is searched before it is parsed: a node's list holds every
    // container it has not removed, and parsing it whole costs about a
    // microsecond per container. An id JSON writes as it is (CRI-O's are
    // hex) that is not in the text as a string is in no entry; one that
    // begins an object as containers/storage writes them (`{"id":"…"`,
    // the id first: Go's encoder keeps the struct's order) is that entry.
    // Anything else is parsed whole.
    if is_id(id) {
        let start = format!("{{\"id\":\"{id}\"");
        if let Some(at) = memchr::memmem::find(&bytes, start.as_bytes()) {
            let mut one = serde_json::Deserializer::from_slice(&bytes[at..]);
            if let Ok(e) = Entry::deserialize(&mut one)
                && e.id == id
            {
                return Ok(Some(e.get(field)));
            }
        } else if memchr::memmem::find(&bytes, &start.as_bytes()[6..]).is_none() {
            return Ok(None);
        }
    }
    let list: Vec<Entry> = serde_json::from_slice(&bytes).map_err(|error| StorageError::List {
        path: path.to_owned(),
        error,
    })?;
    Ok(list.into_iter().find(|e| e.id == id).map(|e| e.get(field)))
}

/// The file at `path`, refused past `limit` bytes.
fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, StorageError> {
    let io = |error| StorageError::Io {
        path: path.to_owned(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    gpuarch_container::read_file_at_most(file, limit).map_err(|e| match e {
        ReadError::Io(error) => io(error),
        ReadError::TooLarge(limit) => StorageError::TooLong {
            path: path.to_owned(),
            limit,
        },
    })
}

/// A layer id as containers/storage makes them (64 hex digits, the
/// image's chain ids and random ones alike), or any name of letters,
/// digits, `_`, `.` and `-` that starts with a letter or digit: never a
/// path of more than one component, `.` or `..`.
fn is_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A link's name under `l/`: 26 base-32 characters as containers/storage
/// makes them; any of letters and digits is taken.
fn is_link_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A store as containers/storage's overlay driver lays it out: the
    /// container `c1` on a two-layer image.
    fn store(root: &Path) -> [PathBuf; 2] {
        let home = root.join("overlay");
        std::fs::create_dir_all(home.join("l")).unwrap();
        let base = "a".repeat(64);
        let top = "b".repeat(64);
        let rw = "c".repeat(64);
        for (id, link) in [(&base, "BASE"), (&top, "TOP"), (&rw, "RW")] {
            std::fs::create_dir_all(home.join(id).join("diff")).unwrap();
            std::os::unix::fs::symlink(format!("../{id}/diff"), home.join("l").join(link)).unwrap();
        }
        std::fs::write(home.join(&top).join("lower"), "l/BASE").unwrap();
        std::fs::write(home.join(&rw).join("lower"), "l/TOP:l/BASE").unwrap();
        std::fs::create_dir_all(root.join("overlay-containers")).unwrap();
        std::fs::write(
            root.join("overlay-containers/containers.json"),
            format!(r#"[{{"id":"other","layer":"{base}"}},{{"id":"c1","names":["x"],"image":"i","layer":"{rw}","flags":{{}}}}]"#),
        )
        .unwrap();
        [home.join(&top).join("diff"), home.join(&base).join("diff")]
    }

    #[test]
    fn a_containers_layers_are_its_layer_lowers_top_first() {
        let dir = tempfile::tempdir().unwrap();
        let want = store(dir.path());
        let s = Storage::new(dir.path(), &dir.path().join("run"), &[]);
        assert_eq!(s.layers("c1").unwrap(), want);
        let e = s.layers("c2").unwrap_err().to_string();
        assert!(
            e.starts_with("no container \"c2\" in containers/storage at "),
            "{e}"
        );
        // A transient store keeps its containers in the runroot.
        let run = dir.path().join("run/overlay-containers");
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(
            run.join("volatile-containers.json"),
            format!(r#"[{{"id":"c2","layer":"{}"}}]"#, "c".repeat(64)),
        )
        .unwrap();
        assert_eq!(s.layers("c2").unwrap(), want);
        // However the list is written: the id not first, spaces and
        // newlines, the id only inside another entry's string.
        let list = dir.path().join("overlay-containers/containers.json");
        let rw = "c".repeat(64);
        for text in [
            format!(r#"[{{"names":["c1"],"layer":"{rw}","id":"c1"}}]"#),
            format!("[\n  {{\n    \"id\": \"c1\",\n    \"layer\": \"{rw}\"\n  }}\n]\n"),
            format!(
                r#"[{{"id":"x","layer":"0","metadata":"{{\"id\":\"c1\",\"layer\":\"1\"}}"}},{{"id":"c1","layer":"{rw}"}}]"#
            ),
        ] {
            std::fs::write(&list, &text).unwrap();
            assert_eq!(s.layers("c1").unwrap(), want, "{text}");
        }
        std::fs::write(
            &list,
            r#"[{"id":"x","layer":"0","metadata":"{\"id\":\"c3\"}"}]"#,
        )
        .unwrap();
        assert!(
            s.layers("c3")
                .unwrap_err()
                .to_string()
                .starts_with("no container")
        );
        let none = Storage::new(&dir.path().join("absent"), dir.path(), &[]);
        let e = none.layers("c1").unwrap_err().to_string();
        assert!(e.contains("no overlay-containers or vfs-containers"), "{e}");
        let e = Storage::new(Path::new("rel"), dir.path(), &[]).layers("c1");
        assert!(e.unwrap_err().to_string().contains("not an absolute path"));
    }

    /// The vfs driver: the image's top layer, the container layer's
    /// parent, is the whole image, in the root or an image store; the
    /// container's own copy where no parent is recorded.
    #[test]
    fn under_vfs_the_image_is_its_top_layers_copy() {
        let vfs = tempfile::tempdir().unwrap();
        let root = vfs.path();
        let ro = tempfile::tempdir().unwrap();
        for d in ["vfs-containers", "vfs-layers", "vfs/dir/top", "vfs/dir/rw"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::create_dir_all(ro.path().join("vfs/dir/ro-top")).unwrap();
        std::fs::write(
            root.join("vfs-containers/containers.json"),
            r#"[{"id":"v","layer":"rw"},{"id":"w","layer":"rw2"},{"id":"x","layer":"rw3"},{"id":"y","layer":"rw4"}]"#,
        )
        .unwrap();
        let layers = root.join("vfs-layers/layers.json");
        std::fs::write(
            &layers,
            r#"[{"id":"top"},{"id":"rw","parent":"top"},{"id":"rw2"},{"id":"rw3","parent":"ro-top"}]"#,
        )
        .unwrap();
        let s = Storage::new(root, root, &[ro.path().to_owned()]);
        assert_eq!(s.layers("v").unwrap(), [root.join("vfs/dir/top")]);
        // No parent, or no entry: the container's own copy.
        assert_eq!(s.layers("w").unwrap(), [root.join("vfs/dir/rw2")]);
        assert_eq!(s.layers("y").unwrap(), [root.join("vfs/dir/rw4")]);
        // The parent in an image store; in no store, the container's copy.
        assert_eq!(s.layers("x").unwrap(), [ro.path().join("vfs/dir/ro-top")]);
        let unnamed = Storage::new(root, root, &[]);
        assert_eq!(unnamed.layers("x").unwrap(), [root.join("vfs/dir/rw3")]);
        // A transient store keeps its layers in the runroot.
        let run = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(run.path().join("vfs-layers")).unwrap();
        std::fs::write(
            run.path().join("vfs-layers/volatile-layers.json"),
            r#"[{"id":"rw4","parent":"top"}]"#,
        )
        .unwrap();
        let s = Storage::new(root, run.path(), &[]);
        assert_eq!(s.layers("y").unwrap(), [root.join("vfs/dir/top")]);
        // A parent that is a path is refused.
        for parent in ["..", "../../etc", "a/b", "/etc"] {
            let text = format!(r#"[{{"id":"rw","parent":{parent:?}}}]"#);
            std::fs::write(&layers, text).unwrap();
            let e = s.layers("v").unwrap_err().to_string();
            assert!(
                e.contains("is not one containers/storage makes"),
                "{parent}: {e}"
            );
        }
    }

    /// A layer an additional image store keeps: its link and directory are
    /// that store's, found when the store is named, said when it is not.
    #[test]
    fn a_layer_of_an_additional_image_store_is_read_from_that_store() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path());
        let other = tempfile::tempdir().unwrap();
        let home = other.path().join("overlay");
        let id = "d".repeat(64);
        std::fs::create_dir_all(home.join(&id).join("diff")).unwrap();
        std::fs::create_dir_all(home.join("l")).unwrap();
        std::os::unix::fs::symlink(format!("../{id}/diff"), home.join("l/RO")).unwrap();
        let rw = dir.path().join("overlay").join("c".repeat(64));
        std::fs::write(rw.join("lower"), "l/TOP:l/RO").unwrap();
        let named = Storage::new(dir.path(), dir.path(), &[other.path().to_owned()]);
        assert_eq!(
            named.layers("c1").unwrap(),
            [
                dir.path().join("overlay").join("b".repeat(64)).join("diff"),
                home.join(&id).join("diff"),
            ]
        );
        let e = Storage::new(dir.path(), dir.path(), &[])
            .layers("c1")
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("in no additional image store (nri.storage_image_stores"),
            "{e}"
        );
        let e = Storage::new(dir.path(), dir.path(), &[PathBuf::from("ro")]).layers("c1");
        assert!(e.unwrap_err().to_string().contains(
            "\"ro\" (nri.storage_root, nri.storage_image_stores) is not an absolute path"
        ));
        // A store's link that leads elsewhere is refused as the root's is.
        std::fs::remove_file(home.join("l/RO")).unwrap();
        std::os::unix::fs::symlink("/etc", home.join("l/RO")).unwrap();
        let e = named.layers("c1").unwrap_err().to_string();
        assert!(e.contains("not to ../<layer>/diff"), "{e}");
    }

    /// What the store says is never a path out of it: a layer id with a
    /// slash or `..`, a lower entry that is not `l/NAME`, a link that
    /// leads elsewhere; and a list or lower file past its bound is
    /// refused, not read whole.
    #[test]
    fn a_store_that_names_paths_out_of_itself_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path());
        let s = Storage::new(dir.path(), dir.path(), &[]);
        let list = dir.path().join("overlay-containers/containers.json");
        let home = dir.path().join("overlay");
        let rw = home.join("c".repeat(64));
        for (layer, why) in [
            ("../../etc", "is not one containers/storage makes"),
            ("..", "is not one containers/storage makes"),
            ("a/b", "is not one containers/storage makes"),
            ("", "is not one containers/storage makes"),
        ] {
            std::fs::write(&list, format!(r#"[{{"id":"c1","layer":"{layer}"}}]"#)).unwrap();
            let e = s.layers("c1").unwrap_err().to_string();
            assert!(e.contains(why), "{layer}: {e}");
        }
        std::fs::write(
            &list,
            format!(r#"[{{"id":"c1","layer":"{}"}}]"#, "c".repeat(64)),
        )
        .unwrap();
        for (lower, why) in [
            ("/etc", "is not a layer link"),
            ("l/../../etc", "is not a layer link"),
            ("l/TOP:../x", "is not a layer link"),
            ("l/GONE", "in no additional image store"),
        ] {
            std::fs::write(rw.join("lower"), lower).unwrap();
            let e = s.layers("c1").unwrap_err().to_string();
            assert!(e.contains(why), "{lower}: {e}");
        }
        std::os::unix::fs::symlink("/etc", home.join("l/OUT")).unwrap();
        std::os::unix::fs::symlink("../../../etc/diff", home.join("l/UP")).unwrap();
        for lower in ["l/OUT", "l/UP"] {
            std::fs::write(rw.join("lower"), lower).unwrap();
            let e = s.layers("c1").unwrap_err().to_string();
            assert!(e.contains("not to ../<layer>/diff"), "{lower}: {e}");
        }
        std::fs::write(rw.join("lower"), vec![b'l'; MAX_LOWER as usize + 1]).unwrap();
        assert!(
            s.layers("c1")
                .unwrap_err()
                .to_string()
                .contains("over 65536 bytes")
        );
        std::fs::write(rw.join("lower"), ["l/TOP"; 501].join(":")).unwrap();
        assert!(
            s.layers("c1")
                .unwrap_err()
                .to_string()
                .contains("over 500 layers")
        );
        std::fs::remove_file(rw.join("lower")).unwrap();
        assert!(
            s.layers("c1")
                .unwrap_err()
                .to_string()
                .contains("no image layers below it")
        );
        // A list cut short where the container is: said so. (One that
        // does not name the container at all is not parsed.)
        std::fs::write(&list, r#"[{"id":"c1","layer":"#).unwrap();
        let e = s.layers("c1").unwrap_err().to_string();
        assert!(e.contains("not a containers/storage list"), "{e}");
        std::fs::write(&list, "{not json").unwrap();
        let e = s.layers("c1").unwrap_err().to_string();
        assert!(e.starts_with("no container"), "{e}");
        let f = std::fs::File::create(&list).unwrap();
        f.set_len(MAX_LIST + 1).unwrap();
        assert!(
            s.layers("c1")
                .unwrap_err()
                .to_string()
                .contains("over 67108864 bytes")
        );
    }
}
