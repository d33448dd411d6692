//! A fake `libnvidia-ml.so` for tests and demos.
//!
//! It exports the NVML C functions that `nvml-wrapper` calls for gpuarch's
//! inventory, with NVML's struct layouts (taken from `nvml-wrapper-sys`, which
//! is generated from `nvml.h`), and serves the topology file named by
//! `FAKE_NVML_TOPOLOGY` (the inventory snapshot format). Production code loads
//! it through the real `nvml-wrapper`, so everything above the C ABI is real.
//!
//! Behaviour follows NVML's: calls before `nvmlInit_v2` return
//! `NVML_ERROR_UNINITIALIZED`; init and shutdown are reference counted; short
//! buffers get `NVML_ERROR_INSUFFICIENT_SIZE`; unknown handles and null
//! pointers get `NVML_ERROR_INVALID_ARGUMENT`; versioned structs are checked.
//! A missing topology makes `nvmlInit_v2` return `NVML_ERROR_DRIVER_NOT_LOADED`
//! and a malformed one `NVML_ERROR_UNKNOWN`, with the reason on stderr.
//! No panic crosses the C boundary: every entry point catches unwinds.
//!
//! Faults, for tests of the code above it:
//! - `FAKE_NVML_FAIL=nvmlFoo[=CODE],...`: those functions return CODE
//!   (default `NVML_ERROR_UNKNOWN`, 999);
//! - `FAKE_NVML_SLEEP=nvmlFoo=MS,...`: those functions sleep first (a hang);
//! - `FAKE_NVML_MIG_CAPABLE=1`: GPUs without MIG devices report MIG mode
//!   disabled, as a MIG-capable A100 does, instead of `NVML_ERROR_NOT_SUPPORTED`
//!   as consumer GPUs do.
//!
//! The pointer arguments of every exported function follow NVML's contract:
//! outputs point to writable memory of the documented type, strings are NUL
//! terminated. That is the safety contract of each `unsafe extern "C" fn`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::time::Duration;

use gpuarch_core::snapshot::Snapshot;
use nvml_wrapper_sys::bindings::{
    NVML_DEVICE_MIG_ENABLE, nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
    nvmlReturn_t,
};

type Ret = nvmlReturn_t;
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

/// MIG devices a GPU can hold at most (A100/H100: 7).
const MAX_MIG: u32 = 7;

/// What a handle points at. Handles are addresses of these: the topology is
/// leaked at init and never moved, so the addresses stay valid.
#[derive(Debug)]
struct Handle {
    gpu: usize,
    mig: Option<usize>,
}

#[derive(Debug)]
struct Topology {
    snap: Snapshot,
    gpus: Vec<Handle>,
    migs: Vec<Vec<Handle>>,
}

#[derive(Debug, Default)]
struct State {
    refs: u32,
    topo: Option<&'static Topology>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refs: 0,
    topo: None,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run an entry point: faults first, then the body; a panic becomes UNKNOWN.
fn entry(name: &str, body: impl FnOnce() -> Result<(), Ret>) -> Ret {
    catch_unwind(AssertUnwindSafe(|| {
        if let Some(ms) = fault_value("FAKE_NVML_SLEEP", name) {
            std::thread::sleep(Duration::from_millis(u64::from(ms)));
        }
        if let Some(code) = fault_value("FAKE_NVML_FAIL", name) {
            return if code == 0 { UNKNOWN } else { code };
        }
        match body() {
            Ok(()) => SUCCESS,
            Err(e) => e,
        }
    }))
    .unwrap_or(UNKNOWN)
}

/// `VAR=fn[=N],...`: Some(N) (0 when absent) if `name` is listed.
fn fault_value(var: &str, name: &str) -> Option<u32> {
    let spec = std::env::var(var).ok()?;
    spec.split(',').find_map(|item| {
        let (f, v) = item.split_once('=').unwrap_or((item, "0"));
        (f.trim() == name).then(|| v.trim().parse().unwrap_or(0))
    })
}

fn topo() -> Result<&'static Topology, Ret> {
    state().topo.ok_or(UNINITIALIZED)
}

fn load() -> Result<Topology, Ret> {
    let path = std::env::var_os("FAKE_NVML_TOPOLOGY").ok_or_else(|| {
        eprintln!("fake-nvml: FAKE_NVML_TOPOLOGY is not set");
        DRIVER_NOT_LOADED
    })?;
    let bytes = std::fs::read(&path).map_err(|e| {
        eprintln!("fake-nvml: {}: {e}", path.to_string_lossy());
        DRIVER_NOT_LOADED
    })?;
    let snap = Snapshot::from_json(&bytes).map_err(|e| {
        eprintln!("fake-nvml: {}: {e}", path.to_string_lossy());
        UNKNOWN
    })?;
    let gpus = (0..snap.devices.len())
        .map(|gpu| Handle { gpu, mig: None })
        .collect();
    let migs = snap
        .devices
        .iter()
        .enumerate()
        .map(|(gpu, d)| {
            (0..d.mig.len())
                .map(|m| Handle { gpu, mig: Some(m) })
                .collect()
        })
        .collect();
    Ok(Topology { snap, gpus, migs })
}

/// Write `v` through an output pointer.
fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it point to a writable T.
    unsafe { p.write(v) };
    Ok(())
}

/// Copy `s` and a NUL into a caller's buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: buf is non-null and NVML's contract gives it `len` writable
    // bytes; we write s.len() + 1 <= len of them.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

fn read_cstr<'a>(p: *const c_char) -> Result<&'a str, Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL terminated by NVML's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

fn as_handle(h: &Handle) -> nvmlDevice_t {
    std::ptr::from_ref(h).cast_mut().cast()
}

/// Find the handle a caller passed among ours; never dereference theirs.
fn resolve(t: &'static Topology, dev: nvmlDevice_t) -> Result<&'static Handle, Ret> {
    t.gpus
        .iter()
        .chain(t.migs.iter().flatten())
        .find(|h| as_handle(h) == dev)
        .ok_or(INVALID_ARGUMENT)
}

fn with_device(
    name: &str,
    dev: nvmlDevice_t,
    f: impl FnOnce(&Topology, &Handle) -> Result<(), Ret>,
) -> Ret {
    entry(name, || {
        let t = topo()?;
        let h = resolve(t, dev)?;
        f(t, h)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    entry("nvmlInit_v2", || {
        let mut st = state();
        if st.refs == 0 {
            st.topo = Some(Box::leak(Box::new(load()?)));
        }
        st.refs += 1;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> Ret {
    // SAFETY: no arguments.
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    // SAFETY: no arguments.
    unsafe { nvmlInit_v2() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    entry("nvmlShutdown", || {
        let mut st = state();
        if st.refs == 0 {
            return Err(UNINITIALIZED);
        }
        st.refs -= 1;
        if st.refs == 0 {
            // Leaked on purpose: a caller may still hold (now invalid) handles,
            // and comparing against freed memory would be worse than a leak.
            st.topo = None;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    entry("nvmlSystemGetDriverVersion", || {
        put_str(version, length, &topo()?.snap.driver_version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    entry("nvmlSystemGetNVMLVersion", || {
        let t = topo()?;
        put_str(version, length, &format!("13.{}", t.snap.driver_version))
    })
}

fn cuda_driver_version(name: &str, out: *mut c_int) -> Ret {
    entry(name, || {
        let t = topo()?;
        let v = gpuarch_core::arch::CudaVersion::parse(&t.snap.cuda_driver_version)
            .map_err(|_| UNKNOWN)?;
        put(out, c_int::from(v.major) * 1000 + c_int::from(v.minor) * 10)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> Ret {
    cuda_driver_version("nvmlSystemGetCudaDriverVersion", v)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> Ret {
    cuda_driver_version("nvmlSystemGetCudaDriverVersion_v2", v)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    entry("nvmlDeviceGetCount_v2", || {
        let n = c_uint::try_from(topo()?.gpus.len()).map_err(|_| UNKNOWN)?;
        put(count, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> Ret {
    entry("nvmlDeviceGetHandleByIndex_v2", || {
        let t = topo()?;
        let pos = t
            .snap
            .devices
            .iter()
            .position(|d| d.index == index)
            .ok_or(INVALID_ARGUMENT)?;
        put(device, as_handle(&t.gpus[pos]))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    entry("nvmlDeviceGetHandleByUUID", || {
        let t = topo()?;
        let want = read_cstr(uuid)?;
        for (g, d) in t.snap.devices.iter().enumerate() {
            if d.uuid == want {
                return put(device, as_handle(&t.gpus[g]));
            }
            if let Some(m) = d.mig.iter().position(|m| m.uuid == want) {
                return put(device, as_handle(&t.migs[g][m]));
            }
        }
        Err(NOT_FOUND)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    entry("nvmlDeviceGetHandleByPciBusId_v2", || {
        let t = topo()?;
        let want = read_cstr(bus_id)?;
        let g = t
            .snap
            .devices
            .iter()
            .position(|d| d.pci_bus_id.eq_ignore_ascii_case(want))
            .ok_or(NOT_FOUND)?;
        put(device, as_handle(&t.gpus[g]))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetIndex", device, |t, h| match h.mig {
        None => put(index, t.snap.devices[h.gpu].index),
        Some(_) => Err(NOT_SUPPORTED),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    with_device("nvmlDeviceGetName", device, |t, h| {
        let d = &t.snap.devices[h.gpu];
        let n = h.mig.map_or(&d.name, |m| &d.mig[m].name);
        put_str(name, length, n)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    with_device("nvmlDeviceGetUUID", device, |t, h| {
        let d = &t.snap.devices[h.gpu];
        let u = h.mig.map_or(&d.uuid, |m| &d.mig[m].uuid);
        put_str(uuid, length, u)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    with_device("nvmlDeviceGetCudaComputeCapability", device, |t, h| {
        let cc = t.snap.devices[h.gpu].compute_capability;
        put(major, c_int::from(cc.major))?;
        put(minor, c_int::from(cc.minor))
    })
}

/// `nvmlBrandType_t` of the topology's `brand`; a GPU without one answers
/// NOT_SUPPORTED, as a driver that cannot tell.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetBrand", device, |t, h| {
        const NAMES: [&str; 17] = [
            "unknown",
            "quadro",
            "tesla",
            "nvs",
            "grid",
            "geforce",
            "titan",
            "nvidia_vapps",
            "nvidia_vpc",
            "nvidia_vcs",
            "nvidia_vws",
            "nvidia_cloud_gaming",
            "quadro_rtx",
            "nvidia_rtx",
            "nvidia",
            "geforce_rtx",
            "titan_rtx",
        ];
        let name = t.snap.devices[h.gpu]
            .brand
            .as_deref()
            .ok_or(NOT_SUPPORTED)?;
        let n = NAMES.iter().position(|b| *b == name).ok_or(NOT_SUPPORTED)?;
        put(brand, n as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> Ret {
    with_device("nvmlDeviceGetMinorNumber", device, |t, h| match h.mig {
        None => put(minor, t.snap.devices[h.gpu].minor),
        Some(_) => Err(NOT_SUPPORTED),
    })
}

/// Fill a C char array with `s`, NUL padded; too long is a topology error.
fn fill(dst: &mut [c_char], s: &str) -> Result<(), Ret> {
    if s.len() >= dst.len() {
        return Err(UNKNOWN);
    }
    dst.fill(0);
    for (d, b) in dst.iter_mut().zip(s.bytes()) {
        *d = b as c_char;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    with_device("nvmlDeviceGetPciInfo_v3", device, |t, h| {
        let id = &t.snap.devices[h.gpu].pci_bus_id;
        // "DDDDDDDD:BB:DD.F"
        let mut parts = id.split([':', '.']);
        let mut hex = || {
            parts
                .next()
                .and_then(|p| u32::from_str_radix(p, 16).ok())
                .ok_or(UNKNOWN)
        };
        let (domain, bus, dev) = (hex()?, hex()?, hex()?);
        let mut info = nvmlPciInfo_t {
            busIdLegacy: [0; 16],
            domain,
            bus,
            device: dev,
            pciDeviceId: 0x10de,
            pciSubSystemId: 0,
            busId: [0; 32],
        };
        fill(&mut info.busId, id)?;
        fill(
            &mut info.busIdLegacy,
            &format!("{:04x}:{bus:02x}:{dev:02x}.0", domain & 0xffff),
        )?;
        put(pci, info)
    })
}

fn memory_of(t: &Topology, h: &Handle) -> (u64, u64) {
    let d = &t.snap.devices[h.gpu];
    let total = h.mig.map_or(d.memory_bytes, |m| d.mig[m].memory_bytes);
    (total, total / 64) // (total, reserved by the driver)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo", device, |t, h| {
        let (total, reserved) = memory_of(t, h);
        put(
            memory,
            nvmlMemory_t {
                total,
                free: total - reserved,
                used: reserved,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> Ret {
    with_device("nvmlDeviceGetMemoryInfo_v2", device, |t, h| {
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let want = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);
        // SAFETY: non-null; NVML's contract: the caller's struct with its version set.
        let version = unsafe { (*memory).version };
        if version != want {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved) = memory_of(t, h);
        put(
            memory,
            nvmlMemory_v2_t {
                version,
                total,
                reserved,
                free: total - reserved,
                used: 0,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetMigMode", device, |t, h| {
        let mode = match (h.mig, t.snap.devices[h.gpu].mig.is_empty()) {
            (None, false) => NVML_DEVICE_MIG_ENABLE,
            (None, true) if std::env::var_os("FAKE_NVML_MIG_CAPABLE").is_some() => 0,
            _ => return Err(NOT_SUPPORTED),
        };
        put(current, mode)?;
        put(pending, mode)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceGetMaxMigDeviceCount", device, |t, h| {
        if h.mig.is_some() || t.snap.devices[h.gpu].mig.is_empty() {
            return Err(NOT_SUPPORTED);
        }
        put(count, MAX_MIG)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> Ret {
    with_device("nvmlDeviceGetMigDeviceHandleByIndex", device, |t, h| {
        let d = &t.snap.devices[h.gpu];
        if h.mig.is_some() || d.mig.is_empty() {
            return Err(NOT_SUPPORTED);
        }
        if index >= MAX_MIG {
            return Err(INVALID_ARGUMENT);
        }
        let m = d
            .mig
            .iter()
            .position(|m| m.index == index)
            .ok_or(NOT_FOUND)?;
        put(mig, as_handle(&t.migs[h.gpu][m]))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> Ret {
    with_device("nvmlDeviceIsMigDeviceHandle", device, |_, h| {
        put(is_mig, c_uint::from(h.mig.is_some()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    with_device(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        mig,
        |t, h| match h.mig {
            Some(_) => put(device, as_handle(&t.gpus[h.gpu])),
            None => Err(INVALID_ARGUMENT),
        },
    )
}
