//! The names of the variables gpuarch injects: shared by the config (which
//! may switch each off) and the Plan (which sets them), so neither module
//! depends on the other for them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The variables gpuarch injects. Names are a contract (docs/CONTRACT.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EnvVar {
    TorchCudaArchList,
    FlashinferCudaArchList,
    FlashAttnCudaArchs,
    DsBuildFpQuantizer,
    DsBuildCutlassOps,
    DsBuildRaggedDeviceOps,
    DsBuildEvoformerAttn,
    DsBuildInferenceCoreOps,
    DsBuildRaggedOps,
    DsBuildTransformerInference,
    AccelerateMixedPrecision,
    CudaDeviceOrder,
    ComputeCapabilities,
    MinComputeCapability,
    Dtype,
    AttnImplementation,
    Tf32,
    Fp8,
    KernelsDir,
    FlashinferCubinDir,
    TorchExtensionsDir,
    TritonCacheDir,
    TorchInductorCacheDir,
    CudaCachePath,
    FlashinferWorkspaceBase,
    VllmCacheRoot,
}

impl EnvVar {
    /// Every variable, in the order they are injected.
    pub const ALL: [EnvVar; 26] = [
        EnvVar::TorchCudaArchList,
        EnvVar::FlashinferCudaArchList,
        EnvVar::FlashAttnCudaArchs,
        EnvVar::DsBuildFpQuantizer,
        EnvVar::DsBuildCutlassOps,
        EnvVar::DsBuildRaggedDeviceOps,
        EnvVar::DsBuildEvoformerAttn,
        EnvVar::DsBuildInferenceCoreOps,
        EnvVar::DsBuildRaggedOps,
        EnvVar::DsBuildTransformerInference,
        EnvVar::AccelerateMixedPrecision,
        EnvVar::CudaDeviceOrder,
        EnvVar::ComputeCapabilities,
        EnvVar::MinComputeCapability,
        EnvVar::Dtype,
        EnvVar::AttnImplementation,
        EnvVar::Tf32,
        EnvVar::Fp8,
        EnvVar::KernelsDir,
        EnvVar::FlashinferCubinDir,
        EnvVar::TorchExtensionsDir,
        EnvVar::TritonCacheDir,
        EnvVar::TorchInductorCacheDir,
        EnvVar::CudaCachePath,
        EnvVar::FlashinferWorkspaceBase,
        EnvVar::VllmCacheRoot,
    ];

    /// The JIT caches' variables, set (each under the usual rules) when a
    /// container is given a cache; their directories inside it.
    pub const JIT: [(EnvVar, &'static str); 6] = [
        (EnvVar::TorchExtensionsDir, "torch_extensions"),
        (EnvVar::TritonCacheDir, "triton"),
        (EnvVar::TorchInductorCacheDir, "torchinductor"),
        (EnvVar::CudaCachePath, "nv-compute-cache"),
        (EnvVar::FlashinferWorkspaceBase, "flashinfer"),
        (EnvVar::VllmCacheRoot, "vllm"),
    ];

    pub fn name(self) -> &'static str {
        match self {
            EnvVar::TorchCudaArchList => "TORCH_CUDA_ARCH_LIST",
            EnvVar::FlashinferCudaArchList => "FLASHINFER_CUDA_ARCH_LIST",
            EnvVar::FlashAttnCudaArchs => "FLASH_ATTN_CUDA_ARCHS",
            EnvVar::DsBuildFpQuantizer => "DS_BUILD_FP_QUANTIZER",
            EnvVar::DsBuildCutlassOps => "DS_BUILD_CUTLASS_OPS",
            EnvVar::DsBuildRaggedDeviceOps => "DS_BUILD_RAGGED_DEVICE_OPS",
            EnvVar::DsBuildEvoformerAttn => "DS_BUILD_EVOFORMER_ATTN",
            EnvVar::DsBuildInferenceCoreOps => "DS_BUILD_INFERENCE_CORE_OPS",
            EnvVar::DsBuildRaggedOps => "DS_BUILD_RAGGED_OPS",
            EnvVar::DsBuildTransformerInference => "DS_BUILD_TRANSFORMER_INFERENCE",
            EnvVar::AccelerateMixedPrecision => "ACCELERATE_MIXED_PRECISION",
            EnvVar::CudaDeviceOrder => "CUDA_DEVICE_ORDER",
            EnvVar::ComputeCapabilities => "GPUARCH_COMPUTE_CAPABILITIES",
            EnvVar::MinComputeCapability => "GPUARCH_MIN_COMPUTE_CAPABILITY",
            EnvVar::Dtype => "GPUARCH_DTYPE",
            EnvVar::AttnImplementation => "GPUARCH_ATTN_IMPLEMENTATION",
            EnvVar::Tf32 => "GPUARCH_TF32",
            EnvVar::Fp8 => "GPUARCH_FP8",
            EnvVar::KernelsDir => "GPUARCH_KERNELS_DIR",
            EnvVar::FlashinferCubinDir => "FLASHINFER_CUBIN_DIR",
            EnvVar::TorchExtensionsDir => "TORCH_EXTENSIONS_DIR",
            EnvVar::TritonCacheDir => "TRITON_CACHE_DIR",
            EnvVar::TorchInductorCacheDir => "TORCHINDUCTOR_CACHE_DIR",
            EnvVar::CudaCachePath => "CUDA_CACHE_PATH",
            EnvVar::FlashinferWorkspaceBase => "FLASHINFER_WORKSPACE_BASE",
            EnvVar::VllmCacheRoot => "VLLM_CACHE_ROOT",
        }
    }

    /// Set only when the config lists it in `env.enable`: a variable whose
    /// reader changes numerics when it appears (accelerate, given
    /// `ACCELERATE_MIXED_PRECISION`, trains in mixed precision where its
    /// default is full precision), which no container should get unasked.
    pub fn opt_in(self) -> bool {
        matches!(self, EnvVar::AccelerateMixedPrecision)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }
}

impl fmt::Display for EnvVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for EnvVar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for EnvVar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::from_name(&s).ok_or_else(|| {
            let known: Vec<_> = Self::ALL.iter().map(|v| v.name()).collect();
            serde::de::Error::custom(format!(
                "unknown variable '{s}' (gpuarch sets: {})",
                known.join(", ")
            ))
        })
    }
}
