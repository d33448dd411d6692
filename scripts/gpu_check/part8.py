"""Part 8: the image known: gpuarch-hook precreate on this host's root as
the image, and a torch extension built under its Plan."""

import json
import os
import re
import subprocess

from gpu_check.common import check, sh
from gpu_check.containers import PYBIND_CU
from gpu_check.scratch import image_process_env, shipped_config
from gpu_check.tools import cuobjdump_targets


# Part 8's process: part 7's pybind11 kernel built by cpp_extension.load
# with the Plan's TORCH_CUDA_ARCH_LIST, and run where there is a GPU.
IMAGE_EXT_PY = r"""
import json, sys, time
t = time.perf_counter()
from torch.utils import cpp_extension
import torch
m = cpp_extension.load(name="gpuarch_image_probe", sources=[sys.argv[1]], verbose=False)
load_s = time.perf_counter() - t
ran = None
if torch.cuda.is_available():
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    rc = m.run(x.data_ptr(), y.data_ptr(), x.numel())
    ran = rc == 0 and bool(torch.equal(y, 2 * x))
print(json.dumps({"load_s": load_s, "ran": ran, "so": m.__file__,
                  "arch_flags": cpp_extension._get_cuda_arch_flags()}))
"""


# What part 8 asks of the image's Python: torch's version (as its
# dist-info names it) and the site-packages it imports from.
PY_INFO = ("import json, sysconfig\nfrom importlib import metadata\n"
           "print(json.dumps({'torch': metadata.version('torch'), "
           "'site': sysconfig.get_paths()['purelib']}))")


def want_targets(arch_list):
    """What cuobjdump lists for a build under TORCH_CUDA_ARCH_LIST: sm_XY
    for each entry, and compute_XY for each +PTX."""
    want = set()
    for e in arch_list.replace(" ", ";").split(";"):
        if not e:
            continue
        num = e.replace("+PTX", "").replace(".", "")
        want.add(f"sm_{num}")
        if e.endswith("+PTX"):
            want.add(f"compute_{num}")
    return want


def part8(host, rehearse=False):
    """Part 8: the hook's Plan for this host's own image (its root, its
    Python as an image's env names it: a venv on PATH) names the
    environments it found and the torch in them; a torch extension built
    under that Plan carries SASS for this GPU."""
    what = "image"
    label = " (rehearsal: no GPU)" if rehearse else ""
    rc, out, err = sh([host.python, "-c", PY_INFO])
    if rc != 0:
        return check(what, "torch", False, f"{host.python} has no torch: "
                     f"{err.strip().splitlines()[-1] if err.strip() else rc}")
    info = json.loads(out)
    if rehearse:
        fixture = json.load(open(host.rehearsal_inventory))
        cap, gpu = fixture["devices"][0]["compute_capability"], {"GPUARCH_INVENTORY":
                                                                 host.rehearsal_inventory}
    else:
        cap, gpu = host.gpu["compute_cap"], {"GPUARCH_NVML_LIB": host.nvml}
    doc = {"ociVersion": "1.2.0",
           "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["python3"],
                       "env": image_process_env(host), "cwd": "/"},
           "root": {"path": "/", "readonly": True}, "hostname": "gpu-check", "mounts": [],
           "linux": {"namespaces": [{"type": "mount"}]}}
    stdin = os.path.join(host.tmp, "image-config.json")
    json.dump(doc, open(stdin, "w"))
    shipped, _ = shipped_config(host, "image")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUARCH_")}
    env.update(gpu, GPUARCH_CONFIG=shipped, GPUARCH_LOG="stderr")
    p = subprocess.run([host.bin["gpuarch-hook"], "precreate"], stdin=open(stdin, "rb"), env=env,
                       capture_output=True, timeout=60)
    log = p.stderr.decode(errors="replace")
    if p.returncode != 0:
        return check(what, "the host's own image read", False,
                     f"gpuarch-hook precreate exited {p.returncode}: {log[-400:]}")
    before = set(doc["process"]["env"])
    added = dict(e.split("=", 1) for e in json.loads(p.stdout)["process"]["env"]
                 if e not in before)
    note = next((line.split("the image's consumers: ", 1)[1] for line in log.splitlines()
                 if "the image's consumers: " in line), "")
    found, _, sites = note.partition(", read from ")
    sites = [s.strip() for s in sites.split(",") if s.strip()]
    site = os.path.realpath(info["site"])
    read = any(os.path.realpath(s) == site for s in sites)
    # The hook names a release without its local part (2.11.0, not
    # 2.11.0+cu130).
    public = info["torch"].split("+")[0]
    named = re.search(rf"\btorch {re.escape(public)}(\+\S+)?(,|$)", found) is not None
    check(what, "the host's own image read", read and named,
          f"{host.python} (torch {info['torch']} in {info['site']}) as the image's "
          f"Python: the hook found {found or 'nothing'}, read from {', '.join(sites) or 'nowhere'}"
          + ("" if read else f"; {info['site']} was not read")
          + ("" if named else f"; torch {info['torch']} not named") + label,
          note=note, sites=sites, plan=added, torch=info["torch"], site=info["site"])
    arch = added.get("TORCH_CUDA_ARCH_LIST")
    if not arch:
        return check(what, "an extension built under the image's Plan", False,
                     f"the Plan set no TORCH_CUDA_ARCH_LIST: {sorted(added)}")
    src = os.path.join(host.tmp, "image_probe.cu")
    open(src, "w").write(PYBIND_CU)
    py = os.path.join(host.tmp, "image_ext.py")
    open(py, "w").write(IMAGE_EXT_PY)
    run_env = dict(os.environ, **added, PYTHONUNBUFFERED="1",
                   TORCH_EXTENSIONS_DIR=os.path.join(host.tmp, "image-extensions"))
    rc, out, err = sh([host.python, py, src], env=run_env, timeout=580)
    if rc != 0 or not out.strip():
        return check(what, "an extension built under the image's Plan", False,
                     f"cpp_extension.load with TORCH_CUDA_ARCH_LIST={arch}: {err.strip()[-600:]}")
    r = json.loads(out.strip().splitlines()[-1])
    targets, why = cuobjdump_targets(host.cuobjdump(), r["so"])
    want = want_targets(arch)
    native = f"sm_{cap.replace('.', '')}"
    ran_ok = r["ran"] is None if rehearse else r["ran"] is True
    check(what, "an extension built under the image's Plan",
          targets == want and native in (targets or set()) and ran_ok,
          f"TORCH_CUDA_ARCH_LIST={arch}: torch passed {' '.join(r['arch_flags'])} and built it in "
          f"{r['load_s']:.1f} s; the .so carries {sorted(targets or [])} (cuobjdump"
          f"{': ' + why if why else ''}; wanted {sorted(want)}, with {native} for this "
          f"GPU's {cap})" + (", imported, not run" if rehearse else
                            f"; the kernel ran right: {r['ran']}") + label,
          result=r, targets=sorted(targets or []), want=sorted(want), native=native)
    return None
