//! The image audit at container start (`audit:` in the config).
//!
//! gpuarchd keeps each image's audit in `audit.dir`, named by the image
//! read's key (what identifies the environments read: their paths, inodes
//! and times). A start whose image has one gets a note for every binary an
//! assigned GPU cannot run, naming the file, its distribution and the GPU,
//! and the list to rebuild with; with `audit.refuse`, such a start is
//! refused with that reason. A start whose image has none asks for it (an
//! empty-looking request file in `audit.dir/requests/`, with the rootfs
//! and the process's variables that decide what the audit reads) and goes
//! on, unless `audit.wait_ms` says to wait for it.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuarch_core::arch::CudaVersion;
use gpuarch_core::audit::{Findings, ImageAudit, SCHEMA, findings, rebuild_list};
use gpuarch_core::config::{AuditConfig, valid_key};
use gpuarch_core::oci::ContainerView;
use gpuarch_core::plan::Plan;
use gpuarch_core::select::AssignedGpu;

/// Most bytes of a kept audit read.
pub const MAX_AUDIT: u64 = 8 << 20;
/// Most findings noted for one GPU; the rest are counted.
const MOST_NOTED: usize = 8;
/// Beside where its Python imports from (`image::PROCESS_VARS`, which the
/// worker needs to find the same environments and so the same image key),
/// the variables of the process that decide what the audit reads: its
/// library path and its kernel caches.
const LIBRARY_VARS: [&str; 5] = [
    "LD_LIBRARY_PATH",
    "HF_HOME",
    "HF_HUB_CACHE",
    "KERNELS_CACHE",
    "FLASHINFER_CUBIN_DIR",
];

/// Every variable of the process a request carries.
pub fn audit_vars() -> impl Iterator<Item = &'static str> {
    crate::image::PROCESS_VARS.into_iter().chain(LIBRARY_VARS)
}

/// Where an image's files are read from for its audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The container's rootfs on the host, as its config names it (the
    /// hook's and the shim's starts).
    Rootfs(PathBuf),
    /// The image's layer directories, the top one first, as containerd's
    /// snapshotter names them (gpuarchd's NRI starts, where no rootfs is
    /// mounted yet).
    Layers(Vec<PathBuf>),
}

/// What a start leaves for gpuarchd to audit an image.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// The container's rootfs on the host, as its config names it; empty
    /// where the request names `layers`.
    #[serde(default)]
    pub rootfs: PathBuf,
    /// The image's layer directories, the top one first (an NRI start).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<PathBuf>,
    /// The [`audit_vars`] the process sets.
    pub env: Vec<(String, String)>,
    /// The process's uid and gid, where the config says.
    pub user: Option<(u32, u32)>,
    /// The engine's names for the image (CRI's), kept with its audit.
    #[serde(default)]
    pub images: Vec<String>,
}

impl Request {
    /// Where the image is read from.
    pub fn source(&self) -> Source {
        if self.layers.is_empty() {
            Source::Rootfs(self.rootfs.clone())
        } else {
            Source::Layers(self.layers.clone())
        }
    }
}

/// What a start gets from its image's audit.
#[derive(Debug, Default)]
pub struct Judged {
    pub notes: Vec<String>,
    /// With `audit.refuse`: why the start is refused.
    pub refuse: Option<String>,
}

/// Judge the start of `plan` (its GPUs) by the kept audit of its image,
/// or ask for one, to be read from `source`.
pub fn at_start(
    cfg: &AuditConfig,
    plan: &Plan,
    view: &ContainerView,
    source: Option<&Source>,
    driver: Option<CudaVersion>,
) -> Judged {
    let mut out = Judged::default();
    let (Some(dir), Some(key)) = (&cfg.dir, &view.software.image_key) else {
        return out;
    };
    if plan.gpus.is_empty() || !valid_key(key) || !dir.is_dir() {
        return out;
    }
    let entry = dir.join(format!("{key}.json"));
    let mut kept = read_kept(&entry);
    if matches!(kept, Kept::None) {
        let asked = match source {
            Some(s) => ask(cfg, key, s, view).map_err(|e| e.to_string()),
            None => Err("no rootfs or layers to read it from".to_owned()),
        };
        match asked {
            Ok(()) if cfg.wait_ms > 0 => {
                let until = Instant::now() + Duration::from_millis(cfg.wait_ms);
                while matches!(kept, Kept::None) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                    kept = read_kept(&entry);
                }
                if matches!(kept, Kept::None) {
                    out.notes.push(format!(
                        "the image's CUDA binaries are not audited yet: asked gpuarchd, waited {} ms (audit.wait_ms)",
                        cfg.wait_ms
                    ));
                }
            }
            Ok(()) => out.notes.push(
                "the image's CUDA binaries are not audited yet: asked gpuarchd; later starts are judged by it"
                    .to_owned(),
            ),
            Err(why) => out.notes.push(format!(
                "the image's CUDA binaries are not audited: {why}"
            )),
        }
    }
    let audit = match kept {
        Kept::Audit(a) => a,
        Kept::Bad(why) => {
            out.notes.push(format!(
                "the image's audit {} not read: {why}",
                entry.display()
            ));
            return out;
        }
        Kept::None => return out,
    };
    judge(&audit, plan, driver, cfg.refuse, &mut out);
    out
}

/// For each GPU of `plan`, in order: the GPU as the notes name it, and
/// what of `audit` it does not run from SASS (`core::audit::findings`,
/// with the list to rebuild all of them with).
fn per_gpu<'p>(
    audit: &ImageAudit,
    plan: &'p Plan,
    driver: Option<CudaVersion>,
) -> impl Iterator<Item = (&'p AssignedGpu, String, Findings)> {
    let archs = rebuild_list(plan.gpus.iter().map(|g| g.compute_capability));
    plan.gpus.iter().map(move |g| {
        let label = format!("GPU {} ({}, {})", g.index, g.name, g.compute_capability);
        let f = findings(audit, &label, g.compute_capability, driver, &archs);
        (g, label, f)
    })
}

/// The findings of `audit` for the GPUs of `plan`, into `out`.
pub fn judge(
    audit: &ImageAudit,
    plan: &Plan,
    driver: Option<CudaVersion>,
    refuse: bool,
    out: &mut Judged,
) {
    let mut refusals = Vec::new();
    for (_, label, f) in per_gpu(audit, plan, driver) {
        for list in [&f.cannot, &f.jit, &f.other] {
            out.notes.extend(list.iter().take(MOST_NOTED).cloned());
            if list.len() > MOST_NOTED {
                out.notes.push(format!(
                    "... and {} more such binaries for {label} (gpuarchctl audit lists them)",
                    list.len() - MOST_NOTED
                ));
            }
        }
        refusals.extend(f.cannot);
    }
    if let Some(s) = &audit.stopped {
        out.notes.push(format!(
            "the image's audit stopped {s}: binaries past it are not judged"
        ));
    }
    if refuse && !refusals.is_empty() {
        out.refuse = Some(format!(
            "audit.refuse: {}",
            refusals
                .iter()
                .take(MOST_NOTED)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
}

/// What AuditImage answers: whether the GPUs of `plan` run every binary
/// of `audit`, and per GPU what they cannot run and what only by PTX JIT.
pub fn report(
    image: &str,
    key: &str,
    audit: &ImageAudit,
    plan: &Plan,
    driver: Option<CudaVersion>,
) -> serde_json::Value {
    let mut runs = true;
    let gpus: Vec<serde_json::Value> = per_gpu(audit, plan, driver)
        .map(|(g, label, f)| {
            runs &= f.cannot.is_empty();
            serde_json::json!({"gpu": label, "uuid": g.uuid, "cannot": f.cannot, "jit": f.jit, "other": f.other})
        })
        .collect();
    serde_json::json!({
        "image": image,
        "key": key,
        "names": audit.images,
        "runs": runs,
        "binaries": audit.binaries.len(),
        "stopped": audit.stopped,
        "gpus": gpus,
    })
}

/// Most bytes of the index of names read.
pub const MAX_INDEX: u64 = 4 << 20;

/// Why a kept audit could not be answered from, or asked for.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit.dir is not set: images are not audited at start on this node")]
    Off,
    #[error("the audit of {image} ({key}): {why}")]
    Bad {
        image: String,
        key: String,
        why: String,
    },
    #[error("asking gpuarchd ({}): {error}", .path.display())]
    Ask {
        path: std::path::PathBuf,
        #[source]
        error: std::io::Error,
    },
}

/// The kept audit of `image` (an image read key, or a name the engine gave
/// it, through `audit.dir/index.json`); `None` when there is none.
pub fn find(cfg: &AuditConfig, image: &str) -> Result<Option<(String, ImageAudit)>, AuditError> {
    let Some(dir) = &cfg.dir else {
        return Err(AuditError::Off);
    };
    let key = if valid_key(image) {
        image.to_owned()
    } else {
        let index = read_index(dir);
        match index.get(image) {
            Some(k) if valid_key(k) => k.clone(),
            _ => return Ok(None),
        }
    };
    match read_kept(&dir.join(format!("{key}.json"))) {
        Kept::Audit(a) => Ok(Some((key, a))),
        Kept::None => Ok(None),
        Kept::Bad(why) => Err(AuditError::Bad {
            image: image.to_owned(),
            key,
            why,
        }),
    }
}

/// The first `max` bytes of a file of `audit.dir` (a kept audit, the
/// index, a request): never through a link, and only a regular file (a
/// FIFO there would otherwise hold its reader).
pub fn read_private(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let f = gpuarch_fs::open_regular(path, false)?;
    let mut b = Vec::new();
    f.take(max).read_to_end(&mut b)?;
    Ok(b)
}

/// `audit.dir/index.json`: name to image key; empty where there is none.
pub fn read_index(dir: &Path) -> std::collections::BTreeMap<String, String> {
    read_private(&dir.join("index.json"), MAX_INDEX)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

enum Kept {
    None,
    Audit(ImageAudit),
    Bad(String),
}

fn read_kept(entry: &Path) -> Kept {
    let bytes = match read_private(entry, MAX_AUDIT) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Kept::None,
        Err(e) => return Kept::Bad(e.to_string()),
    };
    match serde_json::from_slice::<ImageAudit>(&bytes) {
        Ok(a) if a.schema == SCHEMA => Kept::Audit(a),
        Ok(a) => Kept::Bad(format!("schema {} (this hook reads {SCHEMA})", a.schema)),
        Err(e) => Kept::Bad(e.to_string()),
    }
}

/// Leave a request for the audit of image `key` (once: an existing one
/// stands).
fn ask(
    cfg: &AuditConfig,
    key: &str,
    source: &Source,
    view: &ContainerView,
) -> Result<(), AuditError> {
    let Some(dir) = cfg.requests_dir() else {
        return Err(AuditError::Off);
    };
    let path = dir.join(key);
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    let ask_err = |error| AuditError::Ask {
        path: path.clone(),
        error,
    };
    let (rootfs, layers) = match source {
        Source::Rootfs(r) => (r.clone(), Vec::new()),
        Source::Layers(l) => (PathBuf::new(), l.clone()),
    };
    let req = Request {
        rootfs,
        layers,
        env: audit_vars()
            .filter_map(|k| view.env_get(k).map(|v| (k.to_owned(), v.to_owned())))
            .collect(),
        user: view.user,
        images: gpuarch_core::jit::image_names(view),
    };
    let body = serde_json::to_vec(&req).map_err(|e| ask_err(e.into()))?;
    // Written whole under a dot-name gpuarchd passes over, then linked to
    // its name: gpuarchd never reads half a request, and a request already
    // there stands.
    let tmp = dir.join(format!(".{key}.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&body));
    let linked = written.and_then(|()| match std::fs::hard_link(&tmp, &path) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    });
    let _ = std::fs::remove_file(&tmp);
    linked.map_err(ask_err)
}

#[cfg(test)]
mod tests;
