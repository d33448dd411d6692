//! Import a library from an installed copy: the `site-packages` directory
//! (or `pip install --target` directory) that holds `flashinfer_cubin/`
//! and its `.dist-info`. The directory comes as a descriptor the caller
//! opened, and every name below it is resolved by the kernel beneath it,
//! never through a link or onto another filesystem. What is read is what
//! RECORD lists under the kind's root, each file held to RECORD's hash and
//! bounded as a wheel's members are; everything after is the wheel's path.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::path::Path;

use gpuarch_core::library;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};

use super::wheel::{self, Limits, MAX_METADATA, MAX_RECORD, Source, Staging};
use super::{Index, LibraryError};

const BENEATH: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

/// The regular file `rel` beneath `dir`, opened for reading: never through
/// a link, never a FIFO or device (opened without blocking, then refused).
fn open_beneath(dir: &std::fs::File, rel: &str) -> io::Result<std::fs::File> {
    let how = OpenHow::new()
        .flags(
            OFlag::O_RDONLY
                | OFlag::O_CLOEXEC
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK
                | OFlag::O_NOCTTY,
        )
        .resolve(BENEATH);
    let f = std::fs::File::from(openat2(dir.as_fd(), rel, how)?);
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// `rel` beneath `dir`, whole, refused past `limit` bytes.
fn read_small(
    dir: &std::fs::File,
    rel: &str,
    limit: u64,
    name: &str,
) -> Result<String, LibraryError> {
    let refused = |why: String| LibraryError::Refused {
        file: name.to_owned(),
        why: format!("{rel}: {why}"),
    };
    let f = open_beneath(dir, rel).map_err(|e| refused(e.to_string()))?;
    let mut text = String::new();
    f.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| refused(e.to_string()))?;
    if text.len() as u64 > limit {
        return Err(LibraryError::TooLarge {
            what: format!("{name}: {rel}"),
            limit,
        });
    }
    Ok(text)
}

/// The one `.dist-info` in `dir` of a kind gpuarch imports.
fn find_dist_info(dir: &std::fs::File, name: &str) -> Result<String, LibraryError> {
    let refused = |why: String| LibraryError::Refused {
        file: name.to_owned(),
        why,
    };
    let d = nix::dir::Dir::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| refused(format!("cannot list it: {e}")))?;
    let mut found = Vec::new();
    for e in d.into_iter().flatten() {
        let Ok(n) = e.file_name().to_str() else {
            continue;
        };
        let Some(stem) = n.strip_suffix(".dist-info") else {
            continue;
        };
        let module = stem.split_once('-').map_or(stem, |(m, _)| m);
        if library::kind(module).is_some() {
            found.push(n.to_owned());
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(refused(
            "no .dist-info of a library gpuarch imports: give the site-packages directory that holds it"
                .into(),
        )),
        many => Err(refused(format!(
            "{} installed copies ({}); give a directory that holds one",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// Import the installed copy in `dir` (opened by the caller) into `root`:
/// its index once it is in place. A version already imported is replaced
/// whole. The index's sha256 is its RECORD's.
pub fn import_installed(
    root: &Path,
    dir: &std::fs::File,
    source: &Source<'_>,
    limits: &Limits,
) -> Result<Index, LibraryError> {
    let name = source.name;
    let refused = |why: String| LibraryError::Refused {
        file: name.to_owned(),
        why,
    };
    let dist_info = find_dist_info(dir, name)?;
    let meta = read_small(dir, &format!("{dist_info}/METADATA"), MAX_METADATA, name)?;
    let (kind, version) = wheel::parse_metadata(&meta, &dist_info, name)?;
    wheel::check_expected(source, kind, &version)?;
    let record_text = read_small(dir, &format!("{dist_info}/RECORD"), MAX_RECORD, name)?;
    // Byte code and the installer's own files carry no hash; they are
    // outside the kind's root, and never read.
    let record = wheel::parse_record(&record_text, &dist_info, name, |p| {
        !p.starts_with(kind.root)
    })?;
    let mut served: Vec<(&str, &(String, Option<u64>))> = record
        .iter()
        .filter_map(|(p, want)| {
            let rel = p.strip_prefix(kind.root).filter(|r| !r.is_empty())?;
            Some((rel, want))
        })
        .collect();
    served.sort_unstable_by_key(|(rel, _)| *rel);
    if served.len() > limits.max_files {
        return Err(LibraryError::TooLarge {
            what: format!("{name}: its files"),
            limit: limits.max_files as u64,
        });
    }
    let mut staging = Staging::new(root, kind, &version, source, limits, "files")?;
    for (rel, want) in served {
        let path = format!("{}{rel}", kind.root);
        library::check_relative(&path).map_err(|why| refused(format!("{path:?}: {why}")))?;
        let from = open_beneath(dir, &path).map_err(|e| refused(format!("{path}: {e}")))?;
        staging.add(from, &path, Some(rel), Some(want))?;
    }
    staging.finish(crate::spec::hex(&<sha2::Sha256 as sha2::Digest>::digest(
        record_text.as_bytes(),
    )))
}
