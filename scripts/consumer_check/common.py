"""What every consumer's check uses: the releases pinned, gpuarchctl,
capabilities, targets and whether they serve a GPU, the tally, and
stand-ins for a process's env and modules."""

import collections
import glob
import json
import os
import subprocess
import sys


# The checkout: scripts/consumer_check/ is two levels down.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CACHE = os.path.join(ROOT, ".local", "consumers")


# Every minor release of torch from 2.4, at its last patch, and every
# release of FlashInfer from 0.5.0 (its last post-release where it has them).
TORCH = ["2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0",
         "2.12.1", "2.13.0", "2.14.1", "2.15.0"]

FLASHINFERS = ["0.5.0", "0.5.1", "0.5.2", "0.5.3", "0.6.0", "0.6.1", "0.6.2", "0.6.3", "0.6.4",
               "0.6.5", "0.6.6", "0.6.7.post3", "0.6.8.post1", "0.6.9", "0.6.10.post1",
               "0.6.11.post3", "0.6.12", "0.6.13", "0.6.14", "0.6.15.post1", "0.6.16.post4",
               "0.6.17", "0.6.18.post1", "0.7.0.post1", "0.7.1", "0.7.2.post1", "0.7.4"]

FLASHINFER = "0.7.4"


# The releases of FlashInfer with a flashinfer-cubin of the same version on
# PyPI (0.4.x predates the window): the ones gpuarch can serve
# FLASHINFER_CUBIN_DIR to, as the hook sets it only for an image's exact
# version of an import.
FLASHINFER_CUBINS = FLASHINFERS[:FLASHINFERS.index("0.6.13") + 1]

FLASH_ATTN = "2.8.3.post2"

ACCELERATE = "1.15.0"


# Every accelerate minor from 1.4, every DeepSpeed minor from 0.12 (the
# first with the ragged and CUTLASS ops), every flash-attn 2 minor from 2.4:
# the last patch of each.
ACCELERATES = ["1.4.0", "1.5.2", "1.6.0", "1.7.0", "1.8.1", "1.9.0", "1.10.1", "1.11.0",
               "1.12.0", "1.13.0", "1.14.0", "1.15.0"]

DEEPSPEED = "0.19.8"

DEEPSPEEDS = ["0.12.6", "0.13.5", "0.14.5", "0.15.4", "0.16.9", "0.17.6", "0.18.9", "0.19.8"]

FLASH_ATTNS = ["2.4.3.post1", "2.5.9.post1", "2.6.3", "2.7.4.post1", "2.8.3.post2"]


# xformers from 0.0.30 (the first to build FlashAttention 3 from the list)
# to the newest, the last post-release of each.
XFORMERS = ["0.0.30", "0.0.31.post1", "0.0.32.post2", "0.0.33.post2", "0.0.34", "0.0.35"]

# vLLM and Triton from the releases of the torch window's start (September
# 2024): the last patch of each minor, for the JIT caches (jit.py).
VLLMS = ["0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2", "0.10.2", "0.11.2", "0.12.0",
         "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1", "0.18.1", "0.19.1", "0.20.2",
         "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0",
         "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]

TRITONS = ["3.0.0", "3.1.0", "3.2.0", "3.3.1", "3.4.0", "3.5.1", "3.6.0", "3.7.1", "3.8.0",
           "3.9.0"]


# NVIDIA's NVRTC of releases where the table changes (13.3: the last before
# 13.4's) and the newest, asked which architectures it accepts (12.9 is the
# one scripts/test installs under .local/cuda for the kernel builds).
NVRTC = [("nvidia-cuda-nvrtc-cu11", "11.8.89"), ("nvidia-cuda-nvrtc-cu12", "12.0.140"),
         ("nvidia-cuda-nvrtc-cu12", "12.8.93"), ("nvidia-cuda-nvrtc", "13.0.88"),
         ("nvidia-cuda-nvrtc", "13.3.33"), ("nvidia-cuda-nvrtc", "13.4.92"),
         ("nvidia-cuda-nvrtc", "13.5.37")]

FIXTURES = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "*.json")))

NEWEST = None  # the newest toolkit of gpuarch's table, read at start

CONFIG = None  # the script's own gpuarch config, written at start


def ctl(*args):
    exe = os.environ.get("GPUARCHCTL") or os.path.join(ROOT, "target", "debug", "gpuarchctl")
    # Never the host's /etc/gpuarch: a config of its own, which enables the
    # opt-in variables too.
    env = dict(os.environ, GPUARCH_CONFIG=CONFIG)
    r = subprocess.run([exe, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"gpuarchctl {' '.join(args)}: {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def cap(s):
    a, b = s.split(".")
    return (int(a), int(b))


def targets_of(flags):
    """(kind, (major, minor), suffix) of each -gencode code= in flags."""
    out = []
    for f in flags:
        if ",code=" not in f:
            continue
        code = f.split(",code=", 1)[1]
        kind, digits = code.split("_", 1)
        suffix = digits[-1] if digits[-1].isalpha() else ""
        digits = digits.rstrip("af")
        out.append((kind, (int(digits[:-1]), int(digits[-1])), suffix))
    return out


# The integrated (Tegra) GPUs' architectures: Jetson TX1, TX2, Xavier, Orin,
# Thor. "Binary compatibility between desktop and Tegra is not supported"
# (CUDA C++ Programming Guide, Binary Compatibility).
TEGRA = {(5, 3), (6, 2), (7, 2), (8, 7), (10, 1), (11, 0)}


def sass_runs(built, device):
    """Whether SASS built for `built` (not arch-specific) runs on `device`:
    its major, a minor no newer, and never across desktop and Tegra but
    on its very own capability."""
    if built == device:
        return True
    if built in TEGRA or device in TEGRA:
        return False
    return built[0] == device[0] and built[1] <= device[1]


def serves(device, targets):
    """Whether some target runs on device: SASS of its family or PTX no
    newer than it."""
    for kind, (ma, mi), suffix in targets:
        if kind == "sm":
            if suffix == "a" and (ma, mi) == device:
                return True
            if suffix != "a" and sass_runs((ma, mi), device):
                return True
        elif kind == "compute" and suffix == "" and (ma, mi) <= device:
            return True
    return False


def as_named(device, cuda):
    """The name a toolkit gives a GPU: Thor is 11.0 from CUDA 13, sm_101
    before it (the same chip)."""
    if cuda is not None and cap(cuda) < (13, 0) and device == (11, 0):
        return (10, 1)
    return device


OUTCOMES = collections.Counter()


def tally(unset_ok, ours_ok):
    """Count one case by what works: the consumer with the variable unset,
    and with gpuarch's value."""
    OUTCOMES[("unset works" if unset_ok else "unset fails",
              "gpuarch works" if ours_ok else "gpuarch fails")] += 1


class Env:
    """os.environ set to `values` (None: unset) for a block."""

    def __init__(self, values):
        self.values = values

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.values}
        for k, v in self.values.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v

    def __exit__(self, *_):
        for k, v in self.saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


class Modules:
    """sys.modules given `values` (stand-ins a consumer's code imports) for
    a block."""

    def __init__(self, values):
        self.values = values

    def __enter__(self):
        self.saved = {k: sys.modules.get(k) for k in self.values}
        sys.modules.update(self.values)

    def __exit__(self, *_):
        for k, v in self.saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
