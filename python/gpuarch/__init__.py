"""What gpuarch gave this container, for application code.

gpuarch (https://github.com/gpuarch) sets, at container start, variables
naming what the container's GPUs can do (GPUARCH_DTYPE,
GPUARCH_ATTN_IMPLEMENTATION, ...) and mounts prebuilt kernels under
GPUARCH_KERNELS_DIR with a manifest saying which file serves which GPU.
This module reads them. Pure Python, no dependencies; torch is imported
only by torch_dtype(), and only if it is installed.

Outside a gpuarch container each function returns its ``default``.
"""

import importlib.util
import json
import os

__all__ = [
    "plan",
    "dtype_name",
    "torch_dtype",
    "attn_implementation",
    "kernel_file",
    "kernel_manifest",
    "GpuarchError",
]

__version__ = "0.1.0"

#: The variables gpuarch sets (its documented contract), and the arch lists
#: it sets for the consumers that read them.
VARIABLES = (
    "GPUARCH_COMPUTE_CAPABILITIES",
    "GPUARCH_MIN_COMPUTE_CAPABILITY",
    "GPUARCH_DTYPE",
    "GPUARCH_ATTN_IMPLEMENTATION",
    "GPUARCH_TF32",
    "GPUARCH_FP8",
    "GPUARCH_KERNELS_DIR",
    "TORCH_CUDA_ARCH_LIST",
    "FLASHINFER_CUDA_ARCH_LIST",
    "FLASH_ATTN_CUDA_ARCHS",
    "CUDA_DEVICE_ORDER",
)

_DTYPES = ("bfloat16", "float16")
_ATTN = ("flash_attention_2", "sdpa")
_MAX_MANIFEST = 1 << 20


class GpuarchError(LookupError):
    """A kernel gpuarch did not provide, with the reason."""


def _env(env):
    return os.environ if env is None else env


def _capabilities(value):
    out = []
    for part in (value or "").split(","):
        major, _, minor = part.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            out.append((int(major), int(minor)))
    return out


def dtype_name(default=None, env=None):
    """``"bfloat16"`` when every GPU of the container has bf16, else
    ``"float16"`` (GPUARCH_DTYPE); ``default`` outside gpuarch."""
    value = _env(env).get("GPUARCH_DTYPE")
    return value if value in _DTYPES else default


def torch_dtype(default=None, env=None):
    """:func:`dtype_name` as a ``torch.dtype`` when torch is installed
    (``torch.bfloat16`` / ``torch.float16``), else as its name, which
    transformers' ``torch_dtype=`` also takes. ``default`` is returned as
    given outside gpuarch."""
    name = dtype_name(env=env)
    if name is None:
        return default
    if importlib.util.find_spec("torch") is None:
        return name
    import torch

    return getattr(torch, name)


def attn_implementation(default="sdpa", env=None):
    """``"flash_attention_2"`` when every GPU of the container runs it
    (GPUARCH_ATTN_IMPLEMENTATION) and the ``flash_attn`` package is
    installed, else ``"sdpa"``; ``default`` outside gpuarch. Suits
    transformers' ``attn_implementation=``."""
    value = _env(env).get("GPUARCH_ATTN_IMPLEMENTATION")
    if value not in _ATTN:
        return default
    if value == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "sdpa"
    return value


def _kernels_dir(env):
    return _env(env).get("GPUARCH_KERNELS_DIR")


def kernel_manifest(package, env=None):
    """The manifest of kernel package ``package`` as this container sees it
    (which build serves each GPU). Raises GpuarchError when gpuarch mounted
    no such package."""
    root = _kernels_dir(env)
    if not root:
        raise GpuarchError(f"no kernel packages: GPUARCH_KERNELS_DIR is not set")
    if not package or "/" in package or package in (".", ".."):
        raise GpuarchError(f"not a package name: {package!r}")
    path = os.path.join(root, package, "manifest.json")
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_MANIFEST + 1)
    except FileNotFoundError:
        raise GpuarchError(f"kernel package {package!r} is not mounted in {root}") from None
    if len(data) > _MAX_MANIFEST:
        raise GpuarchError(f"{path}: over {_MAX_MANIFEST} bytes")
    try:
        return json.loads(data)
    except ValueError as e:
        raise GpuarchError(f"{path}: not JSON: {e}") from None


def kernel_file(package, device_index=0, env=None):
    """The path of the file that serves GPU ``device_index`` (its CUDA
    index in this container) in kernel package ``package``: the build of
    its own architecture, or the best that runs there. Raises GpuarchError
    with gpuarch's reason when there is none (not mounted, or no build for
    that GPU yet: gpuarchd was asked for one)."""
    manifest = kernel_manifest(package, env)
    gpus = manifest.get("gpus")
    if not isinstance(gpus, list):
        # A hand-made package: the manifest names targets, not files per GPU.
        raise GpuarchError(f"kernel package {package!r} does not map files to GPUs")
    gpu = next((g for g in gpus if isinstance(g, dict) and g.get("index") == device_index), None)
    if gpu is None:
        raise GpuarchError(
            f"kernel package {package!r}: no GPU {device_index} in this container "
            f"({len(gpus)} GPU(s))")
    if "missing" in gpu:
        raise GpuarchError(f"kernel package {package!r}, GPU {device_index}: {gpu['missing']}")
    files = gpu.get("files") or []
    if not files:
        raise GpuarchError(f"kernel package {package!r}, GPU {device_index}: no file listed")
    return os.path.join(_kernels_dir(env), package, files[0])


def plan(env=None):
    """Everything gpuarch said to this container, as a dict: the GPUs'
    compute capabilities (CUDA order, ``(major, minor)`` tuples), the
    hints, the arch lists, and per mounted kernel package its manifest.
    Empty lists and None outside gpuarch."""
    e = _env(env)
    caps = _capabilities(e.get("GPUARCH_COMPUTE_CAPABILITIES"))
    flag = {"1": True, "0": False}
    kernels = {}
    root = _kernels_dir(env)
    if root and os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            try:
                kernels[name] = kernel_manifest(name, env)
            except GpuarchError:
                continue
    return {
        "compute_capabilities": caps,
        "min_compute_capability": min(caps) if caps else None,
        "dtype": dtype_name(env=env),
        "attn_implementation": attn_implementation(default=None, env=env),
        "tf32": flag.get(e.get("GPUARCH_TF32")),
        "fp8": flag.get(e.get("GPUARCH_FP8")),
        "torch_cuda_arch_list": e.get("TORCH_CUDA_ARCH_LIST"),
        "flashinfer_cuda_arch_list": e.get("FLASHINFER_CUDA_ARCH_LIST"),
        "flash_attn_cuda_archs": e.get("FLASH_ATTN_CUDA_ARCHS"),
        "kernels_dir": root,
        "kernels": kernels,
        "env": {k: e[k] for k in VARIABLES if k in e},
    }
