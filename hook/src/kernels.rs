//! Kernel packages mounted into containers.
//!
//! The daemon prepares each package under `kernels.mount_root` (default
//! `/var/lib/gpuarch/kernels`) as `<package>/manifest.json` plus its files.
//! The hook reads only the manifest's `targets` (`["sm_75", "sm_86"]`): a
//! package is mounted, read-only, at `/opt/gpuarch/kernels/<package>` when
//! every GPU the container was given can run one of them. Which file serves
//! which GPU is the manifest's business, read by the software inside.
//!
//! A manifest gpuarchd publishes also lists `builds`: one per arch, each a
//! directory of the kernel store. Then the container gets exactly the
//! builds that serve its GPUs, through one directory made here for it: the
//! container's view (under `kernels.view_dir`, named by the sha256 of what
//! it holds, so containers given the same GPUs share one). The view holds,
//! per published package, a `manifest.json` that maps each GPU, by
//! container index and UUID, to its file and variant, and per build a
//! directory named by its arch holding hard links of the build's files.
//! The whole view is one read-only mount at `/opt/gpuarch/kernels`; a
//! hand-made package is bound on its own on an empty directory of the view.
//! A view directory off the store's filesystem cannot link: each build is
//! then bound read-only on its directory instead. A container that mounts
//! something of its own under `/opt/gpuarch/kernels` gets each package
//! bound on its own (its own mounts win). A GPU with no build of its own
//! arch is a miss: a request file `<package>@<arch>` goes into
//! `kernels.spool_dir` for gpuarchd to build, and the container starts now
//! with what there is.
//!
//! A manifest may also list `libraries`: directories of the package (such
//! as `lib`) holding shared libraries. Those need the loader cache inside
//! the container updated, which only a hook running at `createContainer`
//! can do, so only then is that entry added (see [`crate::stage`]).

use std::path::{Path, PathBuf};

use gpuarch_core::arch::{CodeKind, CudaVersion, Target};
use gpuarch_core::config::{KernelsConfig, valid_package_name as valid_name};
use gpuarch_core::plan::Plan;
use gpuarch_wire::manifest::{self as wire, Serves, View, ViewBuild, ViewGpu};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Where packages appear inside a container (`GPUARCH_KERNELS_DIR`).
pub const CONTAINER_DIR: &str = "/opt/gpuarch/kernels";

/// More packages than this under the mount root are not looked at.
pub const MAX_PACKAGES: usize = 256;
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// One package as a container gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelMount {
    pub package: String,
    /// Its directory: the package under the mount root (hand-made), or
    /// its directory in the container's view (published).
    pub source: PathBuf,
    /// Library directories, relative to the package (`lib`).
    pub libraries: Vec<String>,
    /// Store builds bound inside it: (subdirectory, source). Empty when the
    /// view holds hard links of their files.
    pub builds: Vec<(String, PathBuf)>,
}

impl KernelMount {
    pub fn destination(&self) -> String {
        format!("{CONTAINER_DIR}/{}", self.package)
    }

    /// The library directories as the container sees them.
    pub fn library_dirs(&self) -> Vec<String> {
        self.libraries
            .iter()
            .map(|l| format!("{}/{l}", self.destination()))
            .collect()
    }
}

/// The kernel packages for one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kernels {
    /// The container's view: every published package that serves it, and
    /// an empty directory for each hand-made one. None when no published
    /// package serves it.
    pub view: Option<PathBuf>,
    /// Sorted by name.
    pub packages: Vec<KernelMount>,
}

/// One read-only bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    pub destination: String,
}

impl Bind {
    /// The OCI `mounts` entry.
    pub fn to_oci(&self) -> Value {
        json!({
            "destination": self.destination,
            "type": "bind",
            "source": self.source,
            "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
        })
    }
}

impl Kernels {
    pub fn is_empty(&self) -> bool {
        self.packages.is_empty()
    }

    /// The binds, in mount order, that show these packages in a container
    /// whose own mounts have `existing` destinations, and the packages they
    /// show; a note for each package left out and each shown.
    ///
    /// The view is one bind at [`CONTAINER_DIR`], then each hand-made
    /// package and each bound build on its directory in it. A container
    /// that mounts anything under [`CONTAINER_DIR`] itself gets each
    /// package on its own instead, and none whose directory it mounts; one
    /// that mounts [`CONTAINER_DIR`] gets none.
    pub fn binds(
        &self,
        existing: &[&str],
        notes: &mut Vec<String>,
    ) -> (Vec<Bind>, Vec<&KernelMount>) {
        let mut binds = Vec::new();
        let mut shown = Vec::new();
        if self.packages.is_empty() {
            return (binds, shown);
        }
        let norm = |d: &str| d.trim_end_matches('/').to_owned();
        let existing: Vec<String> = existing.iter().map(|d| norm(d)).collect();
        if existing.iter().any(|d| d == CONTAINER_DIR) {
            notes.push(format!(
                "{CONTAINER_DIR} is already mounted by the container: no kernel packages mounted"
            ));
            return (binds, shown);
        }
        let prefix = format!("{CONTAINER_DIR}/");
        let whole = match &self.view {
            Some(v) if !existing.iter().any(|d| d.starts_with(&prefix)) => Some(v),
            _ => None,
        };
        if let Some(view) = whole {
            binds.push(Bind {
                source: view.clone(),
                destination: CONTAINER_DIR.to_owned(),
            });
        }
        for p in &self.packages {
            let dest = p.destination();
            if existing.contains(&dest) {
                notes.push(format!(
                    "{dest} is already mounted by the container: kernel package {} not mounted",
                    p.package
                ));
                continue;
            }
            // A published package is in the view, which shows it.
            if !whole.is_some_and(|v| p.source.starts_with(v)) {
                binds.push(Bind {
                    source: p.source.clone(),
                    destination: dest.clone(),
                });
            }
            for (sub, src) in &p.builds {
                binds.push(Bind {
                    source: src.clone(),
                    destination: format!("{dest}/{sub}"),
                });
            }
            shown.push(p);
        }
        if !shown.is_empty() {
            let names: Vec<&str> = shown.iter().map(|p| p.package.as_str()).collect();
            notes.push(format!(
                "kernel packages mounted read-only in {CONTAINER_DIR} ({} mount{}): {}",
                binds.len(),
                if binds.len() == 1 { "" } else { "s" },
                names.join(", ")
            ));
        }
        (binds, shown)
    }
}

/// What the hook reads of a package's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub targets: Vec<Target>,
    pub libraries: Vec<String>,
    /// Builds in the kernel store, when gpuarchd published the package.
    pub builds: Option<Vec<Build>>,
    pub version: String,
    /// Files an admin imported: served by whatever runs (PTX too), never
    /// requested.
    pub imported: bool,
    /// One imported file for all the container's GPUs, in its loader cache.
    pub ldconfig: bool,
}

/// One build of a published package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    pub arch: Target,
    pub variant: String,
    pub dtype: Option<String>,
    pub dir: PathBuf,
    pub files: Vec<String>,
    /// The store entry's key.
    pub key: String,
    /// Its directory in the container's view: the arch of a build, the
    /// file name of an import (one file carries several archs).
    pub view: String,
}

/// Why a package's manifest could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{0}")]
    Read(#[from] crate::context::ReadError),
    #[error("{0}")]
    Format(#[from] gpuarch_wire::manifest::ManifestError),
    #[error("target {target:?}: {source}")]
    Target {
        target: String,
        #[source]
        source: gpuarch_core::arch::ArchError,
    },
    #[error("build dir {0} is not absolute")]
    RelativeDir(PathBuf),
    #[error("library directory {0:?} is not a relative path inside the package")]
    Library(String),
}

fn target(t: &str) -> Result<Target, ManifestError> {
    Target::parse(t).map_err(|source| ManifestError::Target {
        target: t.to_owned(),
        source,
    })
}

fn read_build(b: wire::Build, imported: bool) -> Result<Build, ManifestError> {
    if !b.dir.is_absolute() {
        return Err(ManifestError::RelativeDir(b.dir));
    }
    let arch = target(&b.arch)?;
    let view = if imported {
        if !valid_name(&b.variant) {
            return Err(ManifestError::Library(b.variant));
        }
        b.variant.clone()
    } else {
        arch.to_string()
    };
    Ok(Build {
        view,
        arch,
        variant: b.variant,
        dtype: b.dtype,
        dir: b.dir,
        files: b.files.into_iter().filter(|f| valid_name(f)).collect(),
        key: b.key,
    })
}

/// A library directory must stay inside its package: relative, plain names.
fn valid_subdir(d: &str) -> bool {
    !d.is_empty() && d.len() <= 256 && d.split('/').all(valid_name)
}

/// Read `manifest.json` (at most 1 MiB), either shape
/// ([`gpuarch_wire::manifest`]).
pub fn read_manifest(manifest: &Path) -> Result<Manifest, ManifestError> {
    let f = std::fs::File::open(manifest).map_err(crate::context::ReadError::from)?;
    let bytes = crate::context::read_at_most(f, MAX_MANIFEST_BYTES)?;
    match wire::read(&bytes)? {
        wire::Manifest::HandMade(h) => Ok(Manifest {
            targets: h
                .targets
                .iter()
                .map(|t| target(t))
                .collect::<Result<_, _>>()?,
            libraries: h
                .libraries
                .into_iter()
                .map(|d| {
                    if valid_subdir(&d) {
                        Ok(d)
                    } else {
                        Err(ManifestError::Library(d))
                    }
                })
                .collect::<Result<_, _>>()?,
            builds: None,
            version: h.version.unwrap_or_default(),
            imported: false,
            ldconfig: false,
        }),
        wire::Manifest::Published(p) => Ok(Manifest {
            targets: p
                .targets
                .iter()
                .map(|t| target(t))
                .collect::<Result<_, _>>()?,
            libraries: Vec::new(),
            builds: Some(
                p.builds
                    .into_iter()
                    .map(|b| read_build(b, p.imported))
                    .collect::<Result<_, _>>()?,
            ),
            version: p.version,
            imported: p.imported,
            ldconfig: p.ldconfig,
        }),
    }
}

/// The packages under `root` that serve every GPU of `plan`, laid out for
/// the container (see [`Kernels`]), and a note for each package skipped
/// and why. A missing `root` is no packages.
pub fn discover(cfg: &KernelsConfig, plan: &Plan, driver_cuda: &str) -> (Kernels, Vec<String>) {
    let root = cfg.mount_root.as_path();
    let mut handmade = Vec::new();
    let mut notes = Vec::new();
    if plan.gpus.is_empty() {
        return (Kernels::default(), notes);
    }
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Kernels::default(), notes),
        Err(e) => {
            notes.push(format!(
                "no kernel mounts: cannot list {}: {e}",
                root.display()
            ));
            return (Kernels::default(), notes);
        }
    };
    let cuda = CudaVersion::parse(driver_cuda).ok();
    let mut names: Vec<String> = Vec::new();
    for entry in entries.flatten().take(MAX_PACKAGES + 1) {
        match entry.file_name().into_string() {
            Ok(n) if valid_name(&n) => names.push(n),
            Ok(n) if n.starts_with('.') => {}
            other => notes.push(format!(
                "kernel package {:?} skipped: not a valid package name",
                other.unwrap_or_else(|os| os.to_string_lossy().into_owned())
            )),
        }
    }
    if names.len() > MAX_PACKAGES {
        notes.push(format!(
            "more than {MAX_PACKAGES} kernel packages under {}: only the first {MAX_PACKAGES} are considered",
            root.display()
        ));
        names.truncate(MAX_PACKAGES);
    }
    names.sort();
    let objects = store_objects(cfg);
    let mut published = Vec::new();
    for name in names {
        let dir = root.join(&name);
        let man = match read_manifest(&dir.join("manifest.json")) {
            Ok(m) => m,
            Err(e) => {
                notes.push(format!("kernel package {name} skipped: manifest.json: {e}"));
                continue;
            }
        };
        if man.builds.is_some() {
            match serving(cfg, &objects, &name, &man, plan, cuda, &mut notes) {
                Ok(Some(s)) => published.push(s),
                Ok(None) => {}
                Err(e) => notes.push(format!("kernel package {name} not mounted: {e}")),
            }
            continue;
        }
        let Manifest {
            targets, libraries, ..
        } = man;
        let unserved = plan.gpus.iter().find(|g| {
            !targets
                .iter()
                .any(|t| t.check(g.compute_capability, cuda, None).runs)
        });
        match unserved {
            None => handmade.push(KernelMount {
                package: name,
                source: dir,
                libraries,
                builds: Vec::new(),
            }),
            Some(g) => notes.push(format!(
                "kernel package {name} not mounted: no build in it runs on {}",
                g.label()
            )),
        }
    }
    // Linked: the builds' files are hard links in the view, one mount in
    // all. That needs the view on the store's filesystem: told from the two
    // directories' devices, once, not by trying a link.
    let view_dir = cfg.view_dir();
    let linked =
        !published.is_empty() && same_filesystem(&view_dir, &cfg.cache_dir.join("objects"));
    if linked {
        // The view is named by the identity of every file linked in too,
        // so a build rebuilt under the same key (new inodes) gets a new
        // view rather than the old one's files.
        published.retain_mut(|p| match linked_ids(&p.used) {
            Ok(ids) => {
                p.ids = ids;
                true
            }
            Err(e) => {
                notes.push(format!(
                    "kernel package {} not mounted: a build to link: {e}",
                    p.name
                ));
                false
            }
        });
    } else if !published.is_empty() {
        notes.push(format!(
            "{} is not on the kernel store's filesystem, so each build is one more mount; leave kernels.view_dir unset (it is then {}/views)",
            view_dir.display(),
            cfg.cache_dir.display()
        ));
    }
    let view = if published.is_empty() {
        None
    } else {
        match lay_out(&view_dir, &published, &handmade, linked) {
            Ok(v) => Some(v),
            Err(source) => {
                let e = ViewError::Layout {
                    dir: view_dir,
                    source,
                };
                let names: Vec<&str> = published.iter().map(|p| p.name.as_str()).collect();
                notes.push(format!(
                    "kernel packages {} not mounted: {e}",
                    names.join(", ")
                ));
                None
            }
        }
    };
    let Some(view) = view else {
        return (
            Kernels {
                view: None,
                packages: handmade,
            },
            notes,
        );
    };
    let mut packages = handmade;
    packages.extend(published.into_iter().map(|p| KernelMount {
        source: view.join(&p.name),
        libraries: p.libraries,
        builds: if linked {
            Vec::new()
        } else {
            p.used
                .iter()
                .map(|b| (b.view.clone(), b.dir.clone()))
                .collect()
        },
        package: p.name,
    }));
    packages.sort_by(|a, b| a.package.cmp(&b.package));
    (
        Kernels {
            view: Some(view),
            packages,
        },
        notes,
    )
}

/// Leave a request for a build of `package` for `arch`; an existing request
/// is enough. Never fails the container: a failure is a note.
fn request(cfg: &KernelsConfig, package: &str, arch: Target, notes: &mut Vec<String>) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&cfg.spool_dir);
    let path = cfg.spool_dir.join(format!("{package}@{arch}"));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(_) => notes.push(format!(
            "kernel package {package}: no {arch} build yet; requested it from gpuarchd"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => notes.push(format!(
            "kernel package {package}: no {arch} build yet; already requested"
        )),
        Err(e) => notes.push(format!(
            "kernel package {package}: no {arch} build yet, and the request could not be left in {}: {e}",
            cfg.spool_dir.display()
        )),
    }
}

/// The store's `objects/` as configured, and with every symlink resolved
/// (None when it is absent).
struct Objects {
    configured: PathBuf,
    real: Option<PathBuf>,
}

fn store_objects(cfg: &KernelsConfig) -> Objects {
    let configured = cfg.cache_dir.join("objects");
    let real = configured.canonicalize().ok();
    Objects { configured, real }
}

/// Whether `dir` is, once every symlink is resolved, an entry under the
/// store's `objects/`. A manifest gpuarchd published names entries as
/// `<objects as configured>/<xx>/<key>`: that is an entry when neither of
/// the last two is a symlink (two `lstat`s, where resolving the whole path
/// costs one `readlink` per component, per build, per container start);
/// any other path is resolved in full.
fn in_store(objects: &Objects, dir: &Path) -> bool {
    use std::path::Component;
    let Some(real) = &objects.real else {
        return false;
    };
    if let Ok(rest) = dir.strip_prefix(&objects.configured) {
        let parts: Vec<Component> = rest.components().collect();
        if let [Component::Normal(shard), Component::Normal(_)] = parts[..] {
            let plain_dir =
                |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_dir());
            return plain_dir(&objects.configured.join(shard)) && plain_dir(dir);
        }
    }
    match dir.canonicalize() {
        Ok(d) => d.starts_with(real) && d != *real,
        Err(_) => false,
    }
}

/// Why the packages of the store could not be laid out for a container.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot lay out its view in {}: {source}", dir.display())]
    Layout {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A published package that serves the container: its view manifest and
/// the builds it uses.
struct Serving {
    name: String,
    /// `manifest.json` as the container sees it.
    body: Vec<u8>,
    used: Vec<Build>,
    /// Device and inode of each file of `used`, when linked.
    ids: Vec<(u64, u64)>,
    /// Its directories for the container's loader cache.
    libraries: Vec<String>,
}

/// Which build of a published package serves each GPU. None (with a note)
/// when no build serves any of them yet.
///
/// A build serves a GPU with the highest SASS that runs on it; an import
/// also with the highest PTX when no SASS does. An import with `ldconfig`
/// is one file for every GPU: the one whose code runs on all of them,
/// preferring SASS on more GPUs, then exact archs, then the higher code.
fn serving(
    cfg: &KernelsConfig,
    objects: &Objects,
    name: &str,
    man: &Manifest,
    plan: &Plan,
    cuda: Option<CudaVersion>,
    notes: &mut Vec<String>,
) -> Result<Option<Serving>, ViewError> {
    let mut gpus = Vec::new();
    let mut used: Vec<&Build> = Vec::new();
    // Only the store's own entries are ever mounted: a manifest naming any
    // other directory (a host path, a symlink out of the store) is refused.
    let (mut builds, outside): (Vec<&Build>, Vec<&Build>) = man
        .builds
        .iter()
        .flatten()
        .partition(|b| in_store(objects, &b.dir));
    for b in outside {
        notes.push(format!(
            "{name}: build {} not used: {} is not an entry of the store {}",
            b.arch,
            b.dir.display(),
            cfg.cache_dir.join("objects").display()
        ));
    }
    builds.retain(|b| b.dir.is_dir());
    // The best build for one GPU: SASS over PTX, then the highest arch
    // (the exact one over another of its family).
    let imported = man.imported;
    if man.ldconfig {
        let mut files: Vec<&str> = builds.iter().map(|b| b.view.as_str()).collect();
        files.sort_unstable();
        files.dedup();
        let score = |file: &str| {
            let of: Vec<&Build> = builds.iter().copied().filter(|b| b.view == file).collect();
            let mut s = (0, 0, None);
            for g in &plan.gpus {
                let b = best_for(&of, g.compute_capability, cuda, imported)?;
                s.0 += usize::from(b.arch.kind == CodeKind::Sass);
                s.1 += usize::from(b.arch.cap == g.compute_capability);
                s.2 = s.2.max(Some(b.arch));
            }
            Some(s)
        };
        let Some(file) = files
            .into_iter()
            .filter_map(|f| score(f).map(|s| (s, f)))
            .max()
            .map(|(_, f)| f.to_owned())
        else {
            let gpus: Vec<String> = plan.gpus.iter().map(|g| g.label()).collect();
            notes.push(format!(
                "kernel package {name} not mounted: no imported file runs on all of {}",
                gpus.join(", ")
            ));
            return Ok(None);
        };
        builds.retain(|b| b.view == file);
    }
    for (i, g) in plan.gpus.iter().enumerate() {
        let cap = g.compute_capability;
        let own = Target::sass(cap);
        if !man.imported && !builds.iter().any(|b| b.arch == own) {
            request(cfg, name, own, notes);
        }
        let serves = match best_for(&builds, cap, cuda, imported) {
            Some(b) => {
                if !used.iter().any(|u| u.view == b.view) {
                    used.push(b);
                }
                Serves::Build {
                    arch: b.arch.to_string(),
                    variant: b.variant.clone(),
                    dtype: b.dtype.clone(),
                    dir: b.view.clone(),
                    files: b.files.iter().map(|f| format!("{}/{f}", b.view)).collect(),
                }
            }
            None if man.imported => {
                notes.push(format!(
                    "kernel package {name}: nothing imported runs on {}",
                    g.label()
                ));
                Serves::Missing {
                    missing: format!("nothing imported runs on {}", g.label()),
                }
            }
            None => Serves::Missing {
                missing: format!("no build runs on {} yet", g.label()),
            },
        };
        gpus.push(ViewGpu {
            index: i,
            uuid: g.uuid.clone(),
            host_index: g.index,
            compute_capability: cap.to_string(),
            serves,
        });
    }
    if used.is_empty() {
        notes.push(format!(
            "kernel package {name} not mounted: no build in it runs on the container's GPUs{}",
            if man.imported { "" } else { " yet" }
        ));
        return Ok(None);
    }
    used.sort_by(|a, b| (a.arch, &a.view).cmp(&(b.arch, &b.view)));
    let libraries = if man.ldconfig {
        used.iter().map(|b| b.view.clone()).collect()
    } else {
        Vec::new()
    };
    let manifest = View {
        package: name.to_owned(),
        version: man.version.clone(),
        gpus,
        builds: used
            .iter()
            .map(|b| ViewBuild {
                dir: b.view.clone(),
                arch: b.arch.to_string(),
                variant: b.variant.clone(),
                dtype: b.dtype.clone(),
                files: b.files.clone(),
                key: b.key.clone(),
            })
            .collect(),
        libraries: libraries.clone(),
    };
    Ok(Some(Serving {
        name: name.to_owned(),
        body: serde_json::to_vec_pretty(&manifest)?,
        used: used.into_iter().cloned().collect(),
        ids: Vec::new(),
        libraries,
    }))
}

/// The build of `builds` that serves a GPU of capability `cap`: SASS over
/// PTX (PTX only for an import), then the highest arch.
fn best_for<'a>(
    builds: &[&'a Build],
    cap: gpuarch_core::arch::ComputeCapability,
    cuda: Option<CudaVersion>,
    imported: bool,
) -> Option<&'a Build> {
    builds
        .iter()
        .copied()
        .filter(|b| {
            (b.arch.kind == CodeKind::Sass || imported) && b.arch.check(cap, cuda, None).runs
        })
        .max_by_key(|b| (b.arch.kind == CodeKind::Sass, b.arch))
}

/// The loader-cache directories (as the container sees them) the view at
/// `view` names for its packages: those of imports made with `--ldconfig`.
pub fn view_libraries(view: &Path) -> Vec<String> {
    let mut dirs = Vec::new();
    let Ok(entries) = std::fs::read_dir(view) else {
        return dirs;
    };
    let mut names: Vec<String> = entries
        .flatten()
        .take(MAX_PACKAGES)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| valid_name(n))
        .collect();
    names.sort();
    for name in names {
        let Ok(f) = std::fs::File::open(view.join(&name).join("manifest.json")) else {
            continue;
        };
        let Ok(bytes) = crate::context::read_at_most(f, MAX_MANIFEST_BYTES) else {
            continue;
        };
        if let Ok(v) = serde_json::from_slice::<View>(&bytes) {
            dirs.extend(
                v.libraries
                    .iter()
                    .filter(|l| valid_name(l))
                    .map(|l| format!("{CONTAINER_DIR}/{name}/{l}")),
            );
        }
    }
    dirs
}

/// The container's view in `views`: made, or an identical one reused.
fn lay_out(
    views: &Path,
    published: &[Serving],
    handmade: &[KernelMount],
    linked: bool,
) -> std::io::Result<PathBuf> {
    let dir = views.join(digest(published, handmade, linked));
    // A view made before is reused, its time renewed: gpuarchd sweeps
    // views no container mounts once that time is 10 minutes old, and this
    // one is about to be mounted.
    if !renew(&dir) {
        make_view(views, &dir, published, handmade, linked)?;
    }
    Ok(dir)
}

/// Set `dir`'s modification time to now; false when it is gone.
fn renew(dir: &Path) -> bool {
    std::fs::File::open(dir)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .is_ok()
}

/// Whether `views` (created if missing) is on the filesystem of `objects`.
fn same_filesystem(views: &Path, objects: &Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(views);
    match (std::fs::metadata(views), std::fs::metadata(objects)) {
        (Ok(v), Ok(o)) => v.dev() == o.dev(),
        _ => false,
    }
}

/// A view's name: the sha256 of everything it holds: each package's name
/// and manifest, the identities of the files linked in (for a linked
/// view), and the hand-made packages' names (their mount points).
fn digest(published: &[Serving], handmade: &[KernelMount], linked: bool) -> String {
    let mut h = Sha256::new();
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    part(if linked { b"linked" } else { b"bound" });
    for p in published {
        part(p.name.as_bytes());
        part(&p.body);
        for (dev, ino) in &p.ids {
            part(&dev.to_le_bytes());
            part(&ino.to_le_bytes());
        }
    }
    part(b"hand-made");
    for m in handmade {
        part(m.package.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Device and inode of every file of `used`, in order; each must be a
/// regular file (a store entry holds nothing else).
fn linked_ids(used: &[Build]) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::unix::fs::MetadataExt;
    let mut ids = Vec::new();
    for b in used {
        for f in &b.files {
            let path = b.dir.join(f);
            let m = std::fs::symlink_metadata(&path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            if !m.is_file() {
                return Err(std::io::Error::other(format!(
                    "{} is not a regular file",
                    path.display()
                )));
            }
            ids.push((m.dev(), m.ino()));
        }
    }
    Ok(ids)
}

/// Write the view in a temp directory and rename it into place; a view
/// another hook made meanwhile is as good as ours. Per published package,
/// its manifest and a directory per build, holding hard links of the
/// build's files when `link` (the view directory must be on the store's
/// filesystem), else empty (a mount point); per hand-made package, an
/// empty directory (its mount point).
fn make_view(
    root: &Path,
    dir: &Path,
    published: &[Serving],
    handmade: &[KernelMount],
    link: bool,
) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)?;
    let tmp = root.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir(&tmp)?;
    let res = (|| {
        for p in published {
            let pkg = tmp.join(&p.name);
            std::fs::create_dir(&pkg)?;
            std::fs::write(pkg.join("manifest.json"), &p.body)?;
            for b in &p.used {
                let sub = pkg.join(&b.view);
                std::fs::create_dir(&sub)?;
                if link {
                    for f in &b.files {
                        std::fs::hard_link(b.dir.join(f), sub.join(f))?;
                    }
                }
            }
        }
        for m in handmade {
            std::fs::create_dir(tmp.join(&m.package))?;
        }
        match std::fs::rename(&tmp, dir) {
            Ok(()) => Ok(()),
            Err(_) if dir.is_dir() => Ok(()),
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest's build directory is used only when it is, symlinks
    /// resolved, an entry of the store: never a host path or a link out.
    #[test]
    fn only_store_entries_are_mounted() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = KernelsConfig {
            cache_dir: tmp.path().join("cache"),
            ..KernelsConfig::default()
        };
        let entry = cfg.cache_dir.join("objects/ab/abcd");
        std::fs::create_dir_all(&entry).unwrap();
        let outside = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&outside).unwrap();
        let link = cfg.cache_dir.join("objects/ab/link");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let objects = store_objects(&cfg);
        let in_store = |d: &Path| in_store(&objects, d);
        assert!(in_store(&entry));
        assert!(!in_store(&outside));
        assert!(!in_store(&link), "a symlink out of the store");
        assert!(
            !in_store(&cfg.cache_dir.join("objects")),
            "the store itself"
        );
        assert!(!in_store(&cfg.cache_dir.join("objects/ab/../../..")));
        assert!(!in_store(Path::new("/etc")));
        assert!(!in_store(&cfg.cache_dir.join("objects/ab/missing")));
        // A shard that is a symlink out of the store.
        std::fs::create_dir_all(outside.join("abce")).unwrap();
        std::os::unix::fs::symlink(&outside, cfg.cache_dir.join("objects/cd")).unwrap();
        assert!(!in_store(&cfg.cache_dir.join("objects/cd/abce")));
        assert!(!in_store(&cfg.cache_dir.join("objects/cd/../ab/abcd/..")));

        // The store reached through a symlink: entries named either way.
        let via = tmp.path().join("via");
        std::os::unix::fs::symlink(&cfg.cache_dir, &via).unwrap();
        let linked = KernelsConfig {
            cache_dir: via.clone(),
            ..KernelsConfig::default()
        };
        let objects = store_objects(&linked);
        assert!(super::in_store(&objects, &via.join("objects/ab/abcd")));
        assert!(super::in_store(&objects, &entry));
        assert!(!super::in_store(&objects, &via.join("objects/ab/link")));
        assert!(!super::in_store(&objects, &via.join("objects/cd/abce")));
    }
}
