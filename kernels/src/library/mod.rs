//! Consumers' own prebuilt kernel libraries (`gpuarch_core::library`):
//! imported once per node from the distribution that carries them (its
//! wheel, or a directory it is installed in),
//! verified, indexed by what each file really carries, and served per
//! container as a tree holding only what its GPUs run.
//!
//! ```text
//! <root>/<dist>/<version>/index.json        what was imported (Index)
//! <root>/<dist>/<version>/files/<path>      the files, 0444, as verified
//! <root>/<dist>/<version>/serve/<set>/      hard links: what a set of
//!                                           capabilities (`10.0+10.3`) runs
//! <root>/<dist>/<version>/serve/<set>.json  that tree's Served
//! <root>/tmp/                               imports and trees being made
//! ```
//!
//! A version appears, or is replaced, by one `rename(2)` of a complete
//! directory, so a reader sees a whole import or none. A container gets a
//! tree by one read-only bind mount; a tree is made once per set and
//! shared.
//!
//! What a tree holds: every file that is not GPU code (FlashInfer's
//! `checksums.txt` and headers), and every file of GPU code that runs on
//! at least one capability of the set, judged by the inspector from its
//! bytes. A file the library's own checksum lists name but the import does
//! not hold (FlashInfer 0.6.13's wheel leaves out its CuTe DSL modules,
//! which FlashInfer fetches at run time) is *missing*; a tree is
//! *complete* only when no missing file could be asked for on the set.
//! The consumer fetches a missing file into the directory at run time,
//! and writes some places of its own there (FlashInfer's `flashinfer/`
//! include links), which a read-only tree refuses: so each such directory
//! gets a small writable tmpfs in the container (`Served::fetch_dirs`,
//! `scratch_dirs`), where the fetch works as it would into the consumer's
//! own cache. A missing file in a directory that holds the tree's code
//! cannot be given one without hiding that code: the tree is then
//! incomplete and is not pointed at, since it would be worse than the
//! variable unset.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use gpuarch_core::arch::{ComputeCapability, Target};
use gpuarch_core::library::LibraryKind;
use serde::{Deserialize, Serialize};

mod installed;
#[cfg(any(test, feature = "test-wheel"))]
pub mod testwheel;
mod wheel;

pub use installed::import_installed;
pub use wheel::{Limits, MAX_DIRECTORY, Source, import_wheel};

/// Version of the index layout.
pub const SCHEMA: u32 = 1;
const INDEX: &str = "index.json";

/// What an import holds: written as its `index.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    pub schema: u32,
    /// The distribution, as PyPI spells it: `flashinfer-cubin`.
    pub dist: String,
    pub version: String,
    /// The wheel's file name and sha256.
    pub source: String,
    /// `repository@sha256:...` where the wheel was pulled from a registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    pub sha256: String,
    pub imported_at: u64,
    /// Every file served, by its path below the kind's root.
    pub files: BTreeMap<String, FileInfo>,
    /// Files the library's checksum lists name that the import does not
    /// hold, with the sha256 they list.
    pub missing: BTreeMap<String, String>,
}

/// One imported file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileInfo {
    pub sha256: String,
    pub bytes: u64,
    /// Every SASS and PTX target the inspector read from it (`sm_100a`);
    /// empty for a file that is not GPU code.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<String>,
}

impl Index {
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|f| f.bytes).sum()
    }
}

/// Why a library cannot be imported or served.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("{file}: not a wheel gpuarch can read: {why}")]
    NotAWheel { file: String, why: String },
    #[error("{0} is not a distribution gpuarch imports (it knows {known})", known = known())]
    Unknown(String),
    #[error("{file}: {why}")]
    Refused { file: String, why: String },
    #[error("{what} is over its bound of {limit}")]
    TooLarge { what: String, limit: u64 },
    #[error("no import of {dist} {version}")]
    NotImported { dist: String, version: String },
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
}

fn known() -> String {
    gpuarch_core::library::ALL
        .iter()
        .map(|k| k.dist)
        .collect::<Vec<_>>()
        .join(", ")
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> LibraryError + '_ {
    move |error| LibraryError::Io {
        path: path.to_owned(),
        error,
    }
}

/// The directory of one imported version.
pub fn version_dir(root: &Path, dist: &str, version: &str) -> PathBuf {
    root.join(dist).join(version)
}

/// Remove what imports, pulls and trees left half made in `<root>/tmp`
/// when the process making them died; how many entries went. Only for the
/// one process that writes below `root` (gpuarchd), as it starts.
pub fn clear_staging(root: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(root.join("tmp")) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        let gone = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
            _ => std::fs::remove_file(&p),
        };
        n += usize::from(gone.is_ok());
    }
    n
}

/// The index of an imported version.
pub fn read_index(root: &Path, dist: &str, version: &str) -> Result<Index, LibraryError> {
    let path = version_dir(root, dist, version).join(INDEX);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LibraryError::NotImported {
                dist: dist.to_owned(),
                version: version.to_owned(),
            });
        }
        Err(e) => return Err(io_at(&path)(e)),
    };
    serde_json::from_slice(&bytes).map_err(|e| LibraryError::Refused {
        file: path.display().to_string(),
        why: e.to_string(),
    })
}

pub use gpuarch_wire::library::{Served, set_name, tree_paths};

/// Whether code built for `target` (nvcc spelling) runs on one of `caps`,
/// by SASS or by PTX JIT.
fn runs_on_any(target: &str, caps: &[ComputeCapability]) -> bool {
    Target::parse(target).is_ok_and(|t| caps.iter().any(|c| t.check(*c, None, None).runs))
}

/// The target a library's file name says it is for (`fmhaSm100aKernel…`,
/// `…/sm_100a/…`), where the file itself cannot be read: FlashInfer names
/// its artifacts so. None where the name says nothing.
pub fn name_target(path: &str) -> Option<Target> {
    let lower = path.to_ascii_lowercase();
    let b = lower.as_bytes();
    let mut i = 0;
    while let Some(at) = lower[i..].find("sm") {
        let mut j = i + at + 2;
        if b.get(j) == Some(&b'_') {
            j += 1;
        }
        let start = j;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        if (2..=3).contains(&(j - start)) {
            let mut end = j;
            if matches!(b.get(j), Some(b'a' | b'f')) {
                end += 1;
            }
            if let Ok(t) = Target::parse(&format!("sm_{}", &lower[start..end])) {
                return Some(t);
            }
        }
        i += at + 2;
    }
    None
}

/// What the tree for `caps` holds, from the index alone: the files to
/// link, and its [`Served`].
pub fn plan_tree<'a>(
    index: &'a Index,
    kind: &LibraryKind,
    caps: &[ComputeCapability],
) -> (Vec<&'a str>, Served) {
    let mut files = Vec::new();
    let (mut bytes, mut code) = (0, 0);
    let mut code_dirs = std::collections::BTreeSet::new();
    for (path, f) in &index.files {
        let keep = f.targets.is_empty() || f.targets.iter().any(|t| runs_on_any(t, caps));
        if keep {
            files.push(path.as_str());
            bytes += f.bytes;
            if !f.targets.is_empty() {
                code += 1;
                code_dirs.insert(parent_of(path));
            }
        }
    }
    let mut fetch = std::collections::BTreeSet::new();
    let mut blocking = Vec::new();
    for p in index.missing.keys() {
        let wanted =
            name_target(p).is_none_or(|t| caps.iter().any(|c| t.check(*c, None, None).runs));
        if !wanted {
            continue;
        }
        let dir = parent_of(p);
        // A tmpfs over the directory would hide the tree's code in it; and
        // one over the whole tree would hide all of it.
        if dir.is_empty()
            || code_dirs
                .iter()
                .any(|c| *c == dir || c.starts_with(&format!("{dir}/")))
        {
            blocking.push(p.clone());
        } else {
            fetch.insert(dir.to_owned());
        }
    }
    let mut c: Vec<_> = caps.to_vec();
    c.sort();
    c.dedup();
    let served = Served {
        schema: gpuarch_wire::library::SCHEMA,
        caps: c.iter().map(ToString::to_string).collect(),
        files: files.len() as u64,
        bytes,
        code_files: code,
        fetch_dirs: fetch.into_iter().collect(),
        scratch_dirs: kind.scratch.iter().map(|s| (*s).to_owned()).collect(),
        missing: blocking.iter().take(16).cloned().collect(),
        missing_count: blocking.len() as u64,
    };
    (files, served)
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The tree for `caps` of an imported version, made if it is not there
/// yet: its directory and what it holds.
pub fn serve(
    root: &Path,
    dist: &str,
    version: &str,
    caps: &[ComputeCapability],
) -> Result<(PathBuf, Served), LibraryError> {
    let kind = gpuarch_core::library::kind(dist).ok_or(LibraryError::Unknown(dist.to_owned()))?;
    let vdir = version_dir(root, dist, version);
    let name = set_name(caps);
    let (dir, side) = tree_paths(root, dist, version, &name);
    if dir.is_dir()
        && let Ok(b) = std::fs::read(&side)
        && let Ok(s) = serde_json::from_slice::<Served>(&b)
    {
        return Ok((dir, s));
    }
    let index = read_index(root, dist, version)?;
    let (files, served) = plan_tree(&index, kind, caps);
    let tmp = root.join("tmp").join(format!(
        "serve-{dist}-{version}-{name}.{}.{}",
        std::process::id(),
        wheel::seq()
    ));
    let result = (|| {
        std::fs::create_dir_all(&tmp).map_err(io_at(&tmp))?;
        let src = vdir.join("files");
        for path in &files {
            let to = tmp.join(path);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(io_at(parent))?;
            }
            std::fs::hard_link(src.join(path), &to).map_err(io_at(&to))?;
        }
        // Mount points for the container's tmpfs mounts: the tree is
        // read-only once mounted, so they must be there already.
        for d in served.writable_dirs() {
            let at = tmp.join(d);
            std::fs::create_dir_all(&at).map_err(io_at(&at))?;
        }
        let body = serde_json::to_vec_pretty(&served).map_err(io::Error::other);
        let body = body.map_err(io_at(&side))?;
        std::fs::create_dir_all(vdir.join("serve")).map_err(io_at(&vdir))?;
        gpuarch_fs::write_atomic(&side, &body).map_err(io_at(&side))?;
        match std::fs::rename(&tmp, &dir) {
            Ok(()) => Ok(()),
            // Made meanwhile by another: the same files.
            Err(_) if dir.is_dir() => {
                let _ = std::fs::remove_dir_all(&tmp);
                Ok(())
            }
            Err(e) => Err(io_at(&dir)(e)),
        }
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result.map(|()| (dir, served))
}

/// Every imported version: (dist, version).
pub fn list(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for kind in gpuarch_core::library::ALL {
        let Ok(rd) = std::fs::read_dir(root.join(kind.dist)) else {
            continue;
        };
        for e in rd.flatten() {
            let v = e.file_name().to_string_lossy().into_owned();
            if gpuarch_core::library::valid_version(&v) && e.path().join(INDEX).is_file() {
                out.push((kind.dist.to_owned(), v));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests;
