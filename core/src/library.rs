//! Consumers' own prebuilt kernel libraries, which gpuarch imports once per
//! node and serves per container: which distribution carries them, where
//! in it the files lie, which consumer reads them and through which
//! variable. Shared by the import (gpuarch-kernels) and the hook.
//!
//! FlashInfer is the first: `flashinfer-cubin` holds the cubins
//! `flashinfer-python` of the same version would otherwise fetch at run
//! time into a per-user cache, and `flashinfer-python` reads them from
//! `FLASHINFER_CUBIN_DIR` (`flashinfer/jit/env.py: _get_cubin_dir`) when
//! its image has no `flashinfer-cubin` of its own.

use crate::env::EnvVar;
use crate::software::Dist;

/// One kind of prebuilt library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibraryKind {
    /// The distribution that carries the files, as PyPI spells it.
    pub dist: &'static str,
    /// Its import name: the wheel's top directory and the `.dist-info`'s
    /// stem.
    pub module: &'static str,
    /// Where the served files lie in the wheel, below which their relative
    /// paths are what the consumer asks for (`<root>/<path>`).
    pub root: &'static str,
    /// The consumer that reads them; it must be of the same version.
    pub reader: Dist,
    /// The variable that points the consumer at the files.
    pub env: EnvVar,
    /// Where a container sees them.
    pub mount: &'static str,
    /// Directories of the tree the consumer writes into at run time,
    /// whatever the import holds (relative).
    pub scratch: &'static [&'static str],
}

pub const FLASHINFER_CUBIN: LibraryKind = LibraryKind {
    dist: "flashinfer-cubin",
    module: "flashinfer_cubin",
    root: "flashinfer_cubin/cubins/",
    reader: Dist::FlashInfer,
    env: EnvVar::FlashinferCubinDir,
    mount: "/opt/gpuarch/libraries/flashinfer-cubin",
    // `jit/cubin_loader.py: ensure_symlink` links the trtllm-gen export
    // headers under `<dir>/flashinfer/trtllm/` (with a lock file beside
    // each link) before building its GEMM and MoE modules.
    scratch: &["flashinfer"],
};

/// Every kind gpuarch knows.
pub const ALL: [LibraryKind; 1] = [FLASHINFER_CUBIN];

/// The kind of distribution `dist` (PyPI's spelling, any case, `_` or `-`).
pub fn kind(dist: &str) -> Option<&'static LibraryKind> {
    let norm = normalize(dist);
    ALL.iter().find(|k| k.dist == norm)
}

pub use crate::software::normalize;

/// A version as a directory name may hold it: PEP 440's characters only,
/// at most 64 of them, and not `.` or `..`.
pub fn valid_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v != "."
        && v != ".."
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'!' | b'-' | b'_'))
}

/// The distribution (PEP 503 name) and exact version a `.dist-info`
/// directory names, when it is one a prebuilt library is gated on.
pub fn gated_dist_info(entry: &str) -> Option<(String, String)> {
    let stem = entry.strip_suffix(".dist-info")?;
    let (name, version) = stem.split_once('-')?;
    let name = normalize(name);
    let gated = ALL
        .iter()
        .any(|k| k.dist == name || k.reader.name() == name);
    (gated && valid_version(version)).then(|| (name, version.to_owned()))
}

/// A path of a library's file or directory as plain relative parts:
/// nothing that could leave the directory it is below, or name one file
/// twice. The rule of the import's members and of a tree's places.
pub fn check_relative(path: &str) -> Result<(), &'static str> {
    if path.is_empty() || path.len() > 4096 {
        return Err("empty or over 4096 bytes");
    }
    if path.starts_with('/') || path.contains('\\') || path.contains('\0') {
        return Err("absolute, or holding a backslash or NUL");
    }
    for part in path.split('/') {
        if part.is_empty() || part == "." || part == ".." || part.len() > 255 {
            return Err("an empty, '.' or '..' part, or one over 255 bytes");
        }
        if part.chars().any(char::is_control) {
            return Err("a control character");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
