"""Part 2: the store's builds for this GPU's arch, loaded and run against
a CPU reference."""

import os

from gpu_check.common import ROOT, check


def part2(host):
    store = os.path.join(host.tmp, "store")
    args = ["kernels", "--packages", os.path.join(ROOT, "kernels/packages"), "--store", store]
    if host.cuda:
        args += ["--cuda-dir", host.cuda]
    rc, checks, err = host.gc(*args)
    for c in checks:
        check("kernels", c["name"], c["ok"], c["detail"], **c["data"])
    if not checks:
        check("kernels", "run", False, err or f"gpuarch-gpu-check kernels exited {rc}")
