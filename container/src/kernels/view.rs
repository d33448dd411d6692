//! The container's view of the kernel store: for each published package
//! that serves it, the builds for its GPUs (hard links, or binds off the
//! store's filesystem) and a `manifest.json` mapping each GPU to its file;
//! named by the sha256 of what it holds, so containers given the same GPUs
//! share one. Only the store's own entries are ever linked or bound.

use std::path::{Path, PathBuf};

use gpuarch_core::arch::{CodeKind, CudaVersion, Target};
use gpuarch_core::config::{KernelsConfig, valid_package_name as valid_name};
use gpuarch_core::plan::Plan;
use gpuarch_wire::manifest::{Serves, View, ViewBuild, ViewGpu};
use sha2::{Digest, Sha256};

use super::manifest::MAX_MANIFEST_BYTES;
use super::manifest::{PackageManifest, PublishedBuild};
use super::{CONTAINER_DIR, KernelMount, MAX_PACKAGES};

/// The store's `objects/` as configured, and with every symlink resolved
/// (None when it is absent).
pub(super) struct Objects {
    configured: PathBuf,
    real: Option<PathBuf>,
}

pub(super) fn store_objects(cfg: &KernelsConfig) -> Objects {
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
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error("cannot lay out its view in {}: {error}", dir.display())]
    Layout { dir: PathBuf, error: std::io::Error },
}

/// A published package that serves the container: its view manifest and
/// the builds it uses.
pub(super) struct Serving {
    pub(super) name: String,
    /// `manifest.json` as the container sees it.
    pub(super) body: Vec<u8>,
    pub(super) used: Vec<PublishedBuild>,
    /// Device and inode of each file of `used`, when linked.
    pub(super) ids: Vec<(u64, u64)>,
    /// Its directories for the container's loader cache.
    pub(super) libraries: Vec<String>,
}

/// Which build of a published package serves each GPU. None (with a note)
/// when no build serves any of them yet.
///
/// A build serves a GPU with the highest SASS that runs on it; an import
/// also with the highest PTX when no SASS does. An import with `ldconfig`
/// is one file for every GPU: the one whose code runs on all of them,
/// preferring SASS on more GPUs, then exact archs, then the higher code.
pub(super) fn serving(
    cfg: &KernelsConfig,
    objects: &Objects,
    name: &str,
    man: &PackageManifest,
    plan: &Plan,
    cuda: Option<CudaVersion>,
    notes: &mut Vec<String>,
) -> Result<Option<Serving>, ViewError> {
    let mut gpus = Vec::new();
    let mut used: Vec<&PublishedBuild> = Vec::new();
    // Only the store's own entries are ever mounted: a manifest naming any
    // other directory (a host path, a symlink out of the store) is refused.
    let (mut builds, outside): (Vec<&PublishedBuild>, Vec<&PublishedBuild>) = man
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
            let of: Vec<&PublishedBuild> =
                builds.iter().copied().filter(|b| b.view == file).collect();
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
    builds: &[&'a PublishedBuild],
    cap: gpuarch_core::arch::ComputeCapability,
    cuda: Option<CudaVersion>,
    imported: bool,
) -> Option<&'a PublishedBuild> {
    // The last of equals, as the builds are listed.
    let best = gpuarch_core::arch::best_target(builds.iter().map(|b| b.arch), cap, cuda, imported)?;
    builds.iter().copied().rfind(|b| b.arch == best)
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
pub(super) fn lay_out(
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
pub(super) fn same_filesystem(views: &Path, objects: &Path) -> bool {
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
    gpuarch_wire::manifest::view_name(&h.finalize().into())
}

/// Device and inode of every file of `used`, in order; each must be a
/// regular file (a store entry holds nothing else).
pub(super) fn linked_ids(used: &[PublishedBuild]) -> std::io::Result<Vec<(u64, u64)>> {
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

/// Why gpuarchd said it cannot build request `name`, if it did.
fn unbuildable(spool_dir: &std::path::Path, name: &str) -> Option<String> {
    let map = gpuarch_wire::spool::read_unbuildable(spool_dir);
    let why = map.get(name)?.as_str()?;
    Some(gpuarch_core::text::clean(why).into_owned())
}

/// Leave a request for a build of `package` for `arch`; an existing request
/// is enough. Never fails the container: a failure is a note.
fn request(cfg: &KernelsConfig, package: &str, arch: Target, notes: &mut Vec<String>) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let name = gpuarch_wire::spool::request_name(package, &arch.to_string());
    // What gpuarchd said it cannot build is not asked again: the note
    // says why (until gpuarchd restarts, which is what applies a fix).
    if let Some(why) = unbuildable(&cfg.spool_dir, &name) {
        notes.push(format!(
            "kernel package {package}: no {arch} build, and gpuarchd could not build one: {why} (gpuarchctl doctor says how to fix it; not asked again until gpuarchd restarts)"
        ));
        return;
    }
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&cfg.spool_dir);
    let path = cfg.spool_dir.join(gpuarch_wire::spool::request_name(
        package,
        &arch.to_string(),
    ));
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
