"""gpuarch's toolkit table against NVRTC's own nvrtcGetSupportedArchs."""

import glob
import os

from consumer_check.common import CACHE, NVRTC, ROOT, cap, ctl


def nvrtc_archs(lib_path):
    """(version, archs) that an NVRTC library reports."""
    import ctypes
    lib = ctypes.CDLL(lib_path)
    major, minor, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    lib.nvrtcGetNumSupportedArchs(ctypes.byref(n))
    archs = (ctypes.c_int * n.value)()
    lib.nvrtcGetSupportedArchs(archs)
    return f"{major.value}.{minor.value}", [f"{a // 10}.{a % 10}" for a in archs]


def nvrtc_check(table):
    """The architectures NVIDIA's own NVRTC of each release in NVRTC (and
    the one scripts/test installs under .local/cuda) says it accepts,
    against gpuarch's table for that release. The failures."""
    base = os.environ.get("GPUARCH_CUDA_DIR") or os.path.join(ROOT, ".local", "cuda", "nvidia")
    installed = sorted(glob.glob(os.path.join(base, "cuda_nvrtc", "lib", "libnvrtc.so.*")))
    failures = []
    if not installed:
        failures.append(f"no NVRTC under {base} (scripts/test installs it): its release was not checked")
    libs = installed[:1] + [os.path.join(CACHE, f"nvrtc-{v}", "libnvrtc.so") for _, v in NVRTC]
    for path in libs:
        version, real = nvrtc_archs(path)
        ours = ctl("arch", "toolkit", version, "--json")["archs"]
        agree = sorted(real, key=cap) == sorted(ours, key=cap)
        print(f"NVRTC {version} accepts {' '.join(real)}"
              + ("" if agree else f"; gpuarch's table says {' '.join(ours)}"))
        if not agree:
            failures.append(f"NVRTC {version} accepts {real}, gpuarch's table says {ours}")
    return failures
