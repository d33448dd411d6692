//! The image of a container NRI shows, read from its layers. At
//! CreateContainer the runtime has pulled and unpacked the image and
//! prepared the container's snapshot (its key is the container's id), but
//! has mounted nothing: gpuarchd asks containerd's Snapshots API for the
//! snapshot's mounts, and reads the image's layer directories they name
//! (overlayfs's `lowerdir`, the native snapshotter's copy) as overlayfs
//! merges them ([`gpuarch_container::image::Layers`]).
//!
//! The container's own writable layer is not read: it is empty until the
//! container runs. A read is kept by the layers it read (paths, inodes and
//! change times of their directories; a committed snapshot never changes)
//! and what of the process finds the environments (its env's Python
//! variables and its user), so a pod's second container, and every later
//! pod of the image, costs one call to containerd.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use gpuarch_container::image::{self, Layers};
use gpuarch_core::config::NriConfig;
use gpuarch_core::oci::ContainerView;
use gpuarch_core::software::Software;
use gpuarch_fs::crio::CrioStorage;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::{debug, warn};

/// The namespace of CRI's containers.
const NAMESPACE: &str = "k8s.io";
/// Longest a call to containerd may take.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(500);
/// Most reads kept; the cache is emptied when full.
pub const MAX_KEPT: usize = 1024;
/// Most mounts, and most bytes of one option, taken from an answer.
const MAX_MOUNTS: usize = 8;
const MAX_OPTION: usize = 1 << 20;

/// containerd's `MountsRequest` (`containerd.services.snapshots.v1`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountsRequest {
    #[prost(string, tag = "1")]
    pub snapshotter: String,
    #[prost(string, tag = "2")]
    pub key: String,
}

/// containerd's `MountsResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountsResponse {
    #[prost(message, repeated, tag = "1")]
    pub mounts: Vec<Mount>,
}

/// containerd's `containerd.types.Mount`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub source: String,
    #[prost(string, tag = "3")]
    pub target: String,
    #[prost(string, repeated, tag = "4")]
    pub options: Vec<String>,
}

/// Why an image's layers cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LayersError {
    #[error("the snapshot has {0} mounts (one is read)")]
    Mounts(usize),
    #[error("an overlay mount without lowerdir")]
    NoLowerdir,
    #[error("an overlay lowerdir over 1 MiB")]
    LowerdirTooLong,
    #[error("a relative lowerdir in {0:.200?}")]
    RelativeLowerdir(String),
    #[error("the snapshot is a {0:.40?} mount (overlay and bind are read)")]
    MountType(String),
    #[error("containerd at {}: {message}", .socket.display())]
    Containerd { socket: PathBuf, message: String },
    #[error("nri.snapshotters names no snapshotter")]
    NoSnapshotter,
    #[error("no snapshot of the container in containerd's {0}")]
    NoSnapshot(String),
    /// CRI-O's containers/storage did not give the layers.
    #[error("CRI-O's {0}")]
    Storage(#[from] super::storage::StorageError),
    /// Neither containerd nor CRI-O: a runtime whose images gpuarchd does
    /// not read.
    #[error(
        "{0} keeps its images where gpuarchd does not read them (its runtime handler gpuarch, or gpuarch's hook in its hooks_dir, reads the container's rootfs)"
    )]
    OtherRuntime(String),
}

/// The image's layer directories, the top one first, from the mounts of
/// the container's snapshot; or why they cannot be read.
pub fn layer_dirs(mounts: &[Mount]) -> Result<Vec<PathBuf>, LayersError> {
    let [m] = mounts else {
        return Err(LayersError::Mounts(mounts.len()));
    };
    match m.r#type.as_str() {
        "bind" | "rbind" => Ok(vec![PathBuf::from(&m.source)]),
        "overlay" => {
            let lower = m
                .options
                .iter()
                .find_map(|o| o.strip_prefix("lowerdir="))
                .ok_or(LayersError::NoLowerdir)?;
            if lower.len() > MAX_OPTION {
                return Err(LayersError::LowerdirTooLong);
            }
            let dirs: Vec<PathBuf> = lower.split(':').map(PathBuf::from).collect();
            if dirs.iter().any(|d| !d.is_absolute()) {
                return Err(LayersError::RelativeLowerdir(lower.to_owned()));
            }
            Ok(dirs)
        }
        other => Err(LayersError::MountType(other.to_owned())),
    }
}

/// The key a read is kept under: the layers (path, inode, change time)
/// and what of the process finds its environments. `None` when a layer's
/// directory cannot be looked at.
fn key(dirs: &[PathBuf], view: &ContainerView) -> Option<String> {
    let mut h = Sha256::new();
    h.update(b"gpuarch-nri-image-1\0");
    for d in dirs {
        let md = std::fs::symlink_metadata(d).ok()?;
        h.update(d.as_os_str().as_encoded_bytes());
        h.update(b"\0");
        for n in [md.ino() as i64, md.ctime(), md.ctime_nsec()] {
            h.update(n.to_le_bytes());
        }
    }
    image::hash_process(&mut h, view);
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The runtime's images, as gpuarchd reads them for NRI: containerd's, or
/// CRI-O's ([`super::storage`]).
#[derive(Debug)]
pub struct Images {
    socket: PathBuf,
    snapshotters: Vec<String>,
    storage: super::storage::Storage,
    channel: Mutex<Option<Channel>>,
    kept: Mutex<HashMap<String, (Software, Vec<String>)>>,
}

impl Images {
    /// containerd at `nri.containerd`, its containers' snapshots in one
    /// of `nri.snapshotters` (tried in order); CRI-O's containers/storage
    /// where CRI-O's own config puts it, or `nri.storage_root`
    /// ([`CrioStorage`]), read again at each registration.
    pub fn new(nri: &NriConfig) -> Self {
        let crio = CrioStorage::of(nri);
        for p in &crio.problems {
            warn!("NRI: CRI-O's storage settings: {p}");
        }
        debug!(
            "NRI: CRI-O's containers/storage at {} (from {}), runroot {} (from {}), additional image stores {:?}",
            crio.root.value.display(),
            crio.root.from,
            crio.runroot.value.display(),
            crio.runroot.from,
            crio.image_stores
        );
        Self {
            socket: nri.containerd.clone(),
            snapshotters: nri.snapshotters.clone(),
            storage: super::storage::Storage::new(
                &crio.root.value,
                &crio.runroot.value,
                &crio.image_stores,
            ),
            channel: Mutex::new(None),
            kept: Mutex::new(HashMap::new()),
        }
    }

    fn channel(&self) -> Channel {
        let mut ch = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = ch.as_ref() {
            return c.clone();
        }
        let sock = self.socket.clone();
        // The URI is not used: every connection is the socket's.
        let c = Endpoint::from_static("http://[::]:0")
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let sock = sock.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(sock).await?,
                    ))
                }
            }));
        *ch = Some(c.clone());
        c
    }

    /// The mounts of snapshot `key` in `snapshotter`.
    async fn mounts(&self, snapshotter: &str, key: &str) -> Result<Vec<Mount>, tonic::Status> {
        let channel = self.channel();
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut req = tonic::Request::new(MountsRequest {
            snapshotter: snapshotter.to_owned(),
            key: key.to_owned(),
        });
        req.metadata_mut().insert(
            "containerd-namespace",
            tonic::metadata::MetadataValue::from_static(NAMESPACE),
        );
        req.set_timeout(CALL_TIMEOUT);
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/containerd.services.snapshots.v1.Snapshots/Mounts",
        );
        let codec = tonic_prost::ProstCodec::<MountsRequest, MountsResponse>::default();
        let resp = grpc.unary(req, path, codec).await?;
        let mut mounts = resp.into_inner().mounts;
        mounts.truncate(MAX_MOUNTS + 1);
        Ok(mounts)
    }

    /// The layer directories of container `id`'s image under `runtime`
    /// (NRI's name for it), or why not.
    pub async fn layers_under(&self, runtime: &str, id: &str) -> Result<Vec<PathBuf>, LayersError> {
        match runtime {
            "containerd" => self.layers(id).await,
            "cri-o" => Ok(self.storage.layers(id)?),
            other => Err(LayersError::OtherRuntime(
                gpuarch_core::text::clean(other).into_owned(),
            )),
        }
    }

    /// The layer directories of containerd's container `id`'s image, or
    /// why not.
    pub async fn layers(&self, id: &str) -> Result<Vec<PathBuf>, LayersError> {
        let mut tried = Vec::new();
        for s in &self.snapshotters {
            match self.mounts(s, id).await {
                Ok(m) => return layer_dirs(&m),
                Err(e) if e.code() == tonic::Code::NotFound => tried.push(s.as_str()),
                Err(e) => {
                    return Err(LayersError::Containerd {
                        socket: self.socket.clone(),
                        message: gpuarch_core::text::clean(e.message()).into_owned(),
                    });
                }
            }
        }
        if tried.is_empty() {
            return Err(LayersError::NoSnapshotter);
        }
        Err(LayersError::NoSnapshot(tried.join(", ")))
    }

    /// What the image in `dirs` holds for the process of `view`: kept, or
    /// read (bounded as the hook's read is) and kept. Never fails: an
    /// image that cannot be read is one nothing is known of, said in the
    /// notes.
    pub fn read(
        &self,
        dirs: &Result<Vec<PathBuf>, LayersError>,
        view: &ContainerView,
        cache: Option<&Path>,
    ) -> (Software, Vec<String>) {
        let dirs = match dirs {
            Ok(d) => d,
            Err(why) => return image::not_read(why),
        };
        let key = key(dirs, view);
        if let Some(k) = &key
            && let Some(hit) = self.kept.lock().unwrap_or_else(|p| p.into_inner()).get(k)
        {
            return hit.clone();
        }
        let layers = match Layers::open(dirs) {
            Ok(l) => l,
            Err(e) => return image::not_read(e),
        };
        let read = image::read_layers(&layers, view, cache);
        if let Some(k) = key {
            let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() >= MAX_KEPT {
                kept.clear();
            }
            kept.insert(k, read.clone());
        }
        read
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mount(t: &str, source: &str, options: &[&str]) -> Mount {
        Mount {
            r#type: t.to_owned(),
            source: source.to_owned(),
            target: String::new(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        }
    }

    #[test]
    fn the_layers_are_those_the_snapshot_would_mount() {
        let s = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots";
        let m = mount(
            "overlay",
            "overlay",
            &[
                "index=off",
                &format!("workdir={s}/9/work"),
                &format!("upperdir={s}/9/fs"),
                &format!("lowerdir={s}/8/fs:{s}/3/fs"),
            ],
        );
        assert_eq!(
            layer_dirs(&[m]).unwrap(),
            [format!("{s}/8/fs"), format!("{s}/3/fs")].map(PathBuf::from)
        );
        let native = mount("bind", "/var/lib/containerd/native/snapshots/4", &["rbind"]);
        assert_eq!(
            layer_dirs(std::slice::from_ref(&native)).unwrap(),
            [PathBuf::from("/var/lib/containerd/native/snapshots/4")]
        );
        for (m, why) in [
            (vec![], "0 mounts"),
            (vec![native.clone(), native], "2 mounts"),
            (
                vec![mount("overlay", "overlay", &["upperdir=/x"])],
                "without lowerdir",
            ),
            (vec![mount("overlay", "o", &["lowerdir=/a:b"])], "relative"),
            (
                vec![mount("fuse.stargz", "x", &[])],
                "\"fuse.stargz\" mount",
            ),
        ] {
            let e = layer_dirs(&m).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn a_read_is_kept_by_its_layers_and_its_process() {
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("1/fs");
        let site = layer.join("usr/lib/python3.12/site-packages/torch-2.9.1.dist-info");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(site.join("METADATA"), "Version: 2.9.1\n").unwrap();
        std::fs::create_dir_all(layer.join("usr/lib/python3.12")).unwrap();
        let images = Images::new(&NriConfig {
            containerd: dir.path().join("none.sock"),
            snapshotters: Vec::new(),
            crio_config: dir.path().join("crio.conf"),
            storage_conf: dir.path().join("storage.conf"),
            ..NriConfig::default()
        });
        let dirs = Ok(vec![layer.clone()]);
        let view = ContainerView::with_env([("PATH", "/usr/bin")]);
        let (sw, notes) = images.read(&dirs, &view, None);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(sw.dists.len(), 1, "{sw:?}");
        // Kept: the layer changes, the read does not (a committed
        // snapshot never does).
        std::fs::remove_dir_all(&site).unwrap();
        assert_eq!(images.read(&dirs, &view, None).0.dists.len(), 1);
        // Another process (another PATH) is read again.
        let other = ContainerView::with_env([("PATH", "/bin")]);
        assert!(images.read(&dirs, &other, None).0.dists.is_empty());
        // No layers: nothing known, and why.
        let down = Err(LayersError::NoSnapshot("overlayfs".to_owned()));
        let (sw, notes) = images.read(&down, &view, None);
        assert!(!sw.was_read());
        assert!(
            notes[0].contains("not read: no snapshot of the container in containerd's overlayfs"),
            "{notes:?}"
        );
    }
}
