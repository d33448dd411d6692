//! Where gpuarch learns the host's GPUs: NVML (through `nvml-wrapper`) or a
//! snapshot file, behind one trait; and the atomic snapshot writer.
//!
//! The hook and the CLI pick an implementation explicitly; tests use the real
//! [`NvmlInventory`] against the fake `libnvidia-ml.so` of tests/fake-nvml.
#![forbid(unsafe_code)]

pub mod task_prolog;

pub use gpuarch_fs::{trust, write_atomic};

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use gpuarch_core::arch::{ComputeCapability, CudaVersion};
use gpuarch_core::snapshot::{self, Device, MigDevice, Snapshot, SnapshotError};
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

/// Where the daemon writes the snapshot and the hook reads it.
pub const DEFAULT_SNAPSHOT: &str = gpuarch_core::config::DEFAULT_SNAPSHOT;
/// The NVML library loaded when none is named (what the driver installs).
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(
        "cannot load the NVML library '{lib}': {reason} (is the NVIDIA driver installed? name the library with --nvml-lib or GPUARCH_NVML_LIB)"
    )]
    NvmlLoad { lib: String, reason: String },
    #[error("NVML ('{lib}') failed in {call}{}: {error}", device.map(|d| format!(" for device {d}")).unwrap_or_default())]
    Nvml {
        lib: String,
        call: &'static str,
        device: Option<u32>,
        error: NvmlError,
    },
    #[error("NVML ('{lib}') reported {what} for device {device}: {value}")]
    Implausible {
        lib: String,
        device: u32,
        what: &'static str,
        value: String,
    },
    #[error(
        "no snapshot at {} (is gpuarchd running?) and NVML is unavailable: {error}",
        snapshot.display()
    )]
    NoSource {
        /// The snapshot looked for (the config's `daemon.snapshot`).
        snapshot: PathBuf,
        error: Box<InventoryError>,
    },
    #[error("cannot read snapshot {}: {error}", path.display())]
    SnapshotRead { path: PathBuf, error: io::Error },
    #[error("snapshot {}: {error}", path.display())]
    SnapshotParse { path: PathBuf, error: SnapshotError },
    #[error("cannot write snapshot {}: {error}", path.display())]
    SnapshotWrite { path: PathBuf, error: io::Error },
}

/// A source of the host's GPU inventory.
pub trait GpuInventory {
    /// Read the inventory now.
    fn snapshot(&self) -> Result<Snapshot, InventoryError>;
    /// One line naming the source, for status output and logs.
    fn describe(&self) -> String;
}

/// The real thing: NVML through `nvml-wrapper`.
#[derive(Debug)]
pub struct NvmlInventory {
    nvml: Nvml,
    lib: String,
}

impl NvmlInventory {
    /// Load and initialise NVML from `lib` (default [`DEFAULT_NVML_LIB`]).
    pub fn open(lib: Option<&Path>) -> Result<Self, InventoryError> {
        let lib_os: &OsStr = lib.map_or(OsStr::new(DEFAULT_NVML_LIB), Path::as_os_str);
        let lib_name = lib_os.to_string_lossy().into_owned();
        let nvml = Nvml::builder()
            .lib_path(lib_os)
            .init()
            .map_err(|e| match e {
                NvmlError::LibloadingError(e) => InventoryError::NvmlLoad {
                    lib: lib_name.clone(),
                    reason: e.to_string(),
                },
                NvmlError::FailedToLoadSymbol(s) => InventoryError::NvmlLoad {
                    lib: lib_name.clone(),
                    reason: format!("not an NVML library ({s})"),
                },
                error => InventoryError::Nvml {
                    lib: lib_name.clone(),
                    call: "nvmlInit_v2",
                    device: None,
                    error,
                },
            })?;
        Ok(Self {
            nvml,
            lib: lib_name,
        })
    }

    fn call<T>(
        &self,
        call: &'static str,
        device: Option<u32>,
        r: Result<T, NvmlError>,
    ) -> Result<T, InventoryError> {
        r.map_err(|error| InventoryError::Nvml {
            lib: self.lib.clone(),
            call,
            device,
            error,
        })
    }

    fn device(&self, index: u32) -> Result<Device, InventoryError> {
        let i = Some(index);
        let d = self.call(
            "nvmlDeviceGetHandleByIndex_v2",
            i,
            self.nvml.device_by_index(index),
        )?;
        let cc = self.call(
            "nvmlDeviceGetCudaComputeCapability",
            i,
            d.cuda_compute_capability(),
        )?;
        let compute_capability = match (u8::try_from(cc.major), u8::try_from(cc.minor)) {
            (Ok(major @ 1..=99), Ok(minor @ 0..=9)) => ComputeCapability::new(major, minor),
            _ => {
                return Err(InventoryError::Implausible {
                    lib: self.lib.clone(),
                    device: index,
                    what: "compute capability",
                    value: format!("{}.{}", cc.major, cc.minor),
                });
            }
        };
        let mig = self.mig_devices(&d, index)?;
        Ok(Device {
            index,
            minor: self.call("nvmlDeviceGetMinorNumber", i, d.minor_number())?,
            uuid: self.call("nvmlDeviceGetUUID", i, d.uuid())?,
            name: self.call("nvmlDeviceGetName", i, d.name())?,
            compute_capability,
            pci_bus_id: self
                .call("nvmlDeviceGetPciInfo_v3", i, d.pci_info())?
                .bus_id,
            memory_bytes: self
                .call("nvmlDeviceGetMemoryInfo_v2", i, d.memory_info())?
                .total,
            // Only `brand=` requirements need it; a driver without the call
            // leaves them as NVIDIA's runtime does without a brand: met.
            brand: d.brand().ok().map(brand_name),
            mig,
        })
    }

    fn mig_devices(
        &self,
        d: &nvml_wrapper::Device<'_>,
        index: u32,
    ) -> Result<Vec<MigDevice>, InventoryError> {
        let i = Some(index);
        match d.mig_mode() {
            // GPUs without MIG say NotSupported; drivers without it lack the symbol.
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {
                return Ok(Vec::new());
            }
            Err(e) => return self.call("nvmlDeviceGetMigMode", i, Err(e)),
            // NVML_DEVICE_MIG_ENABLE is 1.
            Ok(m) if m.current != 1 => {
                return Ok(Vec::new());
            }
            Ok(_) => {}
        }
        let max = self.call("nvmlDeviceGetMaxMigDeviceCount", i, d.mig_device_count())?;
        let mut out = Vec::new();
        for m in 0..max {
            let h = match d.mig_device_by_index(m) {
                Ok(h) => h,
                // Unpopulated slots.
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return self.call("nvmlDeviceGetMigDeviceHandleByIndex", i, Err(e)),
            };
            out.push(MigDevice {
                index: m,
                uuid: self.call("nvmlDeviceGetUUID", i, h.uuid())?,
                name: self.call("nvmlDeviceGetName", i, h.name())?,
                memory_bytes: self
                    .call("nvmlDeviceGetMemoryInfo_v2", i, h.memory_info())?
                    .total,
            });
        }
        Ok(out)
    }
}

impl GpuInventory for NvmlInventory {
    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        let driver_version = self.call(
            "nvmlSystemGetDriverVersion",
            None,
            self.nvml.sys_driver_version(),
        )?;
        let cuda = self.call(
            "nvmlSystemGetCudaDriverVersion_v2",
            None,
            self.nvml.sys_cuda_driver_version(),
        )?;
        let cuda_driver_version = CudaVersion::from_nvml(cuda)
            .map(|v| v.to_string())
            .unwrap_or_else(|| cuda.to_string());
        let count = self.call("nvmlDeviceGetCount_v2", None, self.nvml.device_count())?;
        let devices = (0..count)
            .map(|i| self.device(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Snapshot {
            schema: snapshot::SCHEMA,
            source: "nvml".to_owned(),
            generated_at: now_rfc3339(),
            driver_version,
            cuda_driver_version,
            stale: false,
            devices,
        })
    }

    fn describe(&self) -> String {
        format!("NVML ({})", self.lib)
    }
}

/// A snapshot file written by gpuarchd (or a fixture).
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    pub path: PathBuf,
}

impl SnapshotFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

impl GpuInventory for SnapshotFile {
    fn snapshot(&self) -> Result<Snapshot, InventoryError> {
        read_snapshot(&self.path)
    }

    fn describe(&self) -> String {
        format!("snapshot {}", self.path.display())
    }
}

/// NVML's brand as the snapshot spells it: the `nvmlBrandType_t` name
/// without `NVML_BRAND_`, lowercased.
fn brand_name(b: nvml_wrapper::enum_wrappers::device::Brand) -> String {
    use nvml_wrapper::enum_wrappers::device::Brand as B;
    match b {
        B::Unknown => "unknown",
        B::Quadro => "quadro",
        B::Tesla => "tesla",
        B::NVS => "nvs",
        B::GRID => "grid",
        B::GeForce => "geforce",
        B::Titan => "titan",
        B::VApps => "nvidia_vapps",
        B::VPC => "nvidia_vpc",
        B::VCS => "nvidia_vcs",
        B::VWS => "nvidia_vws",
        B::CloudGaming | B::VGaming => "nvidia_cloud_gaming",
        B::QuadroRTX => "quadro_rtx",
        B::NvidiaRTX => "nvidia_rtx",
        B::Nvidia => "nvidia",
        B::GeForceRTX => "geforce_rtx",
        B::TitanRTX => "titan_rtx",
    }
    .to_owned()
}

/// Read and check a snapshot file, refusing files over the size limit
/// without reading them whole.
pub fn read_snapshot(path: &Path) -> Result<Snapshot, InventoryError> {
    let read_err = |error| InventoryError::SnapshotRead {
        path: path.to_owned(),
        error,
    };
    let f = File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    f.take(snapshot::MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    Snapshot::from_json(&bytes).map_err(|error| InventoryError::SnapshotParse {
        path: path.to_owned(),
        error,
    })
}

/// Write a snapshot so that readers see the old file or the new one, never a
/// part (see [`write_atomic`]). The file is world-readable: inventory reads
/// are open to every local user.
pub fn write_snapshot(path: &Path, snap: &Snapshot) -> Result<(), InventoryError> {
    let mut text = snap.to_json_pretty();
    text.push('\n');
    write_atomic(path, text.as_bytes()).map_err(|error| InventoryError::SnapshotWrite {
        path: path.to_owned(),
        error,
    })
}

/// Read the inventory from the usual source: NVML from `nvml_lib` if given;
/// else the snapshot [`snapshot_source`] finds (`snapshot`, then
/// `GPUARCH_INVENTORY`, then `configured`, the config's `daemon.snapshot`,
/// if it exists); else NVML (`GPUARCH_NVML_LIB` or [`DEFAULT_NVML_LIB`]).
/// Returns the snapshot and a line naming the source.
pub fn read_inventory(
    nvml_lib: Option<&Path>,
    snapshot: Option<&Path>,
    configured: &Path,
) -> Result<(Snapshot, String), InventoryError> {
    let from = |inv: &dyn GpuInventory| Ok((inv.snapshot()?, inv.describe()));
    if let Some(lib) = nvml_lib {
        return from(&NvmlInventory::open(Some(lib))?);
    }
    if let Some(path) = snapshot_source(snapshot, configured) {
        return from(&SnapshotFile::new(path));
    }
    read_nvml(configured)
}

/// `GPUARCH_INVENTORY`, where it names a path: set but empty (a unit's
/// `Environment=GPUARCH_INVENTORY=`, a script's `GPUARCH_INVENTORY= cmd`)
/// is unset, not the path "".
pub fn inventory_env() -> Option<PathBuf> {
    std::env::var_os("GPUARCH_INVENTORY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The snapshot [`read_inventory`] reads when not told to use NVML:
/// `snapshot`, else `GPUARCH_INVENTORY`, else `configured` (the config's
/// `daemon.snapshot`, [`DEFAULT_SNAPSHOT`] unless set) if it exists; `None`
/// leaves NVML.
pub fn snapshot_source(snapshot: Option<&Path>, configured: &Path) -> Option<PathBuf> {
    snapshot
        .map(Path::to_path_buf)
        .or_else(inventory_env)
        .or_else(|| configured.exists().then(|| configured.to_path_buf()))
}

/// The inventory from NVML (`GPUARCH_NVML_LIB` or [`DEFAULT_NVML_LIB`]),
/// as [`read_inventory`] reads it when there is no snapshot at `snapshot`
/// (named in the error when NVML cannot be loaded either).
pub fn read_nvml(snapshot: &Path) -> Result<(Snapshot, String), InventoryError> {
    let from = |inv: &dyn GpuInventory| Ok((inv.snapshot()?, inv.describe()));
    let lib = std::env::var_os("GPUARCH_NVML_LIB").map(PathBuf::from);
    let nvml = NvmlInventory::open(lib.as_deref()).map_err(|e| InventoryError::NoSource {
        snapshot: snapshot.to_owned(),
        error: Box::new(e),
    })?;
    from(&nvml)
}

/// Now, as RFC 3339 UTC to the second.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn sample() -> Snapshot {
        Snapshot {
            schema: 1,
            source: "test".into(),
            generated_at: now_rfc3339(),
            driver_version: "580.95.05".into(),
            cuda_driver_version: "13.0".into(),
            stale: false,
            devices: vec![],
        }
    }

    #[test]
    fn atomic_write_round_trips_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.json");
        write_snapshot(&path, &sample()).unwrap();
        let mut s = sample();
        s.stale = true;
        write_snapshot(&path, &s).unwrap();
        assert_eq!(read_snapshot(&path).unwrap(), s);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["inventory.json"]);
        let mode = fs::metadata(&path).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o004,
            0o004
        );
    }

    #[test]
    fn write_and_read_errors_name_the_path() {
        let e = write_snapshot(Path::new("/nonexistent-dir/x/inventory.json"), &sample())
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent-dir/x/inventory.json"), "{e}");
        let e = read_snapshot(Path::new("/nonexistent-dir/inv.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent-dir/inv.json"), "{e}");
    }

    #[test]
    fn a_truncated_snapshot_is_a_parse_error_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.json");
        let text = sample().to_json_pretty();
        fs::write(&path, &text[..text.len() / 2]).unwrap();
        let e = read_snapshot(&path).unwrap_err();
        assert!(matches!(e, InventoryError::SnapshotParse { .. }), "{e}");
        assert!(e.to_string().contains("inventory.json"));
    }

    #[test]
    fn a_missing_library_names_the_library() {
        let e = NvmlInventory::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, InventoryError::NvmlLoad { .. }), "{msg}");
        assert!(msg.contains("/nonexistent/libnvidia-ml.so.1"), "{msg}");
    }

    #[test]
    fn a_library_that_is_not_nvml_says_so() {
        // libc loads fine but has no nvmlInit_v2.
        let e = NvmlInventory::open(Some(Path::new("libc.so.6"))).unwrap_err();
        assert!(e.to_string().contains("not an NVML library"), "{e}");
    }
}
