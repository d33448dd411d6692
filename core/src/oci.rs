//! The few fields of an OCI runtime config that device selection reads:
//! `process.env`, `annotations` and `linux.devices[].path`.
//!
//! This is deliberately a read-only view, not a full model of the config. The
//! hook edits configs as JSON values so that every field gpuarch does not own
//! (vendor extensions, fields newer than any OCI types crate) comes out
//! exactly as it came in; a typed round trip would drop or reorder them.

use std::collections::BTreeMap;
use std::io::Read;

use serde::{Deserialize, Serialize};

/// Configs larger than this are not parsed: real ones are kilobytes (what a
/// process can exec is bounded by ARG_MAX, a Kubernetes object's annotations
/// by 256 KiB), and parsing costs up to ten times the bytes, so the bound
/// keeps a hostile config's cost near 160 MiB.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Why a config could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("OCI config is not valid JSON at line {line}, column {column}: {reason}")]
    Syntax {
        line: usize,
        column: usize,
        reason: String,
    },
    #[error("OCI config field error at line {line}, column {column}: {reason}")]
    Field {
        line: usize,
        column: usize,
        reason: String,
    },
    /// A field error in an already parsed config, where no location is known.
    #[error("OCI config field error: {0}")]
    Value(String),
    #[error("OCI config is over {} MiB; refusing it", MAX_CONFIG_BYTES >> 20)]
    TooLarge,
    #[error("cannot read the OCI config: {0}")]
    Read(std::io::Error),
}

// By hand, not `#[from]`: the message already prints the cause, so it is
// not returned again as the source.
impl From<std::io::Error> for OciError {
    fn from(e: std::io::Error) -> Self {
        Self::Read(e)
    }
}

/// Read a whole config, refusing more than [`MAX_CONFIG_BYTES`] without
/// reading past the bound.
pub fn read_bounded(r: impl Read) -> Result<Vec<u8>, OciError> {
    let mut bytes = Vec::new();
    r.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(OciError::TooLarge);
    }
    Ok(bytes)
}

/// Parse a config into a JSON value, for callers that rewrite it.
pub fn parse_value(bytes: &[u8]) -> Result<serde_json::Value, OciError> {
    serde_json::from_slice(bytes).map_err(json_error)
}

/// A serde_json error as an [`OciError`], keeping its location.
fn json_error(e: serde_json::Error) -> OciError {
    let (line, column, reason) = (e.line(), e.column(), e.to_string());
    if e.is_data() {
        OciError::Field {
            line,
            column,
            reason,
        }
    } else {
        OciError::Syntax {
            line,
            column,
            reason,
        }
    }
}

/// What selection needs from a container's config.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerView {
    /// `process.env` entries in order, split at the first `=`. Entries
    /// without `=` are kept out: execve passes them, but no lookup sees them.
    pub env: Vec<(String, String)>,
    /// The annotations gpuarch reads (see [`read_annotation`]); the rest
    /// are skipped while parsing, so a config holding a million of them
    /// costs no more than its bytes.
    pub annotations: BTreeMap<String, String>,
    /// `linux.devices`, in order.
    pub devices: Vec<DeviceNode>,
    /// `process.user`: the uid and gid the container's process runs as,
    /// in the container's user namespace. `None` where the config does not
    /// say (no `process`, or no `process.user`: gpuarchd's NRI path, where
    /// the runtime does not give it); then the process may be any user.
    pub user: Option<(u32, u32)>,
    /// `linux.uidMappings` and `linux.gidMappings`: (container id, host id,
    /// size). Empty without a user namespace.
    pub uid_mappings: Vec<(u32, u32, u32)>,
    pub gid_mappings: Vec<(u32, u32, u32)>,
    /// The consumers in the container's image, where the caller read its
    /// rootfs (the hook does); not part of the config.
    pub software: crate::software::Software,
    /// The engine's names for the container, where the config has them.
    pub names: Names,
}

/// What an engine calls a container, for logs and `gpuarchctl why`. Only
/// Kubernetes' runtimes put names in the config (Docker and podman put
/// none); the id comes from the engine (the OCI state, the runtime's
/// arguments) or, for podman's precreate, from the config's mounts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Names {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The container's name in its pod (or nerdctl's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl Names {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// From the annotations that carry names (containerd's CRI, CRI-O,
    /// nerdctl), and podman's userdata directory among the `mounts`
    /// (source, destination).
    fn from_config(a: &Annotations, mounts: &[(String, String)]) -> Self {
        let first = |keys: &[&str]| keys.iter().find_map(|k| a.get(*k)).map(|v| bounded(v));
        Self {
            id: podman_own_id(mounts).map(str::to_owned),
            name: first(&NAME_ANNOTATIONS[0..3]),
            pod: first(&NAME_ANNOTATIONS[3..5]),
            namespace: first(&[
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.pod.namespace",
            ]),
        }
    }
}

/// A name as logged: at most 253 bytes (a Kubernetes name's limit), cut
/// at a character boundary.
fn bounded(v: &str) -> String {
    // A control character (a newline, an escape) is written out as text:
    // a name is shown on terminals and in logs.
    let v = crate::text::clean(v);
    let mut end = v.len().min(253);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    v[..end].to_owned()
}

/// The annotations naming a container and its pod, in the order read:
/// the container's name (containerd's CRI, CRI-O, nerdctl), then the pod's.
pub const NAME_ANNOTATIONS: [&str; 5] = [
    "io.kubernetes.cri.container-name",
    "io.kubernetes.container.name",
    "nerdctl/name",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.pod.name",
];

/// The id of a podman container, from the mounts podman itself gives it
/// from its userdata directory (`/etc/hosts`, `/etc/hostname`,
/// `/etc/resolv.conf`, `/run/.containerenv`, `/dev/shm`, each from the
/// file of that name), when every mount from any container's userdata
/// names that same id. A container that binds another's userdata in (as
/// the probe did: a rootful user can) names two ids, and gets none: its
/// record must never replace the other container's. (A rootful user who
/// replaces every one of podman's own mounts with another container's
/// files is root on the host already.)
fn podman_own_id(mounts: &[(String, String)]) -> Option<&str> {
    const OWN: [(&str, &str); 5] = [
        ("/etc/hosts", "/userdata/hosts"),
        ("/etc/hostname", "/userdata/hostname"),
        ("/etc/resolv.conf", "/userdata/resolv.conf"),
        ("/run/.containerenv", "/userdata/.containerenv"),
        ("/dev/shm", "/userdata/shm"),
    ];
    let own = mounts.iter().find_map(|(src, dst)| {
        OWN.iter()
            .any(|(d, s)| dst == d && src.ends_with(s))
            .then(|| podman_id(src))
            .flatten()
    })?;
    mounts
        .iter()
        .filter_map(|(src, _)| podman_id(src))
        .all(|id| id == own)
        .then_some(own)
}

/// podman's container id in a mount source under its storage
/// (`…/overlay-containers/<64 hex>/userdata/hosts`): the one place its
/// precreate hook, which gets no OCI state, can learn it.
fn podman_id(source: &str) -> Option<&str> {
    let mut parts = source.split('/');
    while let Some(p) = parts.next() {
        if p.ends_with("-containers") {
            let mut rest = parts.clone();
            if let (Some(id), Some("userdata")) = (rest.next(), rest.next())
                && id.len() == 64
                && id.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Some(id);
            }
        }
    }
    None
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    process: Option<RawProcess>,
    #[serde(default, deserialize_with = "read_annotations")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    linux: Option<RawLinux>,
    #[serde(default)]
    mounts: Option<Vec<RawMount>>,
}

#[derive(Deserialize)]
struct RawMount {
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    destination: Option<String>,
}

/// A container's annotations, key to value.
pub type Annotations = BTreeMap<String, String>;

/// The annotations of Kubernetes' runtimes naming a container's image and
/// its pod's namespace, which scope the JIT caches (`jit_cache.scope`). Set
/// by the runtime (containerd's CRI, CRI-O), after any of the pod's own.
pub const KUBERNETES_ANNOTATIONS: [&str; 7] = [
    "io.kubernetes.cri-o.ImageRef",
    "io.kubernetes.cri-o.Image",
    "io.kubernetes.cri-o.ImageName",
    "io.kubernetes.cri.image-ref",
    "io.kubernetes.cri.image-name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.cri.sandbox-namespace",
];

/// Does gpuarch read annotation `key`: CDI requests, `io.gpuarch.*`, the
/// runtime's image and namespace ([`KUBERNETES_ANNOTATIONS`]), and the
/// container's names ([`NAME_ANNOTATIONS`]).
pub fn read_annotation(key: &str) -> bool {
    key.starts_with("cdi.k8s.io/")
        || key.starts_with("io.gpuarch.")
        || KUBERNETES_ANNOTATIONS.contains(&key)
        || NAME_ANNOTATIONS.contains(&key)
}

/// `annotations`, keeping only what [`read_annotation`] names; every value
/// must still be a string, as the OCI spec says.
fn read_annotations<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Annotations>, D::Error> {
    struct Kept;
    impl<'de> serde::de::Visitor<'de> for Kept {
        type Value = Option<Annotations>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                if read_annotation(&k) {
                    kept.insert(k.into_owned(), m.next_value::<String>()?);
                } else {
                    m.next_value::<StrOnly>()?;
                }
            }
            Ok(Some(kept))
        }
    }
    d.deserialize_option(Kept)
}

/// A string value, checked and dropped.
struct StrOnly;

impl<'de> Deserialize<'de> for StrOnly {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = StrOnly;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, _: &str) -> Result<StrOnly, E> {
                Ok(StrOnly)
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Deserialize)]
struct RawProcess {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    user: Option<RawUser>,
}

#[derive(Deserialize)]
struct RawUser {
    #[serde(default)]
    uid: u32,
    #[serde(default)]
    gid: u32,
}

#[derive(Deserialize)]
struct RawLinux {
    #[serde(default)]
    devices: Option<Vec<RawDevice>>,
    #[serde(default, rename = "uidMappings")]
    uid_mappings: Option<Vec<RawIdMapping>>,
    #[serde(default, rename = "gidMappings")]
    gid_mappings: Option<Vec<RawIdMapping>>,
}

#[derive(Deserialize)]
struct RawIdMapping {
    #[serde(rename = "containerID")]
    container_id: u32,
    #[serde(rename = "hostID")]
    host_id: u32,
    size: u32,
}

#[derive(Deserialize)]
struct RawDevice {
    path: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    major: Option<i64>,
    #[serde(default)]
    minor: Option<i64>,
}

/// One `linux.devices` entry: the path inside the container, and for a
/// character device its real number, which names the device whatever the
/// path says (`--device /dev/nvidia3:/dev/nvidia0` is minor 3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceNode {
    pub path: String,
    /// `(major, minor)` of a `type: c` entry that has both.
    pub char_number: Option<(u32, u32)>,
}

impl DeviceNode {
    /// A node known by its path alone.
    pub fn path(path: &str) -> Self {
        Self {
            path: path.to_owned(),
            char_number: None,
        }
    }
}

impl From<RawDevice> for DeviceNode {
    fn from(d: RawDevice) -> Self {
        let number = match (d.kind.as_deref(), d.major, d.minor) {
            (Some("c"), Some(ma), Some(mi)) => u32::try_from(ma).ok().zip(u32::try_from(mi).ok()),
            _ => None,
        };
        Self {
            path: d.path,
            char_number: number,
        }
    }
}

impl ContainerView {
    /// Read the view from an OCI config's JSON text.
    pub fn from_json(bytes: &[u8]) -> Result<Self, OciError> {
        let raw: Raw = serde_json::from_slice(bytes).map_err(json_error)?;
        Ok(Self::from_raw(raw))
    }

    /// Read the view from an already parsed config.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, OciError> {
        let raw = Raw::deserialize(value).map_err(|e| OciError::Value(e.to_string()))?;
        Ok(Self::from_raw(raw))
    }

    fn from_raw(raw: Raw) -> Self {
        let (env, user) = match raw.process {
            Some(p) => (p.env.unwrap_or_default(), p.user.map(|u| (u.uid, u.gid))),
            None => (Vec::new(), None),
        };
        let env = env
            .into_iter()
            .filter_map(|e| e.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        let maps = |m: Option<Vec<RawIdMapping>>| -> Vec<(u32, u32, u32)> {
            m.unwrap_or_default()
                .into_iter()
                .map(|m| (m.container_id, m.host_id, m.size))
                .collect()
        };
        let (devices, uid_mappings, gid_mappings) = match raw.linux {
            Some(l) => (
                l.devices.unwrap_or_default(),
                maps(l.uid_mappings),
                maps(l.gid_mappings),
            ),
            None => Default::default(),
        };
        let annotations = raw.annotations.unwrap_or_default();
        let mounts: Vec<(String, String)> = raw
            .mounts
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| Some((m.source?, m.destination.unwrap_or_default())))
            .collect();
        Self {
            env,
            names: Names::from_config(&annotations, &mounts),
            annotations,
            devices: devices.into_iter().map(DeviceNode::from).collect(),
            user,
            uid_mappings,
            gid_mappings,
            software: Default::default(),
        }
    }

    /// The host uid and gid the container's process runs as: `process.user`
    /// through the user namespace's mappings. `None` without a process, or
    /// when a mapping does not cover the id.
    pub fn host_user(&self) -> Option<(u32, u32)> {
        let (uid, gid) = self.user?;
        let map = |id: u32, maps: &[(u32, u32, u32)]| -> Option<u32> {
            if maps.is_empty() {
                return Some(id);
            }
            maps.iter().find_map(|&(inside, host, size)| {
                let off = id.checked_sub(inside)?;
                (off < size).then(|| host.checked_add(off)).flatten()
            })
        };
        Some((map(uid, &self.uid_mappings)?, map(gid, &self.gid_mappings)?))
    }

    /// The value a process would see for `name`: getenv returns the first
    /// entry of that name.
    pub fn env_get(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// What is known of the image's consumers: what its rootfs held, and
    /// what its env says.
    pub fn software_known(&self) -> crate::software::Software {
        self.software
            .clone()
            .with_env(|k| self.env_get(k).map(str::to_owned))
    }

    /// A view with only these env entries, for planning without a config.
    pub fn with_env<K: Into<String>, V: Into<String>>(
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_kubernetes_annotations_and_podmans_userdata() {
        let id = "c6bc73e047ca83c62f6b452532e52500e5ca650a065941c61787496d7da994f6";
        let cri = serde_json::json!({
            "annotations": {
                "io.kubernetes.cri.container-name": "trainer",
                "io.kubernetes.cri.sandbox-name": "job-7",
                "io.kubernetes.cri.sandbox-namespace": "ml",
                "org.example/other": "x"
            },
            "mounts": [
                {"destination": "/etc/hosts", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/hosts")},
                {"destination": "/run/.containerenv", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/.containerenv")}
            ]
        });
        let v = ContainerView::from_value(&cri).unwrap();
        assert_eq!(v.names.name.as_deref(), Some("trainer"));
        assert_eq!(v.names.pod.as_deref(), Some("job-7"));
        assert_eq!(v.names.namespace.as_deref(), Some("ml"));
        assert_eq!(v.names.id.as_deref(), Some(id));
        assert!(!v.annotations.contains_key("org.example/other"));
        // Not podman's layout, or not a whole id: no id.
        for src in [
            format!("/srv/overlay-containers/{}/userdata/hosts", &id[..12]),
            format!("/srv/containers/{id}/userdata/hosts"),
            format!("/srv/overlay-containers/{id}/other/hosts"),
        ] {
            let c = serde_json::json!({"mounts": [{"source": src}, {"type": "tmpfs"}]});
            assert_eq!(
                ContainerView::from_value(&c).unwrap().names,
                Names::default()
            );
        }
        // Only podman's own mounts name the id; a container that binds
        // another's userdata in names none (its record must not replace
        // the other's).
        let other = "d".repeat(64);
        let env = |id: &str| serde_json::json!({"destination": "/run/.containerenv", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/.containerenv")});
        let user = |id: &str, dst: &str| serde_json::json!({"destination": dst, "source": format!("/run/containers/storage/overlay-containers/{id}/userdata")});
        for (mounts, want) in [
            (vec![env(id)], Some(id)),
            (vec![env(id), user(&other, "/mnt/x")], None),
            (vec![user(&other, "/mnt/x"), env(id)], None),
            (vec![user(&other, "/run/.containerenv")], None),
            (vec![user(&other, "/etc/hosts")], None),
            (
                vec![
                    serde_json::json!({"destination": "/etc/hosts", "source": format!("/run/containers/storage/overlay-containers/{id}/userdata/hosts")}),
                ],
                Some(id),
            ),
        ] {
            let c = serde_json::json!({ "mounts": mounts });
            let got = ContainerView::from_value(&c).unwrap().names.id;
            assert_eq!(got.as_deref(), want, "{c}");
        }
        let long = "é".repeat(300);
        let c = serde_json::json!({"annotations": {"io.kubernetes.pod.name": long}});
        let pod = ContainerView::from_value(&c).unwrap().names.pod.unwrap();
        assert!(pod.len() <= 253 && long.starts_with(&pod));
        // A pod author's newline and escape sequence, written out as text.
        let c =
            serde_json::json!({"annotations": {"io.kubernetes.pod.name": "web\nroot\u{1b}[2J"}});
        let pod = ContainerView::from_value(&c).unwrap().names.pod.unwrap();
        assert_eq!(pod, "web\\nroot\\u{1b}[2J");
    }

    #[test]
    fn reads_env_annotations_and_devices_and_ignores_the_rest() {
        let cfg = br#"{
          "ociVersion": "1.2.0",
          "process": {"env": ["PATH=/usr/bin", "A=1=2", "NOEQ", "A=second"], "args": ["sh"]},
          "annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"},
          "linux": {"devices": [{"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}]},
          "vendor.example/extension": {"anything": [1, 2, 3]}
        }"#;
        let v = ContainerView::from_json(cfg).unwrap();
        assert_eq!(v.env_get("A"), Some("1=2"));
        assert_eq!(v.env_get("NOEQ"), None);
        assert_eq!(v.annotations["cdi.k8s.io/x"], "nvidia.com/gpu=0");
        assert_eq!(
            v.devices,
            [DeviceNode {
                path: "/dev/nvidia1".into(),
                char_number: Some((195, 1))
            }]
        );
    }

    #[test]
    fn a_parsed_config_gives_the_same_view() {
        let text = br#"{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]}, "linux": {"devices": [{"path": "/dev/nvidia0"}]}}"#;
        let value: serde_json::Value = serde_json::from_slice(text).unwrap();
        assert_eq!(
            ContainerView::from_value(&value).unwrap(),
            ContainerView::from_json(text).unwrap()
        );
        let bad = serde_json::json!({"annotations": {"a": 1}});
        let e = ContainerView::from_value(&bad).unwrap_err().to_string();
        assert!(!e.contains("line 0"), "{e}");
    }

    #[test]
    fn reading_is_bounded() {
        assert_eq!(read_bounded(&b"{}"[..]).unwrap(), b"{}");
        let big = vec![b' '; (MAX_CONFIG_BYTES + 1) as usize];
        assert!(matches!(read_bounded(&big[..]), Err(OciError::TooLarge)));
    }

    #[test]
    fn a_minimal_config_is_an_empty_view() {
        assert_eq!(
            ContainerView::from_json(b"{}").unwrap(),
            ContainerView::default()
        );
    }

    #[test]
    fn malformed_configs_say_where() {
        let e = ContainerView::from_json(b"{\n\"process\": {\"env\": [1]}}").unwrap_err();
        assert!(matches!(e, OciError::Field { line: 2, .. }), "{e}");
        let e = ContainerView::from_json(b"{\n\n\"process\": ").unwrap_err();
        assert!(matches!(e, OciError::Syntax { line: 3, .. }), "{e}");
    }
}
