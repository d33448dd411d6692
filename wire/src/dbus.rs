//! `io.gpuarch1` on the system bus: its names, the records its methods
//! return, a job's state, and the proxies gpuarchctl calls it with.
//!
//! Each record is an `a{sv}` dictionary on the wire (the signatures in
//! `packaging/dbus/io.gpuarch1.xml` are the contract) with a fixed set of
//! keys. gpuarchd builds them from its own types; a reader refuses a record
//! with a key it does not know or without one it needs, naming the key.

use std::collections::BTreeMap;

use gpuarch_core::arch::ComputeCapability;
use gpuarch_core::features::Feature;
use gpuarch_core::snapshot::{Device, MigDevice};
use serde::{Deserialize, Serialize};
use zbus::{DeserializeDict, OwnedObjectPath, SerializeDict, Type, proxy};

/// The well-known name on the system bus.
pub const BUS_NAME: &str = "io.gpuarch1";
/// The same objects on a second connection of gpuarchd's, which only root
/// and group gpuarch may call (the bus policy refuses everyone else). The
/// bus queues calls per receiving connection, first in first out: on
/// [`BUS_NAME`] an admin's call waits behind every call in flight from
/// everyone (the bus lets each caller have 128); here, only behind those
/// of root and group gpuarch.
pub const ADMIN_BUS_NAME: &str = "io.gpuarch1.Admin";
/// Members of this group (and root) may call privileged methods, and
/// [`ADMIN_BUS_NAME`].
pub const ADMIN_GROUP: &str = "gpuarch";
/// The object serving every interface but the jobs'.
pub const OBJECT_PATH: &str = "/io/gpuarch1";
/// Where jobs appear: `/io/gpuarch1/jobs/N`.
pub const JOBS_PATH: &str = "/io/gpuarch1/jobs";

/// One GPU of `ListDevices`.
#[derive(Debug, Clone, PartialEq, Eq, SerializeDict, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", deny_unknown_fields)]
pub struct DeviceRecord {
    pub index: u32,
    /// N of `/dev/nvidiaN`.
    pub minor: u32,
    pub uuid: String,
    pub name: String,
    /// `8.6`.
    pub compute_capability: String,
    /// `Ampere`; empty for a capability gpuarch has no name for.
    pub arch: String,
    pub pci_bus_id: String,
    pub memory_bytes: u64,
    /// The gated features it has (`bf16`, `fp8`, ...), as `arch features`.
    pub features: Vec<String>,
    pub mig: Vec<MigRecord>,
    /// NVML's brand as the snapshot spells it (`tesla`); absent where
    /// NVML did not say.
    pub brand: Option<String>,
}

/// One MIG device of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, SerializeDict, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", deny_unknown_fields)]
pub struct MigRecord {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
}

impl From<&Device> for DeviceRecord {
    fn from(d: &Device) -> Self {
        let cc = d.compute_capability;
        DeviceRecord {
            index: d.index,
            minor: d.minor,
            uuid: d.uuid.clone(),
            name: d.name.clone(),
            compute_capability: cc.to_string(),
            arch: cc.arch_name().unwrap_or_default().to_owned(),
            pci_bus_id: d.pci_bus_id.clone(),
            memory_bytes: d.memory_bytes,
            features: Feature::ALL
                .iter()
                .filter(|f| f.supported_on(cc))
                .map(|f| f.name().to_owned())
                .collect(),
            mig: d
                .mig
                .iter()
                .map(|m| MigRecord {
                    index: m.index,
                    uuid: m.uuid.clone(),
                    name: m.name.clone(),
                    memory_bytes: m.memory_bytes,
                })
                .collect(),
            brand: d.brand.clone(),
        }
    }
}

/// A record whose values do not make a device.
#[derive(Debug, thiserror::Error)]
#[error("ListDevices entry {index}: compute_capability {value:?}: {error}")]
pub struct BadDevice {
    pub index: u32,
    pub value: String,
    pub error: gpuarch_core::arch::ArchError,
}

impl TryFrom<DeviceRecord> for Device {
    type Error = BadDevice;

    fn try_from(r: DeviceRecord) -> Result<Self, BadDevice> {
        let compute_capability =
            ComputeCapability::parse_reported(&r.compute_capability).map_err(|error| {
                BadDevice {
                    index: r.index,
                    value: r.compute_capability.clone(),
                    error,
                }
            })?;
        Ok(Device {
            index: r.index,
            minor: r.minor,
            uuid: r.uuid,
            name: r.name,
            compute_capability,
            pci_bus_id: r.pci_bus_id,
            memory_bytes: r.memory_bytes,
            brand: r.brand,
            mig: r
                .mig
                .into_iter()
                .map(|m| MigDevice {
                    index: m.index,
                    uuid: m.uuid,
                    name: m.name,
                    memory_bytes: m.memory_bytes,
                })
                .collect(),
        })
    }
}

/// One stored build of `ListKernels`.
#[derive(Debug, Clone, PartialEq, Eq, SerializeDict, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", deny_unknown_fields)]
pub struct KernelRecord {
    /// The store key (sha256, hex).
    pub key: String,
    pub package: String,
    pub version: String,
    pub variant: String,
    /// The variant's dtype; empty for a package without dtype variants.
    pub dtype: String,
    /// The build target: `sm_86`.
    pub arch: String,
    /// The compiler that built it: `nvrtc 13.0`.
    pub toolkit: String,
    pub bytes: u64,
    pub files: Vec<String>,
    /// Pre-warmed by an admin: never evicted.
    pub pinned: bool,
    /// Mounted into a running container now.
    pub in_use: bool,
    /// Seconds since the epoch.
    pub last_used: u64,
    /// Seconds since the epoch.
    pub built_at: u64,
    /// The entry's directory in the store.
    pub path: String,
}

/// One JIT cache of `ListCaches`: `<dir>/<scope>/<targets>/`.
#[derive(Debug, Clone, PartialEq, Eq, SerializeDict, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", deny_unknown_fields)]
pub struct JitCacheRecord {
    /// The scope's directory name (`uid1000-image-...`).
    pub scope: String,
    /// What the scope is by: `image`, `uid`, `namespace`, `shared`; empty
    /// when its label cannot be read.
    pub kind: String,
    /// The host uid owning the cache.
    pub uid: u32,
    /// The image or Kubernetes namespace of the scope; empty for none.
    pub image: String,
    pub namespace: String,
    /// The targets directory's name (`sm_86+sm_90-cuda12.8`).
    pub targets: String,
    /// Disk use (allocated blocks), not following symlinks.
    pub bytes: u64,
    /// Mounted into a running container now.
    pub in_use: bool,
    /// When a container was last given it, in seconds since the epoch.
    pub last_used: u64,
    /// The cache's directory.
    pub path: String,
}

/// One checked build of `Verify`.
#[derive(Debug, Clone, PartialEq, Eq, SerializeDict, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", deny_unknown_fields)]
pub struct VerifyRecord {
    pub key: String,
    pub package: String,
    pub arch: String,
    pub variant: String,
    /// Every file matched its sha256.
    pub ok: bool,
    /// What did not match; empty when ok.
    pub problem: String,
}

/// A job's `State`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    Type,
    zbus::Variant,
    zbus::OwnedVariant,
)]
#[zbus(signature = "s", rename_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    #[default]
    Running,
    /// Everything asked for is served.
    Done,
    /// Something asked for is not served; the log says what.
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Variables and their values, as `Plan` answers them (`a{ss}`).
pub type Env = BTreeMap<String, String>;

/// `io.gpuarch1.Inventory`.
#[proxy(
    interface = "io.gpuarch1.Inventory",
    default_service = "io.gpuarch1",
    default_path = "/io/gpuarch1"
)]
pub trait Inventory {
    fn list_devices(&self) -> zbus::Result<Vec<DeviceRecord>>;
    /// The env a container with those GPUs gets, and why: two out args (a
    /// tuple written out; an alias of the tuple would be one struct).
    fn plan(&self, devices: &[&str]) -> zbus::Result<(Env, Vec<String>)>;
    #[zbus(name = "Match")]
    fn match_devices(&self, requirement: &str) -> zbus::Result<Vec<String>>;
    fn slurm_gres(&self) -> zbus::Result<String>;
    fn slurm_plan(&self, gpus: &str) -> zbus::Result<(Env, Vec<String>)>;
    /// The JSON report of the kept audit of `image` for `devices`.
    fn audit_image(&self, image: &str, devices: &[&str]) -> zbus::Result<String>;
    #[zbus(property)]
    fn compute_capabilities(&self) -> zbus::Result<Vec<String>>;
    #[zbus(property)]
    fn driver_version(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn cuda_driver_version(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn stale(&self) -> zbus::Result<bool>;
    #[zbus(property)]
    fn generated_at(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn source(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn last_refresh(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn last_error(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn nvml_library(&self) -> zbus::Result<String>;
    #[zbus(signal)]
    fn devices_changed(&self) -> zbus::Result<()>;
}

/// `io.gpuarch1.Daemon`.
#[proxy(
    interface = "io.gpuarch1.Daemon",
    default_service = "io.gpuarch1",
    default_path = "/io/gpuarch1"
)]
pub trait Daemon {
    fn reload(&self) -> zbus::Result<()>;
    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn started_at(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn nri_state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn nri_planned(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn nri_last(&self) -> zbus::Result<String>;
}

/// `io.gpuarch1.KernelCache`.
#[proxy(
    interface = "io.gpuarch1.KernelCache",
    default_service = "io.gpuarch1",
    default_path = "/io/gpuarch1"
)]
pub trait KernelCache {
    fn list_kernels(&self) -> zbus::Result<Vec<KernelRecord>>;
    fn prewarm(&self, packages: &[&str], archs: &[&str]) -> zbus::Result<OwnedObjectPath>;
    fn pull(&self, packages: &[&str], archs: &[&str], pin: bool) -> zbus::Result<OwnedObjectPath>;
    fn push(&self, packages: &[&str], archs: &[&str]) -> zbus::Result<OwnedObjectPath>;
    fn import(
        &self,
        name: &str,
        files: &[(&str, zbus::Fd<'_>)],
        ldconfig: bool,
    ) -> zbus::Result<OwnedObjectPath>;
    fn import_library(&self, wheel: zbus::Fd<'_>, name: &str) -> zbus::Result<OwnedObjectPath>;
    fn pull_library(&self, dist: &str, version: &str) -> zbus::Result<OwnedObjectPath>;
    fn remove_import(&self, name: &str) -> zbus::Result<u32>;
    fn garbage_collect(&self) -> zbus::Result<u64>;
    fn verify(&self) -> zbus::Result<Vec<VerifyRecord>>;
    #[zbus(property)]
    fn used_bytes(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn limit_bytes(&self) -> zbus::Result<u64>;
    /// The compiler NVRTC packages are built with (`NVRTC 12.9 (PATH)`),
    /// or `none: REASON` when no NVRTC build is possible.
    #[zbus(property)]
    fn compiler(&self) -> zbus::Result<String>;
}

/// `io.gpuarch1.JitCache`.
#[proxy(
    interface = "io.gpuarch1.JitCache",
    default_service = "io.gpuarch1",
    default_path = "/io/gpuarch1"
)]
pub trait JitCache {
    fn list_caches(&self) -> zbus::Result<Vec<JitCacheRecord>>;
    fn garbage_collect(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn used_bytes(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn limit_bytes(&self) -> zbus::Result<u64>;
}

/// `io.gpuarch1.Job`.
#[proxy(interface = "io.gpuarch1.Job", default_service = "io.gpuarch1")]
pub trait Job {
    #[zbus(property)]
    fn progress(&self) -> zbus::Result<f64>;
    #[zbus(property)]
    fn state(&self) -> zbus::Result<JobState>;
    #[zbus(property)]
    fn message(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn log(&self) -> zbus::Result<Vec<String>>;
    #[zbus(signal)]
    fn finished(&self, ok: bool, message: String) -> zbus::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use zbus::wire::{LE, serialized::Context, to_bytes};
    use zbus::{OwnedVariant, Variant};

    fn record() -> VerifyRecord {
        VerifyRecord {
            key: "ab".into(),
            package: "saxpy".into(),
            arch: "sm_86".into(),
            variant: "f32".into(),
            ok: false,
            problem: "sha256 mismatch".into(),
        }
    }

    /// The records are `a{sv}` on the wire, as the interface XML says.
    #[test]
    fn records_are_dictionaries() {
        assert_eq!(DeviceRecord::SIGNATURE, "a{sv}");
        assert_eq!(KernelRecord::SIGNATURE, "a{sv}");
        assert_eq!(VerifyRecord::SIGNATURE, "a{sv}");
        assert_eq!(JitCacheRecord::SIGNATURE, "a{sv}");
        assert_eq!(JobState::SIGNATURE, "s");
        let ctxt = Context::new(LE, 0);
        let bytes = to_bytes(ctxt, &record()).unwrap();
        let dict: HashMap<String, OwnedVariant> = bytes.deserialize().unwrap().0;
        assert_eq!(dict.len(), 6);
        assert_eq!(
            String::try_from(dict["problem"].try_clone().unwrap()).unwrap(),
            "sha256 mismatch"
        );
        let back: VerifyRecord = bytes.deserialize().unwrap().0;
        assert_eq!(back, record());
    }

    /// A key the reader does not know, or a missing one, is an error that
    /// names it: never a default.
    #[test]
    fn unknown_and_missing_keys_are_errors_naming_them() {
        let ctxt = Context::new(LE, 0);
        let mut dict: HashMap<&str, Variant<'_>> = HashMap::from([
            ("key", Variant::from("ab")),
            ("package", Variant::from("saxpy")),
            ("arch", Variant::from("sm_86")),
            ("variant", Variant::from("f32")),
            ("ok", Variant::from(true)),
        ]);
        let missing = to_bytes(ctxt, &dict).unwrap();
        let e = missing.deserialize::<VerifyRecord>().unwrap_err();
        assert!(e.to_string().contains("problem"), "{e}");
        dict.insert("problem", Variant::from(""));
        dict.insert("colour", Variant::from("blue"));
        let extra = to_bytes(ctxt, &dict).unwrap();
        let e = extra.deserialize::<VerifyRecord>().unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
        // A key of the wrong type is refused too.
        dict.remove("colour");
        dict.insert("ok", Variant::from("yes"));
        let wrong = to_bytes(ctxt, &dict).unwrap();
        assert!(wrong.deserialize::<VerifyRecord>().is_err());
    }

    #[test]
    fn job_state_is_a_lowercase_string() {
        let v = Variant::from(JobState::Done);
        assert_eq!(v, Variant::from("done"));
        assert_eq!(
            JobState::try_from(OwnedVariant::try_from(Variant::from("failed")).unwrap()).unwrap(),
            JobState::Failed
        );
        assert!(JobState::try_from(OwnedVariant::try_from(Variant::from("odd")).unwrap()).is_err());
    }
}
