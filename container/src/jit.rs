//! The container's JIT cache on the host (`jit_cache:` in the config):
//! `<dir>/<scope>/<targets>/`, made here if missing, and its variables.
//!
//! Every directory is opened from the one above it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so nothing a container
//! left in a cache (or anyone left anywhere under `dir`) redirects the hook:
//! a symlink where a scope or a cache should be is refused, not followed.
//! `dir` and each scope are root's, mode 0700; each cache is the
//! container's host uid's, mode 0700, and is the only thing mounted. The
//! hook touches a cache's time when it hands it out; gpuarchd evicts the
//! least recently handed out that no container has mounted.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use gpuarch_core::config::{EnvConfig, JitCacheConfig};
use gpuarch_core::env::EnvVar;
use gpuarch_core::jit::{self, Cache};
use gpuarch_core::oci::ContainerView;
use gpuarch_core::plan::Plan;
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, RenameFlags, ResolveFlag, openat2, renameat2};
use nix::sys::stat::{Mode, UtimensatFlags, fstat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchownat};
use serde_json::{Value, json};

/// Why a container got no cache.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    #[error("{path}: {what}: {errno}")]
    Io {
        path: PathBuf,
        what: &'static str,
        errno: Errno,
    },
    #[error(transparent)]
    Open(#[from] gpuarch_fs::trust::OpenError),
    #[error("{path} is owned by uid {found}, not {want}: not mounted")]
    Owner {
        path: PathBuf,
        found: u32,
        want: u32,
    },
}

const BENEATH: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS)
    .union(ResolveFlag::RESOLVE_NO_MAGICLINKS)
    .union(ResolveFlag::RESOLVE_NO_XDEV);

fn open_below(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(BENEATH);
    openat2(dir.as_fd(), name, how)
}

/// A cache made ready for one container.
#[derive(Debug)]
pub struct Prepared {
    /// The host path, for the config's `mounts`.
    pub source: PathBuf,
    /// A handle on it, for the createContainer stage's mount.
    pub fd: OwnedFd,
    pub cache: Cache,
}

/// Open (making what is missing) the container's cache, check who owns
/// each level, and mark it used now.
pub fn prepare(cfg: &JitCacheConfig, cache: &Cache) -> Result<Prepared, JitError> {
    let io = |path: &Path, what: &'static str| {
        let path = path.to_owned();
        move |errno| JitError::Io {
            path: path.clone(),
            what,
            errno,
        }
    };
    let root_path = &cfg.dir;
    // The directories above as any directory is made (0755 under the usual
    // umask), the caches' own root for root alone.
    let made = match root_path.parent() {
        Some(parent) => std::fs::create_dir_all(parent),
        None => Ok(()),
    }
    .and_then(|()| std::fs::DirBuilder::new().mode(0o700).create(root_path));
    match made {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io(root_path, "create")(Errno::from_raw(
                e.raw_os_error().unwrap_or(libc::EIO),
            )));
        }
    }
    // The directory checked is the one every cache is made under.
    let root = OwnedFd::from(gpuarch_fs::trust::open(root_path)?);

    let scope_path = root_path.join(&cache.scope_dir);
    let label = serde_json::to_vec_pretty(&cache.label).unwrap_or_default();
    let scope = open_or_make(&root, &cache.scope_dir, &scope_path, 0, 0, Some(&label))?;
    let path = scope_path.join(&cache.targets_dir);
    let (uid, gid) = (cache.label.uid, cache.label.gid);
    let fd = open_or_make(&scope, &cache.targets_dir, &path, uid, gid, None)?;
    // Handed out now: what gpuarchd's LRU goes by.
    utimensat(
        scope.as_fd(),
        cache.targets_dir.as_str(),
        &TimeSpec::UTIME_NOW,
        &TimeSpec::UTIME_NOW,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(io(&path, "mark used"))?;
    Ok(Prepared {
        source: path,
        fd,
        cache: cache.clone(),
    })
}

/// Directory `name` in `dir`, owned by `uid` (mode 0700); made (under a
/// temporary name, with `label` as its `scope.json`, then renamed into
/// place) when missing.
fn open_or_make(
    dir: &OwnedFd,
    name: &str,
    path: &Path,
    uid: u32,
    gid: u32,
    label: Option<&[u8]>,
) -> Result<OwnedFd, JitError> {
    let io = |what: &'static str| {
        move |errno| JitError::Io {
            path: path.to_owned(),
            what,
            errno,
        }
    };
    let fd = match open_below(dir, name) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => {
            let tmp = format!(".new-{name}-{}", std::process::id());
            match mkdirat(dir.as_fd(), tmp.as_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => {}
                Err(Errno::EEXIST) => {
                    let _ = std::fs::remove_dir_all(path.with_file_name(&tmp));
                    mkdirat(dir.as_fd(), tmp.as_str(), Mode::from_bits_truncate(0o700))
                        .map_err(io("mkdir"))?;
                }
                Err(e) => return Err(io("mkdir")(e)),
            }
            let made = open_below(dir, &tmp).map_err(io("open"))?;
            if let Some(label) = label {
                write_new(&made, jit::LABEL_FILE, label).map_err(io("write scope.json"))?;
            }
            fchownat(
                dir.as_fd(),
                tmp.as_str(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(io("chown"))?;
            // Never over another start's directory (rename replaces an
            // empty one): theirs is used instead.
            match renameat2(
                dir.as_fd(),
                tmp.as_str(),
                dir.as_fd(),
                name,
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => made,
                // Another start made it first: use theirs.
                Err(Errno::EEXIST | Errno::ENOTEMPTY) => {
                    let _ = std::fs::remove_dir_all(path.with_file_name(&tmp));
                    open_below(dir, name).map_err(io("open"))?
                }
                Err(e) => return Err(io("rename into place")(e)),
            }
        }
        // ELOOP: a symlink where the directory should be.
        Err(e) => return Err(io("open (symlinks are refused)")(e)),
    };
    let st = fstat(fd.as_fd()).map_err(io("stat"))?;
    if st.st_uid != uid {
        return Err(JitError::Owner {
            path: path.to_owned(),
            found: st.st_uid,
            want: uid,
        });
    }
    Ok(fd)
}

/// Write a new file `name` in directory `dir` (an `O_PATH` handle).
fn write_new(dir: &OwnedFd, name: &str, bytes: &[u8]) -> Result<(), Errno> {
    use std::io::Write;
    let how = OpenHow::new()
        .flags(
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        )
        .mode(Mode::from_bits_truncate(0o644))
        .resolve(BENEATH);
    let fd = openat2(dir.as_fd(), name, how)?;
    std::fs::File::from(fd)
        .write_all(bytes)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// Whether the config mounts something at or under the cache's directory
/// (ours, from an earlier step, or the container's own).
pub fn has_mount(config: &Value) -> bool {
    let prefix = format!("{}/", jit::CONTAINER_DIR);
    config
        .get("mounts")
        .and_then(Value::as_array)
        .is_some_and(|ms| {
            ms.iter().any(|m| {
                m.get("destination")
                    .and_then(Value::as_str)
                    .is_some_and(|d| {
                        d.trim_end_matches('/') == jit::CONTAINER_DIR || d.starts_with(&prefix)
                    })
            })
        })
}

/// The OCI `mounts` entry: read-write, but no set-uid programs or device
/// nodes (what a container writes here runs in the next one, as itself).
pub fn mount_entry(source: &Path) -> Value {
    json!({
        "destination": jit::CONTAINER_DIR,
        "type": "bind",
        "source": source,
        "options": ["rbind", "rw", "nosuid", "nodev"],
    })
}

/// The cache variables the Plan would set: not disabled, and not the
/// container's own unless the config overrides.
fn wanted(view: &ContainerView, cfg: &EnvConfig) -> Vec<EnvVar> {
    EnvVar::JIT
        .iter()
        .map(|(v, _)| *v)
        .filter(|v| !cfg.disable.contains(v))
        .filter(|v| cfg.override_existing || view.env_get(v.name()).is_none())
        .collect()
}

/// Find and prepare the container's cache; `None`, with a note, when it
/// gets none. `config` is for the container's own mounts.
pub fn plan_cache(
    config: &Value,
    plan: &mut Plan,
    view: &ContainerView,
    jit_cfg: &JitCacheConfig,
    env_cfg: &EnvConfig,
) -> Option<Prepared> {
    if !jit_cfg.enable || plan.is_noop() {
        return None;
    }
    if has_mount(config) {
        plan.notes.push(format!(
            "no JIT cache: the container mounts {} (or under it) itself",
            jit::CONTAINER_DIR
        ));
        return None;
    }
    if wanted(view, env_cfg).is_empty() {
        plan.notes.push(
            "no JIT cache: the container sets (or the config disables) every cache variable"
                .to_owned(),
        );
        return None;
    }
    if let Some(note) = jit::claimed_namespace_note(view) {
        plan.notes.push(note);
    }
    let cache = match jit::cache_for(plan, view, jit_cfg, env_cfg) {
        Ok(c) => c,
        Err(why) => {
            plan.notes.push(format!("no JIT cache: {why}"));
            return None;
        }
    };
    match prepare(jit_cfg, &cache) {
        Ok(p) => Some(p),
        Err(e) => {
            plan.notes.push(format!("no JIT cache: {e}"));
            None
        }
    }
}

/// Set the cache's variables and say what was given.
pub fn add_env(plan: &mut Plan, p: &Prepared, view: &ContainerView, cfg: &EnvConfig) {
    let mut set = Vec::new();
    for (var, sub) in EnvVar::JIT {
        let value = format!("{}/{sub}", jit::CONTAINER_DIR);
        if plan.add_mounted(var, &value, "the JIT cache is mounted", view, cfg) {
            set.push(var.name());
        }
    }
    let l = &p.cache.label;
    let whose = match (&l.image, &l.namespace) {
        (Some(i), Some(n)) => format!("uid {}, namespace {n}, image {i}", l.uid),
        (Some(i), None) => format!("uid {}, image {i}", l.uid),
        (_, Some(n)) => format!("uid {}, namespace {n}", l.uid),
        _ => format!("uid {}", l.uid),
    };
    plan.notes.push(format!(
        "JIT cache {} mounted read-write at {} (scope {}: {whose}; targets {}): {}",
        p.source.display(),
        jit::CONTAINER_DIR,
        l.scope,
        p.cache.targets_dir,
        set.join(", ")
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edit::{edit, tests::ctx};
    use gpuarch_core::config::{Config, JitScope};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn container(dev: &str, uid: u32, image: &str, env: &[&str]) -> Value {
        let mut e = vec![format!("NVIDIA_VISIBLE_DEVICES={dev}")];
        e.extend(env.iter().map(|s| s.to_string()));
        json!({
            "process": {"args": ["sh"], "env": e, "user": {"uid": uid, "gid": uid}},
            "root": {"path": "rootfs"},
            "mounts": [],
            "annotations": {"io.kubernetes.cri.image-name": image},
        })
    }

    fn cfg(dir: &Path) -> Config {
        let mut c = Config::default();
        c.jit_cache.enable = true;
        c.jit_cache.dir = dir.to_owned();
        c.kernels.mount_root = dir.join("no-kernels");
        c
    }

    /// The JIT mount of an edited config: (source, options).
    fn jit_mount(c: &Value) -> Option<(String, Vec<String>)> {
        c["mounts"].as_array()?.iter().find_map(|m| {
            (m["destination"] == jit::CONTAINER_DIR).then(|| {
                (
                    m["source"].as_str().unwrap().to_owned(),
                    serde_json::from_value(m["options"].clone()).unwrap(),
                )
            })
        })
    }

    fn env(c: &Value, name: &str) -> Option<String> {
        c["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|e| {
                e.as_str()
                    .unwrap()
                    .strip_prefix(&format!("{name}="))
                    .map(str::to_owned)
            })
    }

    #[test]
    fn same_gpu_and_tenant_share_a_cache_and_nothing_else_does() {
        gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root(
            "(the JIT cache tests chown to other uids)"
        ));
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let cx = ctx(cfg(&dir));
        let start = |c: Value| {
            let mut c = c;
            let plan = edit(&mut c, &cx).unwrap();
            (c, plan)
        };
        let (a, plan) = start(container("1", 1000, "torch:2.7", &[]));
        let (src, opts) = jit_mount(&a).expect("a cache");
        assert_eq!(opts, ["rbind", "rw", "nosuid", "nodev"]);
        assert!(
            src.starts_with(dir.to_str().unwrap()) && src.ends_with("/sm_86"),
            "{src}"
        );
        assert_eq!(
            env(&a, "TORCH_EXTENSIONS_DIR").as_deref(),
            Some("/var/cache/gpuarch/jit/torch_extensions")
        );
        for (var, _) in EnvVar::JIT {
            assert!(env(&a, var.name()).is_some(), "{var}");
        }
        assert!(
            plan.notes.iter().any(|n| n.starts_with("JIT cache ")
                && n.contains("scope image: uid 1000, image torch:2.7")),
            "{:?}",
            plan.notes
        );
        // Owned by the container's uid, 0700, below a root-only scope that
        // says whose it is.
        let meta = std::fs::metadata(&src).unwrap();
        assert_eq!(
            (meta.uid(), meta.permissions().mode() & 0o777),
            (1000, 0o700)
        );
        let scope = Path::new(&src).parent().unwrap();
        let meta = std::fs::metadata(scope).unwrap();
        assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (0, 0o700));
        let label: jit::Label =
            serde_json::from_slice(&std::fs::read(scope.join(jit::LABEL_FILE)).unwrap()).unwrap();
        assert_eq!(
            (label.scope, label.uid, label.image.as_deref()),
            (JitScope::Image, 1000, Some("torch:2.7"))
        );

        // The same GPU, uid and image: the same cache.
        let (b, _) = start(container("1", 1000, "torch:2.7", &[]));
        assert_eq!(jit_mount(&b).unwrap().0, src);
        // Another arch, uid or image: another.
        let mut seen = vec![src.clone()];
        for c in [
            container("0", 1000, "torch:2.7", &[]),
            container("1", 1001, "torch:2.7", &[]),
            container("1", 1000, "other:1", &[]),
            container("1", 1000, "torch:2.7", &["CUDA_VERSION=12.8.1"]),
        ] {
            let (c, _) = start(c);
            let s = jit_mount(&c).unwrap().0;
            assert!(!seen.contains(&s), "{s} shared");
            seen.push(s);
        }

        // The container's own variables are kept; the rest still point in.
        let (own, plan) = start(container(
            "1",
            1000,
            "torch:2.7",
            &["TRITON_CACHE_DIR=/mine"],
        ));
        assert_eq!(env(&own, "TRITON_CACHE_DIR").as_deref(), Some("/mine"));
        assert!(env(&own, "CUDA_CACHE_PATH").is_some());
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("TRITON_CACHE_DIR left as the container sets it")),
            "{:?}",
            plan.notes
        );
        // A container mounting the directory itself gets none.
        let mut c = container("1", 1000, "torch:2.7", &[]);
        c["mounts"] =
            json!([{"destination": "/var/cache/gpuarch/jit/", "type": "bind", "source": "/srv/x"}]);
        let (c, plan) = start(c);
        assert!(env(&c, "TORCH_EXTENSIONS_DIR").is_none());
        assert_eq!(c["mounts"].as_array().unwrap().len(), 1);
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("mounts /var/cache/gpuarch/jit")),
            "{:?}",
            plan.notes
        );
        // No image named (Docker, podman): no cache under scope image.
        let mut c = container("1", 1000, "x", &[]);
        c["annotations"] = json!({});
        let (c, plan) = start(c);
        assert!(jit_mount(&c).is_none());
        assert!(
            plan.notes.iter().any(|n| n.contains("names no image")),
            "{:?}",
            plan.notes
        );
        // Off by default.
        let mut c = container("1", 1000, "torch:2.7", &[]);
        edit(&mut c, &ctx(Config::default())).unwrap();
        assert!(jit_mount(&c).is_none() && env(&c, "TORCH_EXTENSIONS_DIR").is_none());
    }

    #[test]
    fn symlinks_and_foreign_owners_are_refused_not_followed() {
        gpuarch_testkit::skip_unless!(gpuarch_testkit::unless_root(
            "(the JIT cache tests chown to other uids)"
        ));
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jit");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let cx = ctx(cfg(&dir));
        let mut c = container("1", 1000, "torch:2.7", &[]);
        edit(&mut c, &cx).unwrap();
        let src = PathBuf::from(jit_mount(&c).unwrap().0);
        let scope = src.parent().unwrap().to_owned();

        // A symlink where the cache should be (say, left by whoever could
        // write the scope): refused, and nothing is made through it.
        std::fs::remove_dir(&src).unwrap();
        std::os::unix::fs::symlink(&outside, &src).unwrap();
        let mut c = container("1", 1000, "torch:2.7", &[]);
        let plan = edit(&mut c, &cx).unwrap();
        assert!(jit_mount(&c).is_none() && env(&c, "TORCH_EXTENSIONS_DIR").is_none());
        assert!(
            plan.notes
                .iter()
                .any(|n| n.starts_with("no JIT cache:") && n.contains("symlinks are refused")),
            "{:?}",
            plan.notes
        );
        // The same for a scope.
        std::fs::remove_file(&src).unwrap();
        std::fs::remove_dir_all(&scope).unwrap();
        std::os::unix::fs::symlink(&outside, &scope).unwrap();
        let mut c = container("1", 1000, "torch:2.7", &[]);
        edit(&mut c, &cx).unwrap();
        assert!(jit_mount(&c).is_none());
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "written through a symlink"
        );
        std::fs::remove_file(&scope).unwrap();

        // A cache owned by another uid is not handed to this one.
        let mut c = container("1", 1000, "torch:2.7", &[]);
        edit(&mut c, &cx).unwrap();
        let src = jit_mount(&c).unwrap().0;
        nix::unistd::chown(Path::new(&src), Some(Uid::from_raw(1001)), None).unwrap();
        let mut c = container("1", 1000, "torch:2.7", &[]);
        let plan = edit(&mut c, &cx).unwrap();
        assert!(jit_mount(&c).is_none());
        assert!(
            plan.notes
                .iter()
                .any(|n| n.contains("owned by uid 1001, not 1000")),
            "{:?}",
            plan.notes
        );

        // A jit_cache.dir another user could write is not used at all.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut c = container("1", 1002, "torch:2.7", &[]);
        let plan = edit(&mut c, &cx).unwrap();
        assert!(jit_mount(&c).is_none());
        assert!(
            plan.notes.iter().any(|n| n.contains("is not trusted")),
            "{:?}",
            plan.notes
        );
    }
}
