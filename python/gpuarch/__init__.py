"""What gpuarch gave this container, for application code.

gpuarch (its README: /usr/share/doc/gpuarch/README.md on a host with the
package, README.md in its source tree) sets, at container start, variables
naming what the container's GPUs can do (GPUARCH_DTYPE,
GPUARCH_ATTN_IMPLEMENTATION, ...) and mounts prebuilt kernels under
GPUARCH_KERNELS_DIR with a manifest saying which file serves which GPU.
This module reads them. Pure Python, no dependencies; torch is imported
only by torch_dtype(), and only if it is installed.

Outside a gpuarch container each function returns its ``default``: pass
the application's own choice (``torch_dtype(default=torch.bfloat16)``,
``attn_implementation(default="flash_attention_2")``) and it keeps its
behaviour there. Nothing here initialises CUDA.
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
    """A kernel gpuarch did not provide, or a kernels directory, package or
    manifest that cannot be used, with the reason. Every failure of this
    module is one."""


def _env(env):
    return os.environ if env is None else env


def _get(env, name):
    """``env[name]`` when it is a string, else None: an env mapping of any
    other values is taken as not set."""
    try:
        value = _env(env).get(name)
    except Exception:  # a mapping that cannot answer
        return None
    return value if isinstance(value, str) else None


def _number(text):
    """A small decimal number of ASCII digits (``str.isdigit`` also takes
    ``²``, which ``int`` refuses), else None."""
    if 0 < len(text) <= 3 and all("0" <= c <= "9" for c in text):
        return int(text)
    return None


def _capabilities(value):
    out = []
    for part in (value or "").split(","):
        major, _, minor = (_number(p) for p in part.strip().partition("."))
        if major is not None and minor is not None:
            out.append((major, minor))
    return out


def _importable(module):
    """Whether ``module`` is installed, as transformers asks it
    (``importlib.util.find_spec``), without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def dtype_name(default=None, env=None):
    """``"bfloat16"`` when every GPU of the container has bf16, else
    ``"float16"`` (GPUARCH_DTYPE); ``default`` outside gpuarch."""
    value = _get(env, "GPUARCH_DTYPE")
    return value if value in _DTYPES else default


def torch_dtype(default=None, env=None):
    """:func:`dtype_name` as a ``torch.dtype`` when torch is installed
    (``torch.bfloat16`` / ``torch.float16``), else as its name, which
    transformers' ``torch_dtype=`` also takes. Outside gpuarch, ``default``
    as given: pass the application's own choice
    (``torch_dtype(default=torch.bfloat16)``) and it keeps it there."""
    name = dtype_name(env=env)
    if name is None:
        return default
    if not _importable("torch"):
        return name
    import torch

    return getattr(torch, name)


def attn_implementation(default="sdpa", env=None):
    """``"flash_attention_2"`` when every GPU of the container runs it
    (GPUARCH_ATTN_IMPLEMENTATION) and the ``flash_attn`` package is
    installed, else ``"sdpa"``; ``default`` outside gpuarch (pass the
    application's own choice to keep it there). Never
    ``"flash_attention_2"`` without ``flash_attn`` installed, whatever the
    default: transformers raises for it. Suits transformers'
    ``attn_implementation=``."""
    value = _get(env, "GPUARCH_ATTN_IMPLEMENTATION")
    if value not in _ATTN:
        value = default
    if value == "flash_attention_2" and not _importable("flash_attn"):
        return "sdpa"
    return value


def _kernels_dir(env):
    root = _get(env, "GPUARCH_KERNELS_DIR")
    if not root:
        raise GpuarchError("no kernel packages: GPUARCH_KERNELS_DIR is not set")
    if "\0" in root or not os.path.isabs(root):
        raise GpuarchError(f"GPUARCH_KERNELS_DIR is not an absolute path: {root!r}")
    if not os.path.isdir(root):
        raise GpuarchError(f"GPUARCH_KERNELS_DIR {root!r} is not a directory")
    return root


def _package_dir(package, env):
    """The directory of kernel package ``package``, resolved, and checked to
    be a directory right under the kernels directory."""
    if not isinstance(package, str) or not package or package in (".", "..") \
            or "/" in package or "\0" in package:
        raise GpuarchError(f"not a package name: {package!r}")
    root = _kernels_dir(env)
    path = os.path.join(root, package)
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(root):
        raise GpuarchError(f"kernel package {package!r} leads outside {root}")
    if not os.path.isdir(real):
        raise GpuarchError(f"kernel package {package!r} is not mounted in {root}")
    return root, real


# No default given: outside gpuarch, kernel_file and kernel_manifest raise.
_RAISE = object()


def _outside(env):
    """Whether this process is outside a gpuarch container (no kernels
    directory named)."""
    return not _get(env, "GPUARCH_KERNELS_DIR")


def kernel_manifest(package, env=None, default=_RAISE):
    """The manifest of kernel package ``package`` as this container sees it
    (which build serves each GPU), a dict. Outside a gpuarch container,
    ``default`` when one is given. Raises GpuarchError when gpuarch mounted
    no such package or its manifest cannot be read."""
    if default is not _RAISE and _outside(env):
        return default
    return _manifest(package, env)[1]


def _manifest(package, env):
    """The package's resolved directory and its manifest."""
    root, pkg = _package_dir(package, env)
    path = os.path.join(pkg, "manifest.json")
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_MANIFEST + 1)
    except FileNotFoundError:
        raise GpuarchError(f"kernel package {package!r} in {root} has no manifest.json") from None
    except OSError as e:
        raise GpuarchError(f"{path}: {e.strerror or e}") from None
    if len(data) > _MAX_MANIFEST:
        raise GpuarchError(f"{path}: over {_MAX_MANIFEST} bytes")
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise GpuarchError(f"{path}: not JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise GpuarchError(f"{path}: a JSON {type(manifest).__name__}, not an object")
    return pkg, manifest


def kernel_file(package, device_index=0, env=None, default=_RAISE):
    """The path of the file that serves GPU ``device_index`` (its CUDA
    index in this container) in kernel package ``package``: the build of
    its own architecture, or the best that runs there. Always a regular
    file inside the package's directory. Outside a gpuarch container,
    ``default`` when one is given (the application's own build:
    ``kernel_file("rmsnorm", 0, default=my_path)``). Raises GpuarchError
    with gpuarch's reason when there is none (not mounted, or no build for
    that GPU yet: gpuarchd was asked for one), and outside gpuarch when no
    default is given."""
    if default is not _RAISE and _outside(env):
        return default
    if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
        raise GpuarchError(f"not a device index: {device_index!r}")
    pkg, manifest = _manifest(package, env)
    gpus = manifest.get("gpus")
    if not isinstance(gpus, list):
        # A hand-made package: the manifest names targets, not files per GPU.
        raise GpuarchError(f"kernel package {package!r} does not map files to GPUs")
    gpu = next((g for g in gpus if isinstance(g, dict) and type(g.get("index")) is int
                and g["index"] == device_index), None)
    if gpu is None:
        raise GpuarchError(
            f"kernel package {package!r}: no GPU {device_index} in this container "
            f"({len(gpus)} GPU(s))")
    if "missing" in gpu:
        raise GpuarchError(f"kernel package {package!r}, GPU {device_index}: {gpu['missing']!s:.200}")
    files = gpu.get("files")
    if not isinstance(files, list) or not files:
        raise GpuarchError(f"kernel package {package!r}, GPU {device_index}: no file listed")
    name = files[0]
    if not isinstance(name, str) or not name or "\0" in name or os.path.isabs(name):
        raise GpuarchError(f"kernel package {package!r}, GPU {device_index}: not a file name: {name!r:.200}")
    real = os.path.realpath(os.path.join(pkg, name))
    if os.path.commonpath([real, pkg]) != pkg:
        raise GpuarchError(
            f"kernel package {package!r}, GPU {device_index}: {name!r:.200} leads outside the package")
    if not os.path.isfile(real):
        raise GpuarchError(
            f"kernel package {package!r}, GPU {device_index}: {name!r:.200} is not a file in the package")
    return real


def plan(env=None):
    """Everything gpuarch said to this container, as a dict: the GPUs'
    compute capabilities (CUDA order, ``(major, minor)`` tuples), the
    hints, the arch lists, and per mounted kernel package its manifest
    (a package whose manifest cannot be read is left out). Empty lists and
    None outside gpuarch. Never raises."""
    get = lambda name: _get(env, name)  # noqa: E731
    caps = _capabilities(get("GPUARCH_COMPUTE_CAPABILITIES"))
    flag = {"1": True, "0": False}
    kernels = {}
    root = None
    try:
        root = _kernels_dir(env)
        names = sorted(os.listdir(root))
    except (GpuarchError, OSError, ValueError):
        names = []
    for name in names:
        try:
            kernels[name] = kernel_manifest(name, env)
        except GpuarchError:
            continue
    return {
        "compute_capabilities": caps,
        "min_compute_capability": min(caps) if caps else None,
        "dtype": dtype_name(env=env),
        "attn_implementation": attn_implementation(default=None, env=env),
        "tf32": flag.get(get("GPUARCH_TF32")),
        "fp8": flag.get(get("GPUARCH_FP8")),
        "torch_cuda_arch_list": get("TORCH_CUDA_ARCH_LIST"),
        "flashinfer_cuda_arch_list": get("FLASHINFER_CUDA_ARCH_LIST"),
        "flash_attn_cuda_archs": get("FLASH_ATTN_CUDA_ARCHS"),
        "kernels_dir": root,
        "kernels": kernels,
        "env": {k: v for k in VARIABLES if (v := get(k)) is not None},
    }
