//! `nri`: gpuarchd as an NRI plugin of containerd or CRI-O.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// gpuarchd as an NRI plugin of containerd or CRI-O: every container a
/// Kubernetes pod creates gets its Plan without a runtime handler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NriConfig {
    /// Register with the runtime's NRI socket. Default false.
    pub enable: bool,
    /// The runtime's NRI socket. Default [`DEFAULT_NRI_SOCKET`].
    pub socket: PathBuf,
    /// Where gpuarch stands among the runtime's plugins, which it calls in
    /// ascending order: two digits, `00` to `99`. Default `"50"`.
    #[serde(deserialize_with = "nri_index")]
    pub index: String,
    /// Pods of these runtime handlers are left to `gpuarch-runtime`, which
    /// also reads the image: a pod gets one Plan, not two. Default
    /// `["gpuarch"]`, the handler `gpuarchctl engine containerd` adds.
    pub skip_handlers: Vec<String>,
    /// containerd's gRPC socket, asked for the layers of each container's
    /// image (its snapshot's mounts). Default [`DEFAULT_CONTAINERD_SOCKET`].
    pub containerd: PathBuf,
    /// The snapshotters a container's snapshot is looked for in, in
    /// order: CRI's (`snapshotter` of its config) first. Default
    /// `["overlayfs", "native"]`.
    pub snapshotters: Vec<String>,
    /// CRI-O's containers/storage (its `root`, storage.conf's
    /// `graphroot`): each container's image layers are read from there.
    /// Default: CRI-O's own, from [`NriConfig::crio_config`] and
    /// [`NriConfig::storage_conf`], else [`DEFAULT_STORAGE_ROOT`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_root: Option<PathBuf>,
    /// containers/storage's `runroot`, where a transient store keeps its
    /// containers. Default: CRI-O's own, else [`DEFAULT_STORAGE_RUNROOT`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage_runroot: Option<PathBuf>,
    /// containers/storage's additional image stores (storage.conf's
    /// `additionalimagestores`): read-only stores whose layers a
    /// container's may stand on. Those CRI-O's own settings name are
    /// added. Default none.
    pub storage_image_stores: Vec<PathBuf>,
    /// CRI-O's config file (`crio --config`), whose `[crio]` `root`,
    /// `runroot` and `storage_option` gpuarchd takes where `storage_root`
    /// and `storage_runroot` are not set; its drop-ins are in the directory
    /// of the same name with `.d` added, later files winning. Default
    /// [`DEFAULT_CRIO_CONFIG`].
    pub crio_config: PathBuf,
    /// containers/storage's config (`CONTAINERS_STORAGE_CONF`), under
    /// crio.conf: `graphroot`, `runroot`, `additionalimagestores`. Default
    /// [`DEFAULT_STORAGE_CONF`], and where that is absent
    /// `/usr/share/containers/storage.conf`.
    pub storage_conf: PathBuf,
}

/// Default of `nri.crio_config`.
pub const DEFAULT_CRIO_CONFIG: &str = "/etc/crio/crio.conf";

/// Default of `nri.storage_conf`.
pub const DEFAULT_STORAGE_CONF: &str = "/etc/containers/storage.conf";

/// Default of `nri.containerd`.
pub const DEFAULT_CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// Default of `nri.storage_root`: CRI-O's and podman's as root.
pub const DEFAULT_STORAGE_ROOT: &str = "/var/lib/containers/storage";

/// The containers/storage drivers whose stores gpuarchd reads under
/// CRI-O: a store of one keeps its containers in
/// `<root>/<driver>-containers`.
pub const STORAGE_DRIVERS: [&str; 2] = ["overlay", "vfs"];

/// Default of `nri.storage_runroot`.
pub const DEFAULT_STORAGE_RUNROOT: &str = "/run/containers/storage";

/// Default of `nri.socket`: where containerd and CRI-O listen.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";

impl Default for NriConfig {
    fn default() -> Self {
        Self {
            enable: false,
            socket: PathBuf::from(DEFAULT_NRI_SOCKET),
            index: "50".to_owned(),
            skip_handlers: vec!["gpuarch".to_owned()],
            containerd: PathBuf::from(DEFAULT_CONTAINERD_SOCKET),
            snapshotters: vec!["overlayfs".to_owned(), "native".to_owned()],
            storage_root: None,
            storage_runroot: None,
            storage_image_stores: Vec::new(),
            crio_config: PathBuf::from(DEFAULT_CRIO_CONFIG),
            storage_conf: PathBuf::from(DEFAULT_STORAGE_CONF),
        }
    }
}

fn nri_index<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    // A YAML `index: 50` is a number; `"05"` keeps its zero.
    let v = serde_yaml::Value::deserialize(d)?;
    let s = match v {
        serde_yaml::Value::String(s) => s,
        serde_yaml::Value::Number(n) => n.to_string(),
        _ => {
            return Err(serde::de::Error::custom(
                "nri.index must be two digits, 00 to 99",
            ));
        }
    };
    let s = if s.len() == 1 { format!("0{s}") } else { s };
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s)
    } else {
        Err(serde::de::Error::custom(format!(
            "nri.index {s:?} must be two digits, 00 to 99"
        )))
    }
}
