//! The CUDA driver, through cudarc's `driver` module with dynamic loading.
//!
//! cudarc panics when a call finds no `libcuda`; [`Gpu::open`] asks first
//! and returns [`NO_DRIVER`] instead, so a machine without a GPU gets a
//! sentence, not a backtrace.

use std::sync::Arc;

use anyhow::{Result, anyhow, bail};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;
use gpuarch_core::arch::ComputeCapability;

/// What a machine without NVIDIA's driver is told.
pub const NO_DRIVER: &str = "no CUDA driver: libcuda.so.1 could not be loaded (this check needs an NVIDIA GPU and its driver)";

/// One GPU's context and stream.
#[derive(Debug)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub cap: ComputeCapability,
    /// The driver's CUDA version, `13.0`.
    pub driver_cuda: String,
}

impl Gpu {
    /// The GPU with CUDA ordinal `ordinal`.
    pub fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            bail!(NO_DRIVER);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| anyhow!("cuInit/cuCtxCreate: {e:?}"))?;
        let attr = |a| ctx.attribute(a).map_err(|e| anyhow!("{a:?}: {e:?}"));
        let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let cap = ComputeCapability::parse_reported(&format!("{major}.{minor}"))
            .map_err(|e| anyhow!("the driver reports capability {major}.{minor}: {e}"))?;
        let name = ctx.name().map_err(|e| anyhow!("cuDeviceGetName: {e:?}"))?;
        let mut v = 0;
        // SAFETY: the driver is loaded (checked above); `v` is an out-pointer.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(|e| anyhow!("cuDriverGetVersion: {e:?}"))?;
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            name,
            cap,
            driver_cuda: format!("{}.{}", v / 1000, (v % 1000) / 10),
        })
    }

    /// `cuModuleLoadData` of a cubin, fatbin or PTX image: the driver's own
    /// verdict on whether the code runs here.
    pub fn load(&self, image: &[u8]) -> std::result::Result<Arc<CudaModule>, DriverError> {
        let mut data = image.to_vec();
        // PTX is text and the driver reads it up to its NUL.
        if !data.starts_with(b"\x7fELF") && data.last() != Some(&0) {
            data.push(0);
        }
        self.ctx.load_module(Ptx::from_binary(data))
    }

    pub fn function(module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
        module
            .load_function(name)
            .map_err(|e| anyhow!("cuModuleGetFunction {name}: {}", error_name(&e)))
    }
}

/// `CUDA_ERROR_NO_BINARY_FOR_GPU`: the driver's name of an error.
pub fn error_name(e: &DriverError) -> String {
    format!("{:?}", e.0)
}
