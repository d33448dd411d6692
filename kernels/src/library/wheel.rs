//! Import a library from its wheel: every member checked against the
//! wheel's `RECORD` as it is read, GPU code read by the inspector, the
//! library's own checksum lists held to what was read, and the bytes, the
//! number of files and each file bounded before they are written.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use gpuarch_core::library::{self, LibraryKind};

use super::{FileInfo, INDEX, Index, LibraryError, SCHEMA, io_at, version_dir};
use crate::file::{copy_hashed, sha256_of};

mod check;
use check::{check_lists, targets};

/// How much one import may be.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The wheel's members together, unpacked.
    pub max_bytes: u64,
    pub max_files: usize,
    /// One member, unpacked.
    pub max_file_bytes: u64,
}

impl Limits {
    /// Bounds for a store of `max_bytes` (`kernels.max_bytes`).
    pub fn for_store(max_bytes: u64) -> Self {
        Self {
            max_bytes,
            max_files: 100_000,
            max_file_bytes: 1 << 30,
        }
    }
}

/// Most bytes at a wheel's end its members are listed from (its central
/// directory, end records and comment): the zip reader keeps about four
/// times what it reads. flashinfer-cubin 0.6.13 (16,017 members, 458 MB)
/// has 3.9 MB.
pub const MAX_DIRECTORY: u64 = 12 << 20;
/// What a wheel may be beyond the bytes it unpacks to: its members'
/// headers (a stored member is its bytes and 30 more and its name).
const MAX_OVERHEAD: u64 = 64 << 20;

/// A wheel as the zip reader sees it: positional reads of the file, none
/// before `open` (shared, so that it can be lowered once the members are
/// listed); one that would is an error, and `hit` says so.
struct Window<'a> {
    file: &'a std::fs::File,
    /// The file's size, taken before it was hashed.
    len: u64,
    pos: u64,
    open: std::rc::Rc<std::cell::Cell<u64>>,
    hit: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<'a> Window<'a> {
    fn new(file: &'a std::fs::File, len: u64, open: u64) -> Self {
        Self {
            file,
            len,
            pos: 0,
            open: std::rc::Rc::new(std::cell::Cell::new(open)),
            hit: std::rc::Rc::new(std::cell::Cell::new(false)),
        }
    }
}

impl Read for Window<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        if self.pos < self.open.get() {
            self.hit.set(true);
            return Err(io::Error::other(
                "before the window the members are listed from",
            ));
        }
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl io::Seek for Window<'_> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let at = match to {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::End(d) => self.len.checked_add_signed(d),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = at.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

/// The most members any end record of the wheel says it has: each
/// end-of-central-directory signature in its last 64 KiB (the zip reader
/// may take any of them), and the zip64 record its locator names. The
/// reader keeps about 300 bytes for each member it lists, whatever their
/// names: the count is bounded before it lists them.
fn most_members(wheel: &std::fs::File, size: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    const EOCD: [u8; 4] = 0x0605_4b50u32.to_le_bytes();
    const LOCATOR: [u8; 4] = 0x0706_4b50u32.to_le_bytes();
    const ZIP64: [u8; 4] = 0x0606_4b50u32.to_le_bytes();
    let tail_len = size.min(22 + 0xffff + 20);
    let start = size - tail_len;
    let mut tail = vec![0u8; tail_len as usize];
    wheel.read_exact_at(&mut tail, start)?;
    let u16_at = |b: &[u8], i: usize| u64::from(u16::from_le_bytes([b[i], b[i + 1]]));
    let mut most = 0;
    for at in (0..tail.len().saturating_sub(21)).filter(|&i| tail[i..i + 4] == EOCD) {
        most = most.max(u16_at(&tail, at + 8)).max(u16_at(&tail, at + 10));
        if at >= 20 && tail[at - 20..at - 16] == LOCATOR {
            let mut off = [0u8; 8];
            off.copy_from_slice(&tail[at - 12..at - 4]);
            let mut rec = [0u8; 56];
            let off = u64::from_le_bytes(off);
            if off.checked_add(56).is_some_and(|end| end <= size) {
                wheel.read_exact_at(&mut rec, off)?;
                if rec[..4] == ZIP64 {
                    let n =
                        |i: usize| u64::from_le_bytes(rec[i..i + 8].try_into().unwrap_or([0; 8]));
                    most = most.max(n(24)).max(n(32));
                }
            }
        }
    }
    Ok(most)
}

/// `RECORD` and `METADATA` are read whole: bounded apart.
pub(super) const MAX_RECORD: u64 = 12 << 20;
pub(super) const MAX_METADATA: u64 = 1 << 20;
/// A library's checksum list (`checksums.txt`), parsed whole.
const CHECKSUMS: &str = "checksums.txt";
/// Most bytes of one checksum list (FlashInfer 0.6.13's largest is 2.4 MB).
const MAX_LIST: u64 = 8 << 20;
/// Most files the lists may name that the wheel lacks (FlashInfer 0.6.13:
/// 960), and most directories they are in (3): each directory is a tmpfs
/// in every container the library is served to.
pub const MAX_MISSING: usize = 16_384;

pub(super) fn seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Where a wheel comes from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Source<'a> {
    /// Its file name, for messages and the index.
    pub name: &'a str,
    /// `repository@sha256:...` of the artifact it was pulled as.
    pub origin: Option<&'a str>,
    /// The distribution and version it must be: what a pull asked for.
    pub expect: Option<(&'a str, &'a str)>,
}

impl<'a> Source<'a> {
    /// A wheel handed over as the file `name`.
    pub fn file(name: &'a str) -> Self {
        Self {
            name,
            ..Self::default()
        }
    }
}

/// Import the wheel at `wheel` (opened by the caller) into `root`: its
/// index once it is in place. A version already imported is replaced
/// whole.
pub fn import_wheel(
    root: &Path,
    wheel: &std::fs::File,
    source: &Source<'_>,
    limits: &Limits,
) -> Result<Index, LibraryError> {
    let wheel_name = source.name;
    let refused = |why: String| LibraryError::Refused {
        file: wheel_name.to_owned(),
        why,
    };
    // Bounds before work: a wheel larger than any import may be is not
    // hashed (a sparse file of an exabyte would hold the queue for good),
    // and its members are listed from its last MAX_DIRECTORY bytes alone.
    let size = wheel
        .metadata()
        .map_err(io_at(Path::new(wheel_name)))?
        .len();
    let max_size = limits.max_bytes.saturating_add(MAX_OVERHEAD);
    if size > max_size {
        return Err(LibraryError::TooLarge {
            what: format!("{wheel_name}: {size} bytes"),
            limit: max_size,
        });
    }
    let members = most_members(wheel, size).map_err(io_at(Path::new(wheel_name)))?;
    if members > (limits.max_files + 16) as u64 {
        return Err(LibraryError::TooLarge {
            what: format!("{wheel_name}: {members} members"),
            limit: limits.max_files as u64,
        });
    }
    let (sha256, _) = sha256_of(wheel).map_err(io_at(Path::new(wheel_name)))?;
    let window = Window::new(wheel, size, size.saturating_sub(MAX_DIRECTORY));
    let open = window.open.clone();
    let hit = window.hit.clone();
    let config = zip::read::Config {
        archive_offset: zip::read::ArchiveOffset::Known(0),
    };
    let mut zip = zip::ZipArchive::with_config(config, window).map_err(|e| {
        if hit.get() {
            LibraryError::TooLarge {
                what: format!("{wheel_name}: its central directory"),
                limit: MAX_DIRECTORY,
            }
        } else {
            LibraryError::NotAWheel {
                file: wheel_name.to_owned(),
                why: e.to_string(),
            }
        }
    })?;
    // Listed: its members are read wherever they are.
    open.set(0);
    if zip.len() > limits.max_files + 16 {
        return Err(LibraryError::TooLarge {
            what: format!("{wheel_name}: {} members", zip.len()),
            limit: limits.max_files as u64,
        });
    }
    let (kind, version, dist_info) = identify(&mut zip, wheel_name)?;
    check_expected(source, kind, &version)?;
    let record = read_record(&mut zip, &dist_info, wheel_name)?;

    let mut staging = Staging::new(root, kind, &version, source, limits, "members")?;
    let mut seen = 0usize;
    for i in 0..zip.len() {
        let mut m = zip.by_index(i).map_err(|e| refused(e.to_string()))?;
        let name = m
            .name()
            .map_err(|e| refused(format!("member {i}: {e}")))?
            .into_owned();
        if m.is_dir() {
            continue;
        }
        library::check_relative(&name).map_err(|why| refused(format!("member {name:?}: {why}")))?;
        if m.is_symlink() {
            return Err(refused(format!("member {name}: a symbolic link")));
        }
        let record_name = format!("{dist_info}/RECORD");
        let want = record.get(&name);
        if want.is_none() && name != record_name {
            return Err(refused(format!("member {name} is not in RECORD")));
        }
        seen += 1;
        if seen > limits.max_files {
            return Err(LibraryError::TooLarge {
                what: format!("{wheel_name}: its files"),
                limit: limits.max_files as u64,
            });
        }
        let served = name.strip_prefix(kind.root).filter(|r| !r.is_empty());
        staging.add(&mut m, &format!("member {name}"), served, want)?;
    }
    for name in record.keys() {
        if zip.index_for_name(name).is_none() {
            return Err(refused(format!(
                "RECORD lists {name}, which the wheel lacks"
            )));
        }
    }
    staging.finish(sha256)
}

/// The wheel's kind, version and `.dist-info` directory, from its
/// `METADATA`: the name must be a kind gpuarch imports and the version the
/// one the directory names.
fn identify<R: Read + io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    wheel_name: &str,
) -> Result<(&'static LibraryKind, String, String), LibraryError> {
    let refused = |why: String| LibraryError::Refused {
        file: wheel_name.to_owned(),
        why,
    };
    let infos: Vec<String> = zip
        .file_names()
        .filter_map(Result::ok)
        .filter_map(|n| n.strip_suffix("/METADATA").map(str::to_owned))
        .filter(|d| d.ends_with(".dist-info") && !d.contains('/'))
        .collect();
    let [dist_info] = infos.as_slice() else {
        return Err(refused(format!(
            "{} .dist-info/METADATA at its top; a wheel has one",
            infos.len()
        )));
    };
    let meta = read_member(
        zip,
        &format!("{dist_info}/METADATA"),
        MAX_METADATA,
        wheel_name,
    )?;
    let (kind, version) = parse_metadata(&meta, dist_info, wheel_name)?;
    Ok((kind, version, dist_info.clone()))
}

/// The kind and version a `.dist-info/METADATA` says: the name must be a
/// kind gpuarch imports and the version the one `dist_info` names.
pub(super) fn parse_metadata(
    meta: &str,
    dist_info: &str,
    wheel_name: &str,
) -> Result<(&'static LibraryKind, String), LibraryError> {
    let refused = |why: String| LibraryError::Refused {
        file: wheel_name.to_owned(),
        why,
    };
    let field = |key: &str| {
        meta.lines()
            .take_while(|l| !l.is_empty())
            .find_map(|l| l.strip_prefix(key).map(str::trim).map(str::to_owned))
    };
    let name = field("Name:").ok_or_else(|| refused("METADATA has no Name".into()))?;
    let version = field("Version:").ok_or_else(|| refused("METADATA has no Version".into()))?;
    let kind = library::kind(&name).ok_or(LibraryError::Unknown(name.clone()))?;
    let stem = dist_info.trim_end_matches(".dist-info");
    if !library::valid_version(&version)
        || library::normalize(stem) != library::normalize(&format!("{}-{version}", kind.module))
    {
        return Err(refused(format!(
            "METADATA says {name} {version:?}, and its directory is {dist_info}"
        )));
    }
    Ok((kind, version))
}

/// `RECORD`: each member's sha256 (hex) and length.
fn read_record<R: Read + io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    dist_info: &str,
    wheel_name: &str,
) -> Result<HashMap<String, (String, Option<u64>)>, LibraryError> {
    let text = read_member(zip, &format!("{dist_info}/RECORD"), MAX_RECORD, wheel_name)?;
    parse_record(&text, dist_info, wheel_name, |_| false)
}

/// `RECORD`'s lines: each path's sha256 (hex) and length. A line without
/// a hash is refused, but for RECORD itself and the paths `unhashed` lets
/// through (an installed copy's byte code, which is never read).
pub(super) fn parse_record(
    text: &str,
    dist_info: &str,
    wheel_name: &str,
    unhashed: impl Fn(&str) -> bool,
) -> Result<HashMap<String, (String, Option<u64>)>, LibraryError> {
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| LibraryError::Refused {
            file: wheel_name.to_owned(),
            why: format!("RECORD line {}: {why}", n + 1),
        };
        // path,sha256=<urlsafe base64>,size. gpuarch's kinds have no comma
        // or quote in their paths; a line that has one is refused.
        let mut parts = line.rsplitn(3, ',');
        let (Some(size), Some(hash), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("not path,hash,size"));
        };
        if path.contains('"') {
            return Err(bad("a quoted path"));
        }
        if hash.is_empty() {
            if path == format!("{dist_info}/RECORD") || unhashed(path) {
                continue;
            }
            return Err(bad("no hash"));
        }
        let b64 = hash
            .strip_prefix("sha256=")
            .ok_or_else(|| bad("not a sha256"))?;
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64.trim_end_matches('='))
            .map_err(|_| bad("the hash is not base64"))?;
        if digest.len() != 32 {
            return Err(bad("the hash is not 32 bytes"));
        }
        let len = if size.is_empty() {
            None
        } else {
            Some(size.parse().map_err(|_| bad("the size is not a number"))?)
        };
        if out
            .insert(path.to_owned(), (crate::spec::hex(&digest), len))
            .is_some()
        {
            return Err(bad("a path listed twice"));
        }
    }
    Ok(out)
}

/// Refuse a wheel that is not the version asked for (a pull).
pub(super) fn check_expected(
    source: &Source<'_>,
    kind: &LibraryKind,
    version: &str,
) -> Result<(), LibraryError> {
    match source.expect {
        Some((dist, want)) if (kind.dist, version) != (dist, want) => Err(LibraryError::Refused {
            file: source.name.to_owned(),
            why: format!(
                "the wheel is {} {version}, not the {dist} {want} asked for",
                kind.dist
            ),
        }),
        _ => Ok(()),
    }
}

/// An import being staged in `<root>/tmp/import-<dist>-<version>.*/files`:
/// each file copied in, bounded and held to RECORD as it is read. What is
/// left of it when dropped (a refused import) is removed.
pub(super) struct Staging<'a> {
    root: &'a Path,
    tmp: PathBuf,
    kind: &'static LibraryKind,
    version: &'a str,
    source: &'a Source<'a>,
    limits: &'a Limits,
    /// What the source's files are called in a bound's message: `members`.
    unit: &'static str,
    files: BTreeMap<String, FileInfo>,
    total: u64,
}

impl Drop for Staging<'_> {
    fn drop(&mut self) {
        if self.tmp.exists() {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

impl<'a> Staging<'a> {
    pub(super) fn new(
        root: &'a Path,
        kind: &'static LibraryKind,
        version: &'a str,
        source: &'a Source<'a>,
        limits: &'a Limits,
        unit: &'static str,
    ) -> Result<Self, LibraryError> {
        let tmp = root.join("tmp").join(format!(
            "import-{}-{version}.{}.{}",
            kind.dist,
            std::process::id(),
            seq()
        ));
        let files_dir = tmp.join("files");
        std::fs::create_dir_all(&files_dir).map_err(io_at(&files_dir))?;
        Ok(Self {
            root,
            tmp,
            kind,
            version,
            source,
            limits,
            unit,
            files: BTreeMap::new(),
            total: 0,
        })
    }

    fn refused(&self, why: String) -> LibraryError {
        LibraryError::Refused {
            file: self.source.name.to_owned(),
            why,
        }
    }

    /// Copy `from` (`what`, as messages name it) in: kept at `served`
    /// below the kind's root, or only hashed when `None`; within what the
    /// limits leave; and held to RECORD's `want` (sha256, length) if given.
    pub(super) fn add(
        &mut self,
        from: impl Read,
        what: &str,
        served: Option<&str>,
        want: Option<&(String, Option<u64>)>,
    ) -> Result<(), LibraryError> {
        let room = self
            .limits
            .max_file_bytes
            .min(self.limits.max_bytes - self.total);
        let copied = match served {
            Some(rel) => {
                let to = self.tmp.join("files").join(rel);
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent).map_err(io_at(parent))?;
                }
                let out = create_readonly(&to).map_err(io_at(&to))?;
                copy_hashed(from, &out, room)
            }
            None => copy_hashed(from, io::sink(), room),
        };
        let (got, bytes) = copied.map_err(|e| match e.kind() {
            io::ErrorKind::FileTooLarge => LibraryError::TooLarge {
                what: format!("{}: {what} or the {} together", self.source.name, self.unit),
                limit: room,
            },
            _ => self.refused(format!("{what}: {e}")),
        })?;
        self.total += bytes;
        if let Some((want_sha, want_len)) = want
            && (*want_sha != got || want_len.is_some_and(|l| l != bytes))
        {
            return Err(self.refused(format!(
                "{what}: sha256 {got} ({bytes} bytes) differs from RECORD's"
            )));
        }
        if let Some(rel) = served {
            self.files.insert(
                rel.to_owned(),
                FileInfo {
                    sha256: got,
                    bytes,
                    targets: Vec::new(),
                },
            );
        }
        Ok(())
    }

    /// Hold the staged files to the library's own lists, read each file's
    /// targets, write the index (`sha256`: of the wheel, or of an installed
    /// copy's RECORD) and put the import in place.
    pub(super) fn finish(mut self, sha256: String) -> Result<Index, LibraryError> {
        let kind = self.kind;
        let files_dir = self.tmp.join("files");
        let mut files = std::mem::take(&mut self.files);
        if files.is_empty() {
            return Err(self.refused(format!("no files under {}", kind.root)));
        }
        let missing = check_lists(&files_dir, &files).map_err(|e| self.refused(e.to_string()))?;
        for (rel, info) in files.iter_mut() {
            info.targets =
                targets(&files_dir.join(rel), rel).map_err(|e| self.refused(e.to_string()))?;
        }
        let index = Index {
            schema: SCHEMA,
            dist: kind.dist.to_owned(),
            version: self.version.to_owned(),
            source: self.source.name.to_owned(),
            origin: self.source.origin.map(str::to_owned),
            sha256,
            imported_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            files,
            missing,
        };
        let body = serde_json::to_vec(&index).map_err(|e| self.refused(e.to_string()))?;
        let ipath = self.tmp.join(INDEX);
        std::fs::write(&ipath, body).map_err(io_at(&ipath))?;
        // One flush of the filesystem, not one per file: a wheel has
        // thousands.
        let d = std::fs::File::open(&self.tmp).map_err(io_at(&self.tmp))?;
        nix::unistd::syncfs(&d).map_err(|e| io_at(&self.tmp)(e.into()))?;
        // `tmp` is then gone, or the version it replaced, for Drop.
        place(self.root, kind, self.version, &self.tmp)?;
        Ok(index)
    }
}

fn read_member<R: Read + io::Seek>(
    zip: &mut zip::ZipArchive<R>,
    name: &str,
    limit: u64,
    wheel_name: &str,
) -> Result<String, LibraryError> {
    let refused = |why: String| LibraryError::Refused {
        file: wheel_name.to_owned(),
        why,
    };
    let m = zip
        .by_name(name)
        .map_err(|e| refused(format!("{name}: {e}")))?;
    let mut text = String::new();
    m.take(limit + 1)
        .read_to_string(&mut text)
        .map_err(|e| refused(format!("{name}: {e}")))?;
    if text.len() as u64 > limit {
        return Err(LibraryError::TooLarge {
            what: format!("{wheel_name}: {name}"),
            limit,
        });
    }
    Ok(text)
}

fn create_readonly(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
}

/// Put the staged import `tmp` in place as `<root>/<dist>/<version>`,
/// replacing one already there in one step.
fn place(root: &Path, kind: &LibraryKind, version: &str, tmp: &Path) -> Result<(), LibraryError> {
    let dest = version_dir(root, kind.dist, version);
    let parent = root.join(kind.dist);
    std::fs::create_dir_all(&parent).map_err(io_at(&parent))?;
    match std::fs::rename(tmp, &dest) {
        Ok(()) => return Ok(()),
        Err(e)
            if !matches!(
                e.raw_os_error(),
                Some(nix::libc::ENOTEMPTY | nix::libc::EEXIST)
            ) =>
        {
            return Err(io_at(&dest)(e));
        }
        Err(_) => {}
    }
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        tmp,
        nix::fcntl::AT_FDCWD,
        &dest,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .map_err(|e| io_at(&dest)(e.into()))?;
    // `tmp` is now the version replaced; the caller removes it.
    Ok(())
}
