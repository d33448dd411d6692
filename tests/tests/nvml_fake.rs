//! The real `nvml-wrapper` (and gpuarch's `NvmlInventory` on top of it)
//! against the fake `libnvidia-ml.so`, for every fixture topology.
//!
//! The fake reads `FAKE_NVML_TOPOLOGY` and its fault variables from the
//! process environment, and NVML state is per process. So this file holds a
//! single test that walks every case in order: no other thread of this test
//! process reads or writes the environment while it runs.

#![allow(clippy::unwrap_used)] // test helpers: a failed unwrap is a failed test

use std::path::Path;

use gpuarch_inventory::{GpuInventory, InventoryError, NvmlInventory};
use gpuarch_tests::{FIXTURES, artifacts, fixture};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::error::NvmlError;
use serde_json::Value;

fn set(var: &str, value: impl AsRef<std::ffi::OsStr>) {
    // SAFETY: this test binary runs one test; no other thread touches the env.
    unsafe { std::env::set_var(var, value) };
}

fn unset(var: &str) {
    // SAFETY: as in `set`.
    unsafe { std::env::remove_var(var) };
}

fn fixture_json(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name)).unwrap()).unwrap()
}

/// Every device field, read through NvmlInventory, equals the fixture's.
/// The fixture is read as plain JSON here, not through gpuarch's parser.
fn inventory_matches_fixture(lib: &Path, name: &str) {
    set("FAKE_NVML_TOPOLOGY", fixture(name));
    let inv = NvmlInventory::open(Some(lib)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let snap = inv.snapshot().unwrap_or_else(|e| panic!("{name}: {e}"));
    let want = fixture_json(name);
    assert_eq!(snap.source, "nvml");
    assert_eq!(snap.driver_version, want["driver_version"], "{name}");
    assert_eq!(
        snap.cuda_driver_version, want["cuda_driver_version"],
        "{name}"
    );
    let want_devs = want["devices"].as_array().unwrap();
    assert_eq!(snap.devices.len(), want_devs.len(), "{name}");
    for (got, want) in snap.devices.iter().zip(want_devs) {
        let ctx = format!("{name} device {}", got.index);
        assert_eq!(
            u64::from(got.index),
            want["index"].as_u64().unwrap(),
            "{ctx}"
        );
        assert_eq!(
            u64::from(got.minor),
            want["minor"].as_u64().unwrap(),
            "{ctx}"
        );
        assert_eq!(got.uuid, want["uuid"], "{ctx}");
        assert_eq!(got.name, want["name"], "{ctx}");
        assert_eq!(
            got.compute_capability.to_string(),
            want["compute_capability"],
            "{ctx}"
        );
        assert_eq!(got.pci_bus_id, want["pci_bus_id"], "{ctx}");
        // A fixture without a brand is a driver that cannot tell.
        assert_eq!(got.brand.as_deref(), want["brand"].as_str(), "{ctx}");
        assert_eq!(
            got.memory_bytes,
            want["memory_bytes"].as_u64().unwrap(),
            "{ctx}"
        );
        let want_mig = want["mig"].as_array().unwrap();
        assert_eq!(got.mig.len(), want_mig.len(), "{ctx}");
        for (gm, wm) in got.mig.iter().zip(want_mig) {
            assert_eq!(u64::from(gm.index), wm["index"].as_u64().unwrap(), "{ctx}");
            assert_eq!(gm.uuid, wm["uuid"], "{ctx}");
            assert_eq!(gm.name, wm["name"], "{ctx}");
            assert_eq!(
                gm.memory_bytes,
                wm["memory_bytes"].as_u64().unwrap(),
                "{ctx}"
            );
        }
    }
}

/// The 2080 Ti + 3090 node, with the values written out by hand.
fn mixed_node_by_hand(lib: &Path) {
    set("FAKE_NVML_TOPOLOGY", fixture("2080ti-3090"));
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.95.05");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 13000);
    let ti = nvml.device_by_index(0).unwrap();
    assert_eq!(ti.name().unwrap(), "NVIDIA GeForce RTX 2080 Ti");
    let cc = ti.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (7, 5));
    assert_eq!(ti.memory_info().unwrap().total, 11264 << 20);
    assert_eq!(ti.pci_info().unwrap().bus_id, "00000000:01:00.0");
    assert_eq!(ti.pci_info().unwrap().bus, 1);
    assert_eq!(ti.brand().unwrap(), Brand::GeForce);
    // Not a MIG-capable card: NVML says NotSupported.
    assert!(matches!(ti.mig_mode(), Err(NvmlError::NotSupported)));

    let uuid = nvml.device_by_index(1).unwrap().uuid().unwrap();
    let ampere = nvml.device_by_uuid(uuid.as_str()).unwrap();
    assert_eq!(ampere.name().unwrap(), "NVIDIA GeForce RTX 3090");
    let cc = ampere.cuda_compute_capability().unwrap();
    assert_eq!((cc.major, cc.minor), (8, 6));
    assert_eq!(ampere.minor_number().unwrap(), 1);
    assert!(matches!(
        nvml.device_by_index(2),
        Err(NvmlError::InvalidArg)
    ));
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));
}

fn mig_through_the_wrapper(lib: &Path) {
    set("FAKE_NVML_TOPOLOGY", fixture("a100-mig"));
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    let a100 = nvml.device_by_index(0).unwrap();
    assert_eq!(a100.mig_mode().unwrap().current, 1);
    assert_eq!(a100.mig_device_count().unwrap(), 7);
    let m = a100.mig_device_by_index(2).unwrap();
    assert!(m.mig_is_mig_device_handle().unwrap());
    assert_eq!(m.name().unwrap(), "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
    assert_eq!(
        m.mig_parent_device().unwrap().uuid().unwrap(),
        a100.uuid().unwrap()
    );
    assert!(matches!(
        a100.mig_device_by_index(5),
        Err(NvmlError::NotFound)
    ));
    let mig_uuid = m.uuid().unwrap();
    assert!(
        nvml.device_by_uuid(mig_uuid.as_str())
            .unwrap()
            .mig_is_mig_device_handle()
            .unwrap()
    );
}

fn failures_are_clear_errors(lib: &Path) {
    // A topology that is not a valid snapshot: nvmlInit_v2 fails with an NVML error.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, b"{\"schema\": 1, \"devices\": [").unwrap();
    set("FAKE_NVML_TOPOLOGY", &bad);
    let e = NvmlInventory::open(Some(lib)).unwrap_err();
    assert!(
        matches!(
            e,
            InventoryError::Nvml {
                call: "nvmlInit_v2",
                error: NvmlError::Unknown,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("libfake_nvml.so"), "{e}");

    // No topology at all: as if no driver were loaded.
    unset("FAKE_NVML_TOPOLOGY");
    let e = NvmlInventory::open(Some(lib)).unwrap_err();
    assert!(
        matches!(
            e,
            InventoryError::Nvml {
                error: NvmlError::DriverNotLoaded,
                ..
            }
        ),
        "{e}"
    );

    // A call failing mid-inventory names the call and the device.
    set("FAKE_NVML_TOPOLOGY", fixture("a100-h100"));
    set("FAKE_NVML_FAIL", "nvmlDeviceGetCudaComputeCapability");
    let e = NvmlInventory::open(Some(lib))
        .unwrap()
        .snapshot()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nvmlDeviceGetCudaComputeCapability for device 0"),
        "{e}"
    );
    // A driver without MIG support (NotSupported from every GPU) is no MIG, not an error.
    set("FAKE_NVML_TOPOLOGY", fixture("a100-mig"));
    set("FAKE_NVML_FAIL", "nvmlDeviceGetMigMode=3");
    let s = NvmlInventory::open(Some(lib)).unwrap().snapshot().unwrap();
    assert!(s.devices.iter().all(|d| d.mig.is_empty()));
    unset("FAKE_NVML_FAIL");

    // MIG-capable GPUs with MIG switched off report it disabled: no MIG devices,
    // and no query for them (the fake would refuse one with NotSupported).
    set("FAKE_NVML_TOPOLOGY", fixture("a100-h100"));
    set("FAKE_NVML_MIG_CAPABLE", "1");
    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    assert_eq!(
        nvml.device_by_index(0).unwrap().mig_mode().unwrap().current,
        0
    );
    drop(nvml);
    let s = NvmlInventory::open(Some(lib)).unwrap().snapshot().unwrap();
    assert_eq!(s.devices.len(), 2);
    assert!(s.devices.iter().all(|d| d.mig.is_empty()));
    // ... while a GPU with MIG on still lists its devices.
    set("FAKE_NVML_TOPOLOGY", fixture("a100-mig"));
    let s = NvmlInventory::open(Some(lib)).unwrap().snapshot().unwrap();
    assert_eq!(s.devices[0].mig.len(), 3);
    assert!(s.devices[1].mig.is_empty());
    unset("FAKE_NVML_MIG_CAPABLE");
}

/// NVML's C contract, called raw: what a careless or hostile caller gets.
fn c_contract(lib: &Path) {
    use nvml_wrapper_sys::bindings::{NvmlLib, nvmlDevice_t, nvmlMemory_v2_t};
    const SUCCESS: u32 = 0;
    const UNINITIALIZED: u32 = 1;
    const INVALID_ARGUMENT: u32 = 2;
    const INSUFFICIENT_SIZE: u32 = 7;
    const ARGUMENT_VERSION_MISMATCH: u32 = 25;

    set("FAKE_NVML_TOPOLOGY", fixture("2080ti-3090"));
    // SAFETY: loading the fake library runs no initialisers of consequence.
    let nvml = unsafe { NvmlLib::new(lib) }.unwrap();
    // SAFETY: every pointer below is valid for its type, or null where the
    // test says so; the fake must answer, not crash.
    unsafe {
        let mut dev: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(
            nvml.nvmlDeviceGetHandleByIndex_v2(0, &mut dev),
            UNINITIALIZED
        );
        assert_eq!(nvml.nvmlShutdown(), UNINITIALIZED);

        assert_eq!(nvml.nvmlInit_v2(), SUCCESS);
        assert_eq!(nvml.nvmlInit_v2(), SUCCESS); // reference counted
        assert_eq!(
            nvml.nvmlDeviceGetHandleByIndex_v2(0, std::ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvml.nvmlDeviceGetHandleByIndex_v2(9, &mut dev),
            INVALID_ARGUMENT
        );
        assert_eq!(nvml.nvmlDeviceGetHandleByIndex_v2(0, &mut dev), SUCCESS);

        let mut name = [0 as std::ffi::c_char; 96];
        assert_eq!(nvml.nvmlDeviceGetName(dev, name.as_mut_ptr(), 96), SUCCESS);
        let got = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap();
        assert_eq!(got, "NVIDIA GeForce RTX 2080 Ti");
        assert_eq!(
            nvml.nvmlDeviceGetName(dev, name.as_mut_ptr(), 5),
            INSUFFICIENT_SIZE
        );
        assert_eq!(
            nvml.nvmlDeviceGetName(dev, std::ptr::null_mut(), 96),
            INVALID_ARGUMENT
        );
        // A handle the library never gave out is refused, not dereferenced.
        let bogus = 0x1000 as nvmlDevice_t;
        assert_eq!(
            nvml.nvmlDeviceGetName(bogus, name.as_mut_ptr(), 96),
            INVALID_ARGUMENT
        );

        let mut mem: nvmlMemory_v2_t = std::mem::zeroed();
        assert_eq!(
            nvml.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem),
            ARGUMENT_VERSION_MISMATCH
        );
        mem.version = std::mem::size_of::<nvmlMemory_v2_t>() as u32 | (2 << 24);
        assert_eq!(nvml.nvmlDeviceGetMemoryInfo_v2(dev, &mut mem), SUCCESS);
        assert_eq!(mem.total, 11264 << 20);
        assert_eq!(mem.free + mem.reserved + mem.used, mem.total);

        assert_eq!(nvml.nvmlShutdown(), SUCCESS);
        assert_eq!(
            nvml.nvmlDeviceGetCount_v2(&mut 0),
            SUCCESS,
            "one init still open"
        );
        assert_eq!(nvml.nvmlShutdown(), SUCCESS);
        assert_eq!(nvml.nvmlDeviceGetCount_v2(&mut 0), UNINITIALIZED);
    }
}

#[test]
fn real_nvml_wrapper_against_the_fake_library() {
    let lib = &artifacts().fake_nvml;
    for name in FIXTURES {
        inventory_matches_fixture(lib, name);
    }
    mixed_node_by_hand(lib);
    mig_through_the_wrapper(lib);
    failures_are_clear_errors(lib);
    c_contract(lib);
}
