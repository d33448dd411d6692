//! Prebuilt libraries an admin imports (`gpuarchctl kernels import NAME
//! FILE…`): a wheel's `.so` built for some TORCH_CUDA_ARCH_LIST, a vendor's
//! fatbin. gpuarch did not build them, so it only stores and serves them.
//!
//! Each file is one store entry (backend `import`), keyed by the import's
//! name, the file's name and its sha256: content-addressed like a build,
//! verified on every lookup like one. What a file runs on is what the
//! inspector reads from its bytes (every SASS and PTX target, kept as the
//! entry's `targets`), never its name. An import's current files are
//! recorded in `imports/<NAME>.json` of the store and pinned; a new import
//! of the same name replaces the record and unpins the files it no longer
//! has, for the LRU to take; [`remove`] unpins all of them.

use std::io;

use gpuarch_core::arch::{CodeKind, Target};
use gpuarch_core::config::valid_package_name;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::inspect;
use crate::spec::sha256_hex;
use crate::store::{self, BuildError, BuildInfo, Entry, Meta, Store};

/// The backend named in an imported file's entry manifest.
pub use crate::store::IMPORT_BACKEND as BACKEND;
/// Where the records live, in the store's root.
const DIR: &str = "imports";

/// An import as recorded: its files' store keys, in the order given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub name: String,
    /// Add each served file's directory to the container's loader cache.
    pub ldconfig: bool,
    pub keys: Vec<String>,
    pub imported_at: u64,
}

/// The key of file `file` (contents `sha256`) of import `name`.
pub fn key(name: &str, file: &str, sha256: &str) -> String {
    let record = json!({
        "schema": store::SCHEMA,
        "backend": BACKEND,
        "package": name,
        "file": file,
        "sha256": sha256,
    });
    sha256_hex(record.to_string().as_bytes())
}

/// Why a file cannot be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0:?} is not a valid name (letters, digits, '.', '_', '-')")]
    Name(String),
    #[error("{file}: {why}")]
    File { file: String, why: String },
    #[error(transparent)]
    Store(#[from] io::Error),
}

/// `name` may name an import: it is what containers see under
/// `/opt/gpuarch/kernels/`, so a package name's rules.
pub fn check_name(name: &str) -> Result<(), ImportError> {
    if valid_package_name(name) {
        Ok(())
    } else {
        Err(ImportError::Name(name.to_owned()))
    }
}

/// A file to import, copied into the store's own space as it was read:
/// its sha256 taken on the way and its size bounded, so that nothing the
/// caller does to its own file afterwards changes what is inspected and
/// stored, and gpuarchd holds 1 MiB of it at a time, never the file.
#[derive(Debug)]
pub struct Staged {
    file: std::fs::File,
    sha256: String,
    bytes: u64,
}

impl Staged {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Copy at most `limit` bytes of `from` into an unnamed file in the
/// store's `tmp/` (gone with its descriptor, whatever happens). A file
/// larger than `limit` is refused when the copy passes it.
pub fn stage(store: &Store, from: impl io::Read, limit: u64) -> io::Result<Staged> {
    let file = unnamed_file(&store.root().join("tmp"))?;
    let (sha256, bytes) =
        crate::file::copy_hashed(from, &file, limit).map_err(|e| match e.kind() {
            io::ErrorKind::FileTooLarge => {
                io::Error::new(e.kind(), format!("larger than kernels.max_bytes ({limit})"))
            }
            _ => e,
        })?;
    Ok(Staged {
        file,
        sha256,
        bytes,
    })
}

/// A file in `dir` with no name (O_TMPFILE), or where the filesystem has
/// none, one named and unlinked at once (a crash between the two leaves a
/// name that [`Store::open`] clears).
fn unnamed_file(dir: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |o: &mut std::fs::OpenOptions, p: &std::path::Path| {
        o.read(true).write(true).mode(0o600).open(p)
    };
    match open(
        std::fs::OpenOptions::new().custom_flags(nix::libc::O_TMPFILE),
        dir,
    ) {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::EOPNOTSUPP | nix::libc::EISDIR | nix::libc::EINVAL)
            ) =>
        {
            static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = dir.join(format!("import-{}-{seq}", std::process::id()));
            let f = open(std::fs::OpenOptions::new().create_new(true), &p)?;
            std::fs::remove_file(&p)?;
            Ok(f)
        }
        r => r,
    }
}

/// Give the staged file the name `dest`: linked where it has no name yet,
/// else copied by the kernel.
fn place(staged: &std::fs::File, dest: &std::path::Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let proc = format!("/proc/self/fd/{}", staged.as_raw_fd());
    let linked = nix::unistd::linkat(
        nix::fcntl::AT_FDCWD,
        proc.as_str(),
        nix::fcntl::AT_FDCWD,
        dest,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    );
    if linked.is_ok() {
        return Ok(());
    }
    let mut from = staged;
    io::Seek::seek(&mut from, io::SeekFrom::Start(0))?;
    let mut to = std::fs::File::create_new(dest)?;
    io::copy(&mut from, &mut to)?;
    Ok(())
}

/// Store `staged` as file `file` of import `name`: the entry, new or
/// found, and the code the inspector read from it, each target once. The
/// file must carry GPU code the inspector can read.
pub fn store_file(
    store: &Store,
    name: &str,
    file: &str,
    staged: Staged,
) -> Result<(Entry, Vec<inspect::CodeObject>), ImportError> {
    check_name(name)?;
    let bad = |why: String| ImportError::File {
        file: file.to_owned(),
        why,
    };
    if !valid_package_name(file) || file == store::MANIFEST {
        return Err(bad("not a plain file name".into()));
    }
    let objs = {
        let mapped = crate::file::Mapped::new(&staged.file)?;
        inspect::summarize(mapped.bytes()).map_err(|e| bad(e.to_string()))?
    };
    // The entry's arch, for listings: its best SASS, else its best PTX.
    let best = |k: CodeKind| objs.iter().map(|o| o.target).filter(|t| t.kind == k).max();
    let arch: Target = best(CodeKind::Sass)
        .or_else(|| best(CodeKind::Ptx))
        .ok_or_else(|| bad("it carries no GPU code (no cubin, PTX or .nv_fatbin)".into()))?;
    let sha = &staged.sha256;
    let meta = Meta {
        package: name.to_owned(),
        version: format!("sha256:{}", &sha[..12]),
        variant: file.to_owned(),
        dtype: None,
        arch,
        backend: BACKEND.to_owned(),
        exports: Vec::new(),
    };
    let k = key(name, file, sha);
    let outcome = store
        .build(&k, &meta, |out| {
            place(&staged.file, &out.join(file))?;
            Ok(BuildInfo {
                toolkit: BACKEND.to_owned(),
                min_driver_cuda: None,
                origin: None,
            })
        })
        .map_err(|e| match e {
            BuildError::Rejected(why) | BuildError::Tool(why) => bad(why),
        })?;
    Ok((outcome.entry().clone(), objs))
}

fn record_path(store: &Store, name: &str) -> std::path::PathBuf {
    store.root().join(DIR).join(format!("{name}.json"))
}

/// Make `record` the import of its name: its files pinned, the files of the
/// import it replaces that it no longer has unpinned. Returns the record
/// it replaced.
pub fn commit(store: &Store, record: &Record) -> io::Result<Option<Record>> {
    let old = read(store, &record.name)?;
    for k in &record.keys {
        store.pin(k)?;
    }
    let dir = store.root().join(DIR);
    std::fs::create_dir_all(&dir)?;
    let body = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    gpuarch_fs::write_atomic(&record_path(store, &record.name), &body)?;
    if let Some(old) = &old {
        for k in old.keys.iter().filter(|k| !record.keys.contains(k)) {
            store.unpin(k)?;
        }
    }
    Ok(old)
}

/// Forget the import named `name`: its record removed first (so it is
/// published no more), then its files unpinned, left to the LRU once no
/// container mounts them. Returns the record removed.
pub fn remove(store: &Store, name: &str) -> io::Result<Option<Record>> {
    let Some(old) = read(store, name)? else {
        return Ok(None);
    };
    std::fs::remove_file(record_path(store, name))?;
    for k in &old.keys {
        store.unpin(k)?;
    }
    Ok(Some(old))
}

/// The import named `name`, if there is one.
pub fn read(store: &Store, name: &str) -> io::Result<Option<Record>> {
    match std::fs::read(record_path(store, name)) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("import {name}: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every import, by name; a record that cannot be read is reported, not
/// served.
pub fn all(store: &Store) -> (Vec<Record>, Vec<String>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let Ok(rd) = std::fs::read_dir(store.root().join(DIR)) else {
        return (out, errors);
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".json") else {
            continue;
        };
        if !valid_package_name(stem) {
            continue;
        }
        match read(store, stem) {
            Ok(Some(r)) => out.push(r),
            Ok(None) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    (out, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_forgets_the_record_and_unpins_only_its_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(tmp.path(), 1 << 30).expect("store");
        let record = |name: &str, keys: &[&str]| Record {
            name: name.to_owned(),
            ldconfig: false,
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            imported_at: 1,
        };
        commit(&store, &record("a", &["k1", "k2"])).expect("commit a");
        commit(&store, &record("b", &["k3"])).expect("commit b");
        let gone = remove(&store, "a").expect("remove a");
        assert_eq!(gone, Some(record("a", &["k1", "k2"])));
        assert!(!store.pinned("k1") && !store.pinned("k2"));
        assert!(store.pinned("k3"), "another import's file was unpinned");
        assert_eq!(read(&store, "a").expect("read a"), None);
        let (left, errors) = all(&store);
        assert_eq!(left, [record("b", &["k3"])]);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(remove(&store, "a").expect("remove a again"), None);
    }
}
