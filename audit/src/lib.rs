//! The image audit: which CUDA binaries an image carries, and the SASS and
//! PTX in each, so that whether they run on a container's GPUs can be said
//! before a kernel fails (`gpuarchctl audit`, gpuarchd's audit worker).
//!
//! Where it looks:
//! - each Python environment the image's process would import from, found
//!   as the image read finds them (`gpuarch_container::image::sites`): every
//!   installed distribution's `RECORD` names its files, and those that may
//!   hold GPU code (shared libraries, cubins, fatbins, PTX) are read, each
//!   owned by its distribution and release;
//! - the library path: `LD_LIBRARY_PATH`'s directories and
//!   `/usr/local/cuda/lib64`, their `lib*.so*` files (links skipped: a
//!   library is read once, under its real name);
//! - Hugging Face's hub cache (where `kernels` keeps its builds) and
//!   FlashInfer's cubin cache, walked to a bounded depth.
//!
//! Every path is resolved through the handle confined to the image's root
//! ([`Root`]): a link in the image never leads out of it. A file is
//! opened only when it is a regular file, then mapped, not read into the
//! heap: the inspector touches the ELF headers and the `.nv_fatbin`
//! section, and a 435 MiB `libtorch_cuda.so` costs page cache, not the
//! reader's memory. A file truncated while it is mapped ends the reader
//! (`SIGBUS`): gpuarchd runs it in a worker process for that reason, and
//! the worker and gpuarchctl name the file as they exit
//! (`gpuarch_kernels::file::exit_clearly_on_sigbus`).
//!
//! Bounded by [`Limits`]: files, bytes, one file's size, time. Past one,
//! the audit says where it stopped (`ImageAudit::stopped`), and what was
//! listed is some of the image's binaries, not all.

use std::collections::HashSet;
use std::io::Read as _;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuarch_container::audit::Source;
use gpuarch_container::image::{Files, Layers};
use gpuarch_container::rootfs::Root;
use gpuarch_core::audit::{
    Binary, CACHE_OWNERS, ImageAudit, LIBRARY_PATH_OWNER, SCHEMA, candidate,
};
use gpuarch_core::oci::ContainerView;
use gpuarch_kernels::inspect::{self, InspectError};
use nix::dir::Type;
use nix::errno::Errno;

/// The audit's bounds.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most candidate files opened.
    pub max_files: u64,
    /// Most bytes of them mapped, in all.
    pub max_bytes: u64,
    /// Largest file read; a larger one is named in `unread`.
    pub max_file: u64,
    /// Longest the audit runs.
    pub deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files: 50_000,
            max_bytes: 64 << 30,
            max_file: 8 << 30,
            deadline: Duration::from_secs(300),
        }
    }
}

/// Most bytes of a distribution's `RECORD` read (torch's is 2 MB).
const MAX_RECORD: usize = 32 << 20;
/// Most bytes of a `METADATA` read: its headers come first.
const MAX_METADATA: usize = 64 << 10;
/// Most entries of one directory listed.
const MAX_DIR_ENTRIES: usize = 1 << 16;
/// Deepest a cache directory is walked.
const MAX_DEPTH: usize = 8;
/// Most `LD_LIBRARY_PATH` entries taken.
const MAX_LIBRARY_DIRS: usize = 32;
/// Longest the environments' discovery runs, and most entries it lists.
const DISCOVERY_TIME: Duration = Duration::from_secs(10);
const DISCOVERY_ENTRIES: usize = 1 << 20;

/// Audit the image `root` (a rootfs or a snapshot's layers) for the
/// process of `view` (its env and user decide which environments and
/// caches are its own).
pub fn audit(root: Files<'_>, view: &ContainerView, limits: &Limits) -> ImageAudit {
    let start = Instant::now();
    let mut a = Auditor {
        root,
        limits,
        until: start + limits.deadline,
        seen: HashSet::new(),
        out: ImageAudit {
            schema: SCHEMA,
            ..Default::default()
        },
    };
    match root.sites(view, DISCOVERY_ENTRIES, limits.deadline.min(DISCOVERY_TIME)) {
        Ok((sites, unread)) => {
            a.out.unread.extend(unread);
            for site in sites {
                a.site(&site);
            }
        }
        Err(e) => a
            .out
            .unread
            .push(format!("the image's Python environments: {e}")),
    }
    // A directory that is itself a venv or a prefix (`gpuarchctl audit
    // .venv`): its own `lib/python3*/site-packages`.
    if let Ok(libs) = a.list("lib") {
        for (py, _) in libs {
            if py.starts_with("python3") {
                let site = format!("lib/{py}/site-packages");
                if !a.out.read.contains(&format!("/{site}")) && a.list(&site).is_ok() {
                    a.site(&site);
                }
            }
        }
    }
    for (dir, owner, depth) in other_dirs(view) {
        a.walk(&dir, &owner, depth);
    }
    a.out.millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    a.out
}

/// The directories beside the Python environments: (path inside the
/// image, owner as the audit names it, depth walked).
fn other_dirs(view: &ContainerView) -> Vec<(String, String, usize)> {
    let [hub_owner, kernels_owner, flashinfer_owner] = CACHE_OWNERS;
    let mut dirs = Vec::new();
    let mut libs: Vec<String> = view
        .env_get("LD_LIBRARY_PATH")
        .unwrap_or("")
        .split(':')
        .take(MAX_LIBRARY_DIRS)
        .filter_map(rel_of)
        .collect();
    libs.push("usr/local/cuda/lib64".into());
    for l in libs {
        let owner = format!("{LIBRARY_PATH_OWNER}/{l}");
        dirs.push((l, owner, 0));
    }
    let home = view
        .env_get("HOME")
        .and_then(rel_of)
        .unwrap_or_else(|| match view.user {
            Some((0, _)) | None => "root".into(),
            Some(_) => String::new(),
        });
    let under_home = |p: &str| (!home.is_empty()).then(|| format!("{home}/{p}"));
    let hub = view
        .env_get("HF_HUB_CACHE")
        .and_then(rel_of)
        .or_else(|| {
            view.env_get("HF_HOME")
                .and_then(rel_of)
                .map(|h| format!("{h}/hub"))
        })
        .or_else(|| under_home(".cache/huggingface/hub"));
    if let Some(h) = hub {
        dirs.push((h, hub_owner.into(), MAX_DEPTH));
    }
    if let Some(k) = view.env_get("KERNELS_CACHE").and_then(rel_of) {
        dirs.push((k, kernels_owner.into(), MAX_DEPTH));
    }
    let fi = view
        .env_get("FLASHINFER_CUBIN_DIR")
        .and_then(rel_of)
        .or_else(|| under_home(".cache/flashinfer"));
    if let Some(f) = fi {
        dirs.push((f, flashinfer_owner.into(), MAX_DEPTH));
    }
    dirs
}

/// An env value's path relative to the image's `/`
/// (`gpuarch_container::image::rel_of`): None for a relative path.
fn rel_of(path: &str) -> Option<String> {
    gpuarch_container::image::rel_of(Path::new(path))
}

/// `rel` joined to directory `base` (both inside the image), `..` and `.`
/// taken lexically; never above the image's `/`.
fn join(base: &str, rel: &str) -> String {
    gpuarch_container::image::rel_of(&Path::new("/").join(base).join(rel)).unwrap_or_default()
}

struct Auditor<'a> {
    root: Files<'a>,
    limits: &'a Limits,
    until: Instant,
    seen: HashSet<String>,
    out: ImageAudit,
}

impl Auditor<'_> {
    /// Whether a bound was reached; the first time, say which.
    fn stopped(&mut self) -> bool {
        if self.out.stopped.is_some() {
            return true;
        }
        let why = if Instant::now() > self.until {
            format!("over {} s", self.limits.deadline.as_secs_f64())
        } else if self.out.files >= self.limits.max_files {
            format!("over {} files", self.limits.max_files)
        } else if self.out.bytes >= self.limits.max_bytes {
            format!("over {} bytes", self.limits.max_bytes)
        } else {
            return false;
        };
        self.out.stopped = Some(why);
        true
    }

    /// The names in directory `rel`, sorted, with their types where the
    /// filesystem gives them.
    fn list(&self, rel: &str) -> Result<Vec<(String, Option<Type>)>, Errno> {
        self.root.list(rel, MAX_DIR_ENTRIES)
    }

    /// Each distribution of site `site` with a `RECORD`: its candidate files.
    fn site(&mut self, site: &str) {
        if self.stopped() {
            return;
        }
        let names = match self.list(site) {
            Ok(n) => n,
            Err(e) => {
                self.out.unread.push(format!("/{site}: {e}"));
                return;
            }
        };
        self.out.read.push(format!("/{site}"));
        for (name, _) in names {
            if !name.ends_with(".dist-info") || self.stopped() {
                continue;
            }
            let info = format!("{site}/{name}");
            let owner = self.owner(&info, &name);
            let record = match self
                .root
                .read_regular(&format!("{info}/RECORD"), MAX_RECORD)
            {
                Ok(r) => r,
                Err(Errno::ENOENT) => continue,
                Err(e) => {
                    self.out.unread.push(format!("/{info}/RECORD: {e}"));
                    continue;
                }
            };
            for path in record_paths(&record) {
                let file = path.rsplit('/').next().unwrap_or(&path);
                if candidate(file) {
                    let rel = join(site, &path);
                    self.file(&rel, &owner);
                    if self.stopped() {
                        return;
                    }
                }
            }
        }
    }

    /// `Name Version` of the distribution whose metadata is `info`, from
    /// its `METADATA`, else from the entry's name.
    fn owner(&self, info: &str, entry: &str) -> String {
        let meta = self
            .root
            .read_regular(&format!("{info}/METADATA"), MAX_METADATA)
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&meta);
        let header = |k: &str| {
            text.lines()
                .take_while(|l| !l.is_empty())
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_owned())
        };
        match (header("Name:"), header("Version:")) {
            (Some(n), Some(v)) => format!("{n} {v}"),
            _ => {
                let stem = entry.trim_end_matches(".dist-info");
                match stem.split_once('-') {
                    Some((n, v)) => format!("{n} {v}"),
                    None => stem.to_owned(),
                }
            }
        }
    }

    /// The candidate files under `dir`, to `depth` levels of directories.
    fn walk(&mut self, dir: &str, owner: &str, depth: usize) {
        if self.stopped() {
            return;
        }
        let Ok(names) = self.list(dir) else {
            return;
        };
        if !self.out.read.iter().any(|r| r == &format!("/{dir}")) {
            self.out.read.push(format!("/{dir}"));
        }
        for (name, ty) in names {
            if self.stopped() {
                return;
            }
            let rel = join(dir, &name);
            match ty {
                Some(Type::Symlink) => {}
                Some(Type::Directory) if depth > 0 => self.walk(&rel, owner, depth - 1),
                Some(Type::File) | None if candidate(&name) => self.file(&rel, owner),
                _ => {}
            }
        }
    }

    /// Read one candidate file; list it when it holds GPU code.
    fn file(&mut self, rel: &str, owner: &str) {
        if !self.seen.insert(rel.to_owned()) {
            return;
        }
        // Opened only where it is a regular file (a FIFO would block).
        let (file, size) = match self.root.open_regular(rel) {
            Ok(Some(x)) => x,
            Ok(None) | Err(Errno::ENOENT) => return,
            Err(e) => {
                self.out.unread.push(format!("/{rel}: {e}"));
                return;
            }
        };
        if size == 0 {
            return;
        }
        if size > self.limits.max_file {
            self.out.unread.push(format!(
                "/{rel}: {size} bytes, over the {} bytes read of one file",
                self.limits.max_file
            ));
            return;
        }
        self.out.files += 1;
        self.out.bytes += size;
        // Mapped, not read into the heap. A file truncated meanwhile raises
        // SIGBUS on access: see the module's note (gpuarchd's worker), and
        // the Reading that names it where the program asked.
        let map = match gpuarch_kernels::file::Mapped::new(&file) {
            Ok(m) => m,
            Err(e) => {
                self.out.unread.push(format!("/{rel}: {e}"));
                return;
            }
        };
        let _reading = gpuarch_kernels::file::Reading::of(Path::new(&format!("/{rel}")));
        match inspect::summarize_mapped(&map) {
            // Code with no kernel in it (a wrapper library's placeholder
            // cubin: cuFFTW's) launches nothing, wherever it runs. Code
            // whose kernels could not be read (compressed) counts.
            Ok(objs) if objs.iter().all(|o| o.verified && o.functions.is_empty()) => {}
            Ok(objs) => {
                let mut code: Vec<String> = objs.iter().map(|o| o.target.to_string()).collect();
                code.sort();
                code.dedup();
                self.out.binaries.push(Binary {
                    path: format!("/{rel}"),
                    owner: owner.to_owned(),
                    size,
                    code,
                });
            }
            Err(InspectError::Unrecognised) => {}
            Err(e) => self.out.unread.push(format!("/{rel}: {e}")),
        }
    }
}

/// The paths a `RECORD` (CSV: path, hash, size) names, relative to its
/// site. A path with a comma is quoted, a quote in it doubled.
fn record_paths(record: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(record);
    text.lines()
        .filter_map(|line| {
            let line = line.trim_end_matches('\r');
            if let Some(rest) = line.strip_prefix('"') {
                let mut out = String::new();
                let mut chars = rest.chars().peekable();
                while let Some(c) = chars.next() {
                    if c == '"' {
                        if chars.peek() == Some(&'"') {
                            chars.next();
                            out.push('"');
                        } else {
                            return Some(out);
                        }
                    } else {
                        out.push(c);
                    }
                }
                None
            } else {
                let p = line.split(',').next().unwrap_or("");
                (!p.is_empty()).then(|| p.to_owned())
            }
        })
        .collect()
}

/// What gpuarchd's audit worker is given on its standard input.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct WorkerInput {
    pub request: gpuarch_container::audit::Request,
    /// The image read's key the start found: the rootfs opened must be
    /// that image (not another mount namespace's empty directory, not a
    /// rootfs replaced since).
    pub key: String,
    pub max_seconds: u64,
}

/// Most bytes of a worker's input read.
pub const MAX_WORKER_INPUT: u64 = 256 << 10;

/// Why the audit worker did not audit.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("reading the request: {0}")]
    Read(#[source] std::io::Error),
    #[error("the request: {0}")]
    Request(#[source] serde_json::Error),
    #[error("{}: {error}", .rootfs.display())]
    Root {
        rootfs: std::path::PathBuf,
        error: gpuarch_container::rootfs::RootfsError,
    },
    #[error("the image's layers: {0}")]
    Layers(#[source] std::io::Error),
    #[error(
        "{0} is not the image the start read (its environments' identity differs: another mount namespace, a rootfs replaced or a snapshot removed since)"
    )]
    NotTheImage(String),
    #[error("{0}: the image's environments could not be read to identify it")]
    Unidentified(String),
    #[error("writing the audit: {0}")]
    Write(#[source] std::io::Error),
}

/// `gpuarchd --audit-worker`: a [`WorkerInput`] on `input`, the
/// [`ImageAudit`] as JSON on `output`. The rootfs is opened as the
/// image's root, or the layers as the merged view of them: nothing in
/// either leads out.
pub fn serve(
    input: impl std::io::Read,
    mut output: impl std::io::Write,
) -> Result<(), WorkerError> {
    let mut bytes = Vec::new();
    input
        .take(MAX_WORKER_INPUT)
        .read_to_end(&mut bytes)
        .map_err(WorkerError::Read)?;
    let w: WorkerInput = serde_json::from_slice(&bytes).map_err(WorkerError::Request)?;
    let (root, layers);
    let (files, what) = match w.request.source() {
        Source::Rootfs(rootfs) => {
            root = Root::open(&rootfs).map_err(|error| WorkerError::Root {
                rootfs: rootfs.clone(),
                error,
            })?;
            (Files::Root(&root), rootfs.display().to_string())
        }
        Source::Layers(dirs) => {
            if let Some(d) = dirs.iter().find(|d| !d.is_absolute()) {
                let why = format!("{}: a relative path", d.display());
                return Err(WorkerError::Layers(std::io::Error::other(why)));
            }
            layers = Layers::open(&dirs).map_err(WorkerError::Layers)?;
            let what = format!(
                "the {} layers of {}",
                dirs.len(),
                dirs.first()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            );
            (Files::Layers(&layers), what)
        }
    };
    let mut view = ContainerView::with_env(w.request.env);
    view.user = w.request.user;
    match files.identify(&view) {
        Some(k) if k == w.key => {}
        Some(_) => return Err(WorkerError::NotTheImage(what)),
        None => return Err(WorkerError::Unidentified(what)),
    }
    let limits = Limits {
        deadline: Duration::from_secs(w.max_seconds),
        ..Limits::default()
    };
    let mut a = audit(files, &view, &limits);
    a.images = w.request.images;
    serde_json::to_writer(&mut output, &a).map_err(|e| WorkerError::Write(e.into()))?;
    output.flush().map_err(WorkerError::Write)
}

#[cfg(test)]
mod tests;
