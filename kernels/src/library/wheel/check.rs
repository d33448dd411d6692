//! What a wheel's members are held to once read: the library's own
//! checksum lists, and the GPU code each file carries.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::Path;

use gpuarch_core::library;
use gpuarch_wire::library::MAX_FETCH_DIRS;

use super::super::FileInfo;
use super::{CHECKSUMS, MAX_LIST, MAX_MISSING};
use crate::file::Mapped;
use crate::inspect;

/// Hold each `checksums.txt` the library ships to the files it names:
/// a file held must match; one not held is missing (path → sha256).
pub(super) fn check_lists(
    files_dir: &Path,
    files: &BTreeMap<String, FileInfo>,
) -> Result<BTreeMap<String, String>, MemberError> {
    let mut missing = BTreeMap::new();
    for list in files
        .keys()
        .filter(|p| p.rsplit('/').next() == Some(CHECKSUMS))
    {
        let dir = list.rsplit_once('/').map_or("", |(d, _)| d);
        let mut text = String::new();
        std::fs::File::open(files_dir.join(list))
            .and_then(|f| f.take(MAX_LIST + 1).read_to_string(&mut text))
            .map_err(|error| MemberError::Io {
                rel: list.clone(),
                error,
            })?;
        if text.len() as u64 > MAX_LIST {
            return Err(MemberError::ListTooLarge(list.clone()));
        }
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: &str| MemberError::ListLine {
                list: list.clone(),
                line: n + 1,
                why: why.to_owned(),
            };
            let mut it = line.split_whitespace();
            let (Some(sha), Some(name), None) = (it.next(), it.next(), it.next()) else {
                return Err(bad("not 'sha256 name'"));
            };
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad("not a sha256"));
            }
            library::check_relative(name).map_err(&bad)?;
            let path = if dir.is_empty() {
                name.to_owned()
            } else {
                format!("{dir}/{name}")
            };
            match files.get(&path) {
                Some(f) if f.sha256.eq_ignore_ascii_case(sha) => {}
                Some(f) => {
                    return Err(bad(&format!(
                        "{path} has sha256 {}, the list says {sha}",
                        f.sha256
                    )));
                }
                None => {
                    missing.insert(path, sha.to_ascii_lowercase());
                }
            }
        }
    }
    // Each directory a missing file is in is a writable place in every
    // container served the library (a tmpfs, `Served::fetch_dirs`), and
    // each file a line of its index: both bounded here, once.
    let dirs: std::collections::BTreeSet<&str> = missing
        .keys()
        .map(|p| p.rsplit_once('/').map_or("", |(d, _)| d))
        .collect();
    if missing.len() > MAX_MISSING || dirs.len() > MAX_FETCH_DIRS {
        return Err(MemberError::TooMany {
            files: missing.len(),
            dirs: dirs.len(),
        });
    }
    Ok(missing)
}

/// What a file carries: every target the inspector reads. A `.cubin` must
/// carry GPU code; another file that holds none (a header, a list) is not
/// GPU code, and one that cannot be read as GPU code is neither.
pub(super) fn targets(path: &Path, rel: &str) -> Result<Vec<String>, MemberError> {
    let io = |error| MemberError::Io {
        rel: rel.to_owned(),
        error,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let is_cubin = rel.ends_with(".cubin");
    if len == 0 {
        return if is_cubin {
            Err(MemberError::EmptyCubin(rel.to_owned()))
        } else {
            Ok(Vec::new())
        };
    }
    let mapped = Mapped::new(&f).map_err(io)?;
    match inspect::summarize(mapped.bytes()) {
        Ok(objs) if !objs.is_empty() => {
            let mut t: Vec<String> = objs.iter().map(|o| o.target.to_string()).collect();
            t.sort();
            t.dedup();
            Ok(t)
        }
        _ if !is_cubin => Ok(Vec::new()),
        Ok(_) => Err(MemberError::NoCode(rel.to_owned())),
        Err(error) => Err(MemberError::Inspect {
            rel: rel.to_owned(),
            error,
        }),
    }
}

/// Why a wheel's member, or its checksum lists, refuse the import.
#[derive(Debug, thiserror::Error)]
pub(super) enum MemberError {
    #[error("{rel}: {error}")]
    Io {
        rel: String,
        #[source]
        error: io::Error,
    },
    #[error("{0}: an empty cubin")]
    EmptyCubin(String),
    #[error("{0}: a cubin with no GPU code")]
    NoCode(String),
    #[error("{rel}: {error}")]
    Inspect {
        rel: String,
        #[source]
        error: inspect::InspectError,
    },
    #[error("{0}: over {mib} MiB", mib = MAX_LIST >> 20)]
    ListTooLarge(String),
    #[error("{list} line {line}: {why}")]
    ListLine {
        list: String,
        line: usize,
        why: String,
    },
    #[error(
        "its checksum lists name {files} files it lacks, in {dirs} directories: at most {MAX_MISSING} files in {MAX_FETCH_DIRS} directories are fetched at run time"
    )]
    TooMany { files: usize, dirs: usize },
}
