//! Client side of the D-Bus API, for gpuarchctl.

use std::collections::{BTreeMap, HashMap};

use zbus::{OwnedVariant, proxy};

/// `io.gpuarch1.Inventory`.
#[proxy(
    interface = "io.gpuarch1.Inventory",
    default_service = "io.gpuarch1",
    default_path = "/io/gpuarch1"
)]
pub trait Inventory {
    fn list_devices(&self) -> zbus::Result<Vec<HashMap<String, OwnedVariant>>>;
    fn plan(&self, devices: &[&str]) -> zbus::Result<(BTreeMap<String, String>, Vec<String>)>;
    #[zbus(name = "Match")]
    fn match_devices(&self, requirement: &str) -> zbus::Result<Vec<String>>;
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
    fn last_refresh(&self) -> zbus::Result<u64>;
    #[zbus(property)]
    fn last_error(&self) -> zbus::Result<String>;
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
}

/// `io.gpuarch1.KernelCache`.
#[proxy(
    interface = "io.gpuarch1.KernelCache",
    default_service = "io.gpuarch1",
    default_path = "/io/gpuarch1"
)]
pub trait KernelCache {
    fn list_kernels(&self) -> zbus::Result<Vec<HashMap<String, OwnedVariant>>>;
    fn prewarm(&self, packages: &[&str], archs: &[&str]) -> zbus::Result<zbus::OwnedObjectPath>;
    fn garbage_collect(&self) -> zbus::Result<u64>;
    fn verify(&self) -> zbus::Result<Vec<HashMap<String, OwnedVariant>>>;
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
    fn state(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn message(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn log(&self) -> zbus::Result<Vec<String>>;
    #[zbus(signal)]
    fn finished(&self, ok: bool, message: String) -> zbus::Result<()>;
}

use gpuarch_core::arch::ComputeCapability;
use gpuarch_core::snapshot::{Device, MigDevice};

type Dict = HashMap<String, OwnedVariant>;

fn get<'a>(d: &'a Dict, key: &str) -> Result<&'a OwnedVariant, String> {
    d.get(key)
        .ok_or_else(|| format!("ListDevices entry without {key:?}"))
}

fn wrong(key: &str) -> String {
    format!("ListDevices entry: {key:?} has the wrong type")
}

fn u32_of(d: &Dict, key: &str) -> Result<u32, String> {
    u32::try_from(get(d, key)?).map_err(|_| wrong(key))
}

fn u64_of(d: &Dict, key: &str) -> Result<u64, String> {
    u64::try_from(get(d, key)?).map_err(|_| wrong(key))
}

fn text(d: &Dict, key: &str) -> Result<String, String> {
    <&str>::try_from(get(d, key)?)
        .map(ToOwned::to_owned)
        .map_err(|_| wrong(key))
}

/// A `ListDevices` entry as a snapshot device.
pub fn device_from(d: Dict) -> Result<Device, String> {
    let cc = text(&d, "compute_capability")?;
    let mig = match d.get("mig") {
        Some(v) => {
            let list: Vec<Dict> = v
                .try_clone()
                .ok()
                .and_then(|v| Vec::<Dict>::try_from(v).ok())
                .ok_or("ListDevices entry: \"mig\" has the wrong type")?;
            list.iter()
                .map(|m| {
                    Ok(MigDevice {
                        index: u32_of(m, "index")?,
                        uuid: text(m, "uuid")?,
                        name: text(m, "name")?,
                        memory_bytes: u64_of(m, "memory_bytes")?,
                    })
                })
                .collect::<Result<_, String>>()?
        }
        None => Vec::new(),
    };
    Ok(Device {
        index: u32_of(&d, "index")?,
        minor: u32_of(&d, "minor")?,
        uuid: text(&d, "uuid")?,
        name: text(&d, "name")?,
        compute_capability: ComputeCapability::parse_reported(&cc)
            .map_err(|e| format!("ListDevices entry: {e}"))?,
        pci_bus_id: text(&d, "pci_bus_id")?,
        memory_bytes: u64_of(&d, "memory_bytes")?,
        mig,
    })
}
