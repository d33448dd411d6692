//! The Node Feature Discovery file (`export.nfd`): kept equal to the
//! inventory's labels, replaced only when they change, and removed when the
//! export is turned off or moved. A file is only ever removed when it is
//! one gpuarchd wrote (it starts with [`gpuarch_core::nfd::HEADER`]).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// What one pass did to the file system.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    Written(PathBuf),
    Removed(PathBuf),
}

/// Make `path` hold `text` (or, with `None`, hold nothing of ours), and
/// remove `old` when it is ours and no longer the target.
pub fn sync(path: &Path, text: Option<&str>, old: Option<&Path>) -> std::io::Result<Vec<Done>> {
    let mut done = Vec::new();
    if let Some(old) = old.filter(|o| *o != path || text.is_none())
        && remove_ours(old)?
    {
        done.push(Done::Removed(old.to_owned()));
    }
    match text {
        Some(text) => {
            if std::fs::read(path).is_ok_and(|cur| cur == text.as_bytes()) {
                return Ok(done);
            }
            replace(path, text)?;
            done.push(Done::Written(path.to_owned()));
        }
        None => {
            if old != Some(path) && remove_ours(path)? {
                done.push(Done::Removed(path.to_owned()));
            }
        }
    }
    Ok(done)
}

fn is_ours(path: &Path) -> std::io::Result<bool> {
    match std::fs::read(path) {
        Ok(b) => Ok(b.starts_with(gpuarch_core::nfd::HEADER.as_bytes())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn remove_ours(path: &Path) -> std::io::Result<bool> {
    if !is_ours(path)? {
        return Ok(false);
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// A dot-file beside `path` (NFD skips dot-files), renamed over it, so
/// NFD never reads half a file.
fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let r = gpuarch_fs::write_atomic(path, text.as_bytes());
    r.map_err(|e| match e.kind() {
        ErrorKind::NotFound => std::io::Error::new(
            e.kind(),
            format!(
                "{} does not exist (NFD's worker makes it; create it, then restart gpuarchd)",
                dir.display()
            ),
        ),
        ErrorKind::ReadOnlyFilesystem => std::io::Error::new(
            e.kind(),
            format!(
                "{} is read-only to gpuarchd (a directory made after gpuarchd started is outside its \
                 ReadWritePaths until a restart)",
                dir.display()
            ),
        ),
        _ => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(s: &str) -> String {
        format!("{}{s}", gpuarch_core::nfd::HEADER)
    }

    #[test]
    fn writes_on_change_only_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gpuarch");
        let a = ours("gpuarch.io/gpu.count=1\n");
        assert_eq!(
            sync(&p, Some(&a), None).unwrap(),
            [Done::Written(p.clone())]
        );
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&p).unwrap().ino();
        assert_eq!(sync(&p, Some(&a), Some(&p)).unwrap(), []);
        assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino);
        let b = ours("gpuarch.io/gpu.count=2\n");
        assert_eq!(
            sync(&p, Some(&b), Some(&p)).unwrap(),
            [Done::Written(p.clone())]
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), b);
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gpuarch"]);
    }

    #[test]
    fn removes_only_its_own_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gpuarch");
        std::fs::write(&p, "someone.else/x=1\n").unwrap();
        assert_eq!(sync(&p, None, None).unwrap(), []);
        assert!(p.exists(), "a file gpuarchd did not write was removed");
        std::fs::write(&p, ours("gpuarch.io/gpu.count=1\n")).unwrap();
        assert_eq!(sync(&p, None, None).unwrap(), [Done::Removed(p.clone())]);
        assert!(!p.exists());
        assert_eq!(sync(&p, None, None).unwrap(), []);
    }

    #[test]
    fn a_moved_file_is_removed_from_the_old_place() {
        let d = tempfile::tempdir().unwrap();
        let (old, new) = (d.path().join("a"), d.path().join("b"));
        let t = ours("gpuarch.io/gpu.count=1\n");
        sync(&old, Some(&t), None).unwrap();
        assert_eq!(
            sync(&new, Some(&t), Some(&old)).unwrap(),
            [Done::Removed(old.clone()), Done::Written(new.clone())]
        );
        assert!(!old.exists() && new.exists());
    }

    #[test]
    fn a_missing_directory_is_named_and_nothing_is_left() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("features.d/gpuarch");
        let e = sync(&p, Some(&ours("")), None).unwrap_err();
        assert!(e.to_string().contains("features.d does not exist"), "{e}");
    }
}
