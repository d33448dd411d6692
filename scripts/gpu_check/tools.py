"""The toolchain on the GPU host, read: torch's libraries and release,
cuobjdump's targets of a library, nvcc."""

import os
import re
import shutil
import sys

from gpu_check.common import sh


def torch_lib(name):
    rc, out, _ = sh([sys.executable, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"])
    return os.path.join(out.strip(), "lib", name) if rc == 0 else None


def cuobjdump_targets(cuobjdump, lib):
    """sm_XY for each ELF, compute_XY for each PTX cuobjdump lists."""
    if not cuobjdump:
        return None, "not found"
    rc, out, err = sh([cuobjdump, "--list-elf", "--list-ptx", lib])
    if rc != 0 and "does not contain device code" not in err:
        return None, err.strip()
    found = set()
    for line in out.splitlines():
        m = re.search(r"\.(sm_\d+[af]?)\.(cubin|ptx)\b", line)
        if m:
            t = m.group(1)
            found.add(t if m.group(2) == "cubin" else t.replace("sm_", "compute_"))
    return found, None


def torch_release(python):
    """The torch release `python` imports, as its dist-info names it, or
    None: the image's consumers, for `gpuarchctl plan --software`. (For an
    image not known, a Hopper's torch list is left unset: an xformers there
    needs 9.0a and a DeepSpeed rejects it.)"""
    rc, out, _ = sh([python, "-c", "from importlib import metadata; print(metadata.version('torch'))"])
    return out.strip() if rc == 0 and out.strip() else None


def software_args(python):
    v = torch_release(python)
    return ["--software", f"torch=={v}"] if v else []


def find_nvcc(host):
    found = [shutil.which("nvcc")]
    found += [os.path.join(d, "bin/nvcc") for d in (host.cuda, os.environ.get("CUDA_HOME")) if d]
    return next((c for c in found if c and os.access(c, os.X_OK)), None)
