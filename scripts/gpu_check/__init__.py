"""What only a real GPU can show about gpuarch: one line per check, and a
JSON report.

  scripts/gpu-check bundle [DIR]   on the build machine: release binaries,
                                   the unit's seccomp programs, a
                                   dbus-daemon and runc, into DIR (default
                                   .gpu-bundle)
  scripts/gpu-check run [--bundle DIR] [--out DIR] [--parts 1,2,...]
                                   on the GPU host, from the checkout and
                                   the bundle brought there
  scripts/gpu-check run --parts 7,8,9 --rehearse [--python PY]
                                   parts 7, 8 and 9 without a GPU: a fixture
                                   for NVML, PY's torch builds the
                                   extensions and its Triton compiles, and
                                   nothing runs on a GPU

The parts (docs/gpu/README.md says what each shows):
  1 NVML for real: gpuarchctl devices --json through libnvidia-ml.so.1
    against nvidia-smi, field by field; the reading saved as a fixture;
    nvmlInit plus a full read, timed.
  2 The store's builds for this GPU's arch: every variant of every package
    in kernels/packages built with the host's NVRTC, loaded with
    cuModuleLoadData and run against a CPU reference.
  3 The inspector against the driver: cubins, a fatbin and PTX made with
    nvcc for other and for this arch; gpuarchctl inspect's verdict against
    what cuModuleLoadData does, with PTX JIT allowed and forbidden; and a
    real library's targets against cuobjdump's.
  4 Consumers: torch's cpp_extension.load under gpuarch's
    TORCH_CUDA_ARCH_LIST (SASS read back with cuobjdump), its JIT cache
    reused by a second process, transformers and accelerate given the Plan.
  5 gpuarchd on real NVML: exec to READY=1, idle RSS, Plan calls per second,
    a pre-warm through the bus; gpuarch-hook precreate as the .deb ships it
    (static, stripped) against cat: with the snapshot, the NVML fallback,
    and the shipped config with this host's root as the image.
  6 The unit's sandbox against the driver: gpuarchd (NVML, NVRTC) under
    PR_SET_MDWE and under @system-service plus the seccomp form of
    MemoryDenyWriteExecute=; the device nodes it opens (DeviceAllow=).
  7 Containers given the JIT cache: runc through gpuarch-runtime with
    jit_cache on; torch's cpp_extension.load in one container builds into
    the cache the hook mounts, a second container of the same uid and
    image loads that build, another uid and another image each build their
    own; the same for a Triton kernel (TRITON_CACHE_DIR) and the driver's
    PTX JIT (CUDA_CACHE_PATH).
  8 The image, known: gpuarch-hook precreate with the shipped config on
    this host's own root as the image, its Python (PY, default this one) on
    PATH as an image's venv is; the environments and the torch it found,
    and a torch extension built under that Plan, its SASS read back.
  9 The image audit against the driver: gpuarchctl audit's verdict on
    libraries nvcc builds inside a scratch image's packages (sm_75 only,
    this GPU's SASS, PTX only) against a launch of their kernel with PTX
    JIT allowed and forbidden; and the audit of this host's own image,
    torch's and cuBLAS's verdicts held to torch running with JIT off.

Without an NVIDIA driver every part fails at once, saying so; the report
is written all the same. Exit status 0 when no check failed, else 1.
"""
