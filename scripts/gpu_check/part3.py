"""Part 3: the inspector against the driver, and a real library's
targets against cuobjdump's."""

import json
import os
import time

from gpu_check.common import check, sh
from gpu_check.tools import cuobjdump_targets, find_nvcc, torch_lib


PROBE_CU = r"""
extern "C" __global__ void probe(float *out) { out[threadIdx.x] = threadIdx.x * 2.0f; }
"""


def part3(host):
    nvcc = find_nvcc(host)
    if not nvcc:
        return check("inspect", "nvcc", False, "nvcc not found: the test binaries are made with it")
    d = os.path.join(host.tmp, "inspect")
    os.makedirs(d)
    src = os.path.join(d, "probe.cu")
    open(src, "w").write(PROBE_CU)
    cap = host.gpu["compute_cap"].replace(".", "")
    files = {
        # name: nvcc arguments
        "sm_75.cubin": ["-cubin", "-arch=sm_75"],
        "sm_86.cubin": ["-cubin", "-arch=sm_86"],
        "sm_80.cubin": ["-cubin", "-arch=sm_80"],
        f"sm_{cap}.cubin": ["-cubin", f"-arch=sm_{cap}"],
        f"sm_{cap}a.cubin": ["-cubin", f"-arch=sm_{cap}a"],
        "compute_80.fatbin": ["-fatbin", "-gencode", "arch=compute_80,code=compute_80"],
        "sm_75+compute_80.fatbin": ["-fatbin", "-gencode", "arch=compute_75,code=sm_75",
                                    "-gencode", "arch=compute_80,code=compute_80"],
        "compute_80.ptx": ["-ptx", "-arch=compute_80"],
    }
    made = []
    for name, flags in files.items():
        out = os.path.join(d, name)
        rc, _, err = sh([nvcc, *flags, "-o", out, src])
        if rc != 0:
            check("inspect", name, False, f"nvcc {' '.join(flags)}: {err.strip()[-300:]}")
        else:
            made.append(out)
    rc, out, err = host.ctl("inspect", "--json", *made)
    if rc not in (0, 1):
        return check("inspect", "gpuarchctl", False, f"gpuarchctl inspect: {err.strip()}")
    verdicts = {v["file"]: v for v in json.loads(out)}
    loads = {}
    for jit in (True, False):
        # No JIT cache: a PTX load would otherwise leave SASS in
        # ~/.nv/ComputeCache that the JIT-off run then loads.
        env = dict(os.environ, CUDA_CACHE_DISABLE="1")
        env.pop("CUDA_DISABLE_PTX_JIT", None)
        if not jit:
            env["CUDA_DISABLE_PTX_JIT"] = "1"
        rc, checks, err = host.gc("load", *made, env=env)
        if not checks:
            return check("inspect", "driver", False, err or f"gpuarch-gpu-check load exited {rc}")
        for c in checks:
            loads[(c["data"]["file"], jit)] = c["data"]
    for f in made:
        v = verdicts[f]["gpus"][0]
        how = v["how"]
        plain, nojit = loads[(f, True)], loads[(f, False)]
        if how.startswith("runs from SASS"):
            said, ok = "SASS", plain["loaded"] and nojit["loaded"]
        elif how.startswith("runs by PTX JIT"):
            said, ok = "JIT", plain["loaded"] and not nojit["loaded"]
        else:
            said = "no"
            ok = not plain["loaded"] and plain["error"] == "CUDA_ERROR_NO_BINARY_FOR_GPU"
        driver = ("loads" if plain["loaded"] else f"refuses ({plain['error']})") + \
            ", with JIT off " + ("loads" if nojit["loaded"] else f"refuses ({nojit['error']})")
        check("inspect", os.path.basename(f), ok,
              f"gpuarchctl: {how}; driver: {driver}", inspector=verdicts[f], said=said,
              driver_jit_on=plain, driver_jit_off=nojit)
    # Real-world libraries: the inspector's targets against cuobjdump's.
    cuobjdump = host.cuobjdump()
    libs = [p for p in [
        host.cuda and os.path.realpath(os.path.join(host.cuda, "lib64/libcublas.so")),
        torch_lib("libtorch_cuda.so"),
    ] if p and os.path.isfile(p)]
    for lib in libs:
        t0 = time.perf_counter()
        rc, out, err = host.ctl("inspect", "--json", lib)
        dt = time.perf_counter() - t0
        if rc not in (0, 1):
            check("inspect", os.path.basename(lib), False, f"gpuarchctl inspect: {err.strip()}")
            continue
        doc = json.loads(out)[0]
        ours = {c["target"] for c in doc["code"]}
        theirs, why = cuobjdump_targets(cuobjdump, lib)
        if theirs is None:
            check("inspect", os.path.basename(lib), False, f"cuobjdump: {why}")
            continue
        ok = ours == theirs
        check("inspect", os.path.basename(lib), ok,
              f"{doc['gpus'][0]['how']}; targets {', '.join(sorted(ours))} "
              + ("= cuobjdump's" if ok else f"but cuobjdump lists {', '.join(sorted(theirs))}")
              + f" ({os.path.getsize(lib) / 2**20:.0f} MiB read in {dt:.2f} s)",
              ours=sorted(ours), cuobjdump=sorted(theirs), seconds=dt)
