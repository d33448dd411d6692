"""Part 9: the image audit against the driver."""

import json
import os
import subprocess
import tempfile
import time

from gpu_check.common import check, sh
from gpu_check.scratch import image_process_env
from gpu_check.tools import find_nvcc


# Part 9's library: a kernel, and a host function that launches it and
# returns the CUDA runtime's error (0, or 209 where the library carries no
# code this GPU runs, 223 where only PTX fits and JIT is off).
AUDIT_PROBE_CU = r"""
#include <cuda_runtime.h>
extern "C" __global__ void fmha_probe(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
extern "C" int probe_launch(void)
{
    float *x = 0;
    cudaError_t e = cudaMalloc(&x, 256 * sizeof(float));
    if (e != cudaSuccess) return (int)e;
    fmha_probe<<<1, 256>>>(x, 256);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    cudaFree(x);
    return (int)e;
}
"""

AUDIT_LAUNCH_PY = r"""
import ctypes, json, sys
print(json.dumps({"rc": ctypes.CDLL(sys.argv[1]).probe_launch()}))
"""


# torch's own kernels and cuBLAS's GEMM, with the driver's PTX JIT off: they
# run only where the libraries carry SASS for this GPU.
AUDIT_TORCH_PY = r"""
import json, torch
a = torch.randn(512, 512, device="cuda")
v = torch.relu(a @ a).sum().item()
torch.cuda.synchronize()
print(json.dumps({"ok": v == v}))
"""


def audit_run(host, args, rehearse):
    """gpuarchctl --json audit ARGS for GPU 0 (the fixture's in a
    rehearsal); (rc, doc or None, stderr, seconds, max RSS in MiB)."""
    src = ["--inventory", host.rehearsal_inventory] if rehearse else ["--nvml-lib", host.nvml]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([host.bin["gpuarchctl"], *src, "--json", "audit", *args,
                              "--devices", "0"], stdout=out, stderr=err)
        # Reaped here, for this child's own rusage (ru_maxrss in KiB).
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        secs = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        text, said = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    return p.returncode, doc, said.strip(), secs, usage.ru_maxrss / 1024


def part9(host, rehearse=False):
    """Part 9: gpuarchctl audit held to the driver. Libraries nvcc builds,
    each inside a package of a scratch image (sm_75 only, as seed 000's
    xformers; this GPU's SASS; compute_80 PTX only; a package with this
    GPU's SASS and a backend built for a newer GPU alone): the audit's
    verdict for GPU 0 against a launch of the library's kernel, with PTX
    JIT allowed and forbidden. Then this host's own image (its root, its
    Python on PATH): the audit finds torch's libraries and cuBLAS, and
    their verdicts are held to torch and cuBLAS running with PTX JIT off;
    its time and peak RSS."""
    what = "audit"
    label = " (rehearsal: no GPU)" if rehearse else ""
    nvcc = find_nvcc(host)
    if not nvcc:
        return check(what, "nvcc", False, "nvcc not found: the probe libraries are built with it")
    if rehearse:
        cap = json.load(open(host.rehearsal_inventory))["devices"][0]["compute_capability"]
    else:
        cap = host.gpu["compute_cap"]
    sm = cap.replace(".", "")
    cuda_lib = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "lib")
    d = os.path.join(host.tmp, "audit")
    root = os.path.join(d, "rootfs")
    site = os.path.join(root, "usr/local/lib/python3.12/dist-packages")
    src = os.path.join(d, "probe.cu")
    os.makedirs(site)
    open(src, "w").write(AUDIT_PROBE_CU)
    # A capability newer than this GPU's that nvcc builds, for a backend
    # built only for newer GPUs beside its package's own library.
    newer = next((c for c in ("80", "86", "90", "100", "120") if int(c) > int(sm)), None)
    # (check, distribution, package, library in it, gencode, what the
    # audit must say for this GPU)
    variants = [
        ("xformers", "xformers", "xformers", "_C.so", ["arch=compute_75,code=sm_75"],
         "sass" if cap == "7.5" else "no"),
        ("probe-native", "probe-native", "probe_native", "_C.so",
         [f"arch=compute_{sm},code=sm_{sm}"], "sass"),
        ("probe-ptx", "probe-ptx", "probe_ptx", "_C.so", ["arch=compute_80,code=compute_80"],
         "sass" if cap == "8.0" else "jit"),
    ]
    if newer:
        variants += [
            ("probe-backend", "probe-backend", "probe_backend", "_C.so",
             [f"arch=compute_{sm},code=sm_{sm}"], "sass"),
            ("probe-backend, built for newer GPUs", "probe-backend", "probe_backend",
             "newer/_C.so", [f"arch=compute_{newer},code=sm_{newer}"], "other_gpus"),
        ]
    records = {}
    for _, dist, pkg, rel, gencode, _ in variants:
        lib = os.path.join(site, pkg, rel)
        os.makedirs(os.path.dirname(lib), exist_ok=True)
        flags = [x for g in gencode for x in ("-gencode", g)]
        rc, _, err = sh([nvcc, "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
                         f"-L{cuda_lib}", *flags, "-o", lib, src])
        if rc != 0:
            return check(what, dist, False, f"nvcc {' '.join(flags)}: {err.strip()[-300:]}")
        records.setdefault((dist, pkg), []).append(f"{pkg}/{rel}")
    for (dist, pkg), files in records.items():
        info = os.path.join(site, f"{pkg}-1.0.dist-info")
        os.makedirs(info)
        open(os.path.join(info, "METADATA"), "w").write(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n\n")
        open(os.path.join(info, "RECORD"), "w").write(
            "".join(f"{f},,\n" for f in files) + f"{pkg}-1.0.dist-info/RECORD,,\n")
    rc, doc, err, secs, _ = audit_run(host, [root], rehearse)
    if doc is None:
        return check(what, "gpuarchctl audit", False, f"exit {rc}: {err[-400:]}")
    runs = {b["path"]: b["gpus"][0] for b in doc["binaries"]}
    for name, dist, pkg, rel, gencode, want in variants:
        lib = os.path.join(site, pkg, rel)
        v = runs.get("/" + os.path.relpath(lib, root))
        if v is None:
            check(what, name, False, f"the audit did not list {pkg}/{rel}: {doc}")
            continue
        detail = f"{' '.join(gencode)}: gpuarchctl audit: {v['how']}"
        if rehearse:
            check(what, name, v["runs"] == want, detail + f" (wanted {want} for {cap})" + label,
                  audit=v)
            continue
        launches = {}
        for jit in (True, False):
            env = dict(os.environ, CUDA_CACHE_DISABLE="1",
                       LD_LIBRARY_PATH=":".join(p for p in [cuda_lib, "/usr/local/cuda/lib64",
                                                            os.environ.get("LD_LIBRARY_PATH")] if p))
            env.pop("CUDA_DISABLE_PTX_JIT", None)
            if not jit:
                env["CUDA_DISABLE_PTX_JIT"] = "1"
            rc, out, err = sh([host.python, "-c", AUDIT_LAUNCH_PY, lib], env=env, timeout=120)
            launches[jit] = json.loads(out)["rc"] if rc == 0 and out.strip() else f"exit {rc}: {err.strip()[-200:]}"
        on, off = launches[True], launches[False]
        if v["runs"] == "sass":
            ok = on == 0 and off == 0
        elif v["runs"] == "jit":
            ok = on == 0 and off not in (0,)
        else:
            # "no", or "other_gpus": a backend for other GPUs, which fails
            # where it is launched anyway.
            ok = on == 209
        check(what, name, ok and v["runs"] == want,
              detail + f"; the kernel's launch: {'ran' if on == 0 else f'CUDA error {on}'}, "
              f"with JIT off {'ran' if off == 0 else f'CUDA error {off}'}",
              audit=v, launch_jit_on=on, launch_jit_off=off)
    # This host's own image.
    env = image_process_env(host)
    args = ["/", "--max-seconds", "240"] + [a for e in env for a in ("--env", e)]
    rc, doc, err, secs, rss = audit_run(host, args, rehearse)
    if doc is None:
        return check(what, "the host's own image", False, f"exit {rc}: {err[-400:]}")
    bins = doc["binaries"]
    torch_bins = [b for b in bins if b["owner"].startswith("torch ")]
    cublas = [b for b in bins if os.path.basename(b["path"]).startswith("libcublas.so")]
    triton = [b for b in bins if b["owner"].startswith("triton ")]
    cannot = [b for b in bins if b["gpus"][0]["runs"] == "no"]
    core = torch_bins + cublas + triton
    figures = (f"{len(bins)} binaries with GPU code in {doc['files']} files, "
               f"{doc['bytes'] / 2**30:.1f} GiB, read in {secs:.1f} s, peak RSS {rss:.0f} MiB")
    named = (f"torch: {len(torch_bins)} ({', '.join(os.path.basename(b['path']) for b in torch_bins[:4])}"
             f"{', ...' if len(torch_bins) > 4 else ''}); cuBLAS: "
             f"{', '.join(b['path'] for b in cublas) or 'none'}; Triton: {len(triton)}")
    found = bool(torch_bins) and bool(cublas) and doc["stopped"] is None
    core_no = [b["path"] for b in core if b["gpus"][0]["runs"] == "no"]
    check(what, "the host's own image", found and not core_no,
          f"{named}; {figures}; this GPU cannot run {len(cannot)} of them"
          + (f": {', '.join(b['owner'] + ' ' + b['path'] for b in cannot[:6])}" if cannot else "")
          + (f"; stopped {doc['stopped']}" if doc["stopped"] else "") + label,
          binaries=len(bins), files=doc["files"], bytes=doc["bytes"], seconds=secs, rss_mib=rss,
          cannot=[b["path"] for b in cannot], unread=doc["unread"][:20])
    if rehearse:
        return None
    env = dict(os.environ, CUDA_CACHE_DISABLE="1", CUDA_DISABLE_PTX_JIT="1")
    rc, out, err = sh([host.python, "-c", AUDIT_TORCH_PY], env=env, timeout=300)
    ran = rc == 0 and '"ok": true' in out
    sass = [b for b in core if b["gpus"][0]["runs"] == "sass"]
    libtorch = [b for b in torch_bins if os.path.basename(b["path"]) == "libtorch_cuda.so"]
    said = bool(libtorch) and all(b["gpus"][0]["runs"] == "sass" for b in libtorch + cublas)
    check(what, "torch and cuBLAS with PTX JIT off", ran and said,
          f"the audit: {len(sass)} of torch's, cuBLAS's and Triton's {len(core)} binaries run from "
          f"SASS ({', '.join(b['gpus'][0]['how'] for b in libtorch[:1] + cublas[:1])}); torch's "
          f"kernels and a cuBLAS GEMM with CUDA_DISABLE_PTX_JIT=1: "
          + ("ran" if ran else f"failed: {err.strip()[-300:]}"))
    return None
