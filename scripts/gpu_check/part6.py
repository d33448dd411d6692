"""Part 6: the unit's sandbox against the driver."""

import json
import os
import re

from gpu_check.common import check
from gpu_check.daemon import Daemon


def part6(host):
    gc = host.bin["gpuarch-gpu-check"]
    bpf = os.path.join(host.bundle, "seccomp")
    sandboxes = {"PR_SET_MDWE": [gc, "sandbox", "--mdwe", "--"]}
    if os.path.isfile(os.path.join(bpf, "system-service.bpf")):
        sandboxes["@system-service + seccomp MDWE"] = [
            gc, "sandbox", "--bpf", os.path.join(bpf, "system-service.bpf"),
            "--bpf", os.path.join(bpf, "mdwe.bpf"), "--"]
        sandboxes["all three"] = [gc, "sandbox", "--mdwe", "--bpf",
                                  os.path.join(bpf, "system-service.bpf"),
                                  "--bpf", os.path.join(bpf, "mdwe.bpf"), "--"]
    else:
        check("sandbox", "seccomp", False, f"no seccomp programs in {bpf}: run scripts/gpu-check bundle")
    for label, wrapper in sandboxes.items():
        node = Daemon(host, "sandbox-" + re.sub(r"[^a-z0-9]+", "-", label.lower()))
        try:
            t = node.start(wrapper)
            if t is None:
                check("sandbox", label, False, f"gpuarchd under {label} did not get ready: {node.log()}")
                continue
            fds = node.device_fds()
            rc, out, err = node.ctl("--json", "devices")
            n = len(json.loads(out)["devices"]) if rc == 0 else 0
            rc2, out2, err2 = node.ctl("prewarm")
            ok = n > 0 and rc2 == 0
            check("sandbox", label, ok,
                  f"gpuarchd READY in {t * 1e3:.0f} ms; NVML lists {n} GPU(s); NVRTC pre-warm "
                  + ("built" if rc2 == 0 else f"failed: {(out2 + err2).strip()[-300:]}")
                  + f"; device nodes open: {', '.join(fds) or 'none'}",
                  device_fds=fds, log=node.log() if not ok else "")
        finally:
            node.close()
