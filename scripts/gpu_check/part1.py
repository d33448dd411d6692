"""Part 1: NVML for real, gpuarchctl devices against nvidia-smi field by
field."""

import json
import os
import re

from gpu_check.common import check, smi_gpus


def part1(host):
    rows, err = smi_gpus(host)
    if rows is None:
        return check("nvml", "nvidia-smi", False, f"nvidia-smi failed: {err}")
    host.gpu = rows[0]
    rc, out, err = host.ctl("devices", "--json")
    if rc != 0:
        return check("nvml", "devices", False, f"gpuarchctl devices --json: {err.strip()}")
    snap = json.loads(out)
    devs = {d["index"]: d for d in snap["devices"]}
    for r in rows:
        i = int(r["index"])
        d = devs.get(i)
        if d is None:
            check("nvml", f"GPU {i}", False, "nvidia-smi lists it, gpuarchctl does not")
            continue
        mib = d["memory_bytes"] // 2**20
        pairs = [
            ("uuid", d["uuid"], r["uuid"]),
            ("name", d["name"], r["name"]),
            ("compute_capability", d["compute_capability"], r["compute_cap"]),
            ("pci_bus_id", d["pci_bus_id"].upper(), r["pci.bus_id"].upper()),
            ("memory MiB", mib, int(r["memory.total"])),
            # No MIG devices in the snapshot where MIG is off; a GPU with MIG
            # on lists its instances.
            ("mig", "Disabled" if not d["mig"] else "Enabled", r["mig.mode.current"]
             if r["mig.mode.current"] in ("Disabled", "Enabled") else "Disabled"),
        ]
        bad = [f"{k}: gpuarchctl {a!r}, nvidia-smi {b!r}" for k, a, b in pairs if a != b]
        check("nvml", f"GPU {i} fields", not bad,
              "; ".join(bad) or f"{d['name']} {d['compute_capability']} {d['pci_bus_id']}: "
              "uuid, name, capability, bus id, memory and MIG mode agree with nvidia-smi",
              gpuarchctl=d, nvidia_smi=r)
    extra = sorted(set(devs) - {int(r["index"]) for r in rows})
    if extra:
        check("nvml", "GPU count", False, f"gpuarchctl lists GPUs {extra} that nvidia-smi does not")
    # The reading as a fixture: the shape NVML really gave.
    name = devs[0]["name"]
    model = next((m for m in ("h200", "h100", "a100", "b200", "gb200") if m in name.lower()),
                 re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"))
    fixture = os.path.join(host.out, f"{model}-real.json")
    snap["source"] = "fixture"
    with open(fixture, "w") as f:
        json.dump(snap, f, indent=1)
        f.write("\n")
    check("nvml", "fixture", True, f"saved {os.path.basename(fixture)} "
          f"(driver {snap['driver_version']}, CUDA {snap['cuda_driver_version']})")
    rc, checks, err = host.gc("nvml", "--lib", host.nvml, "--runs", "20")
    for c in checks:
        check("nvml", c["name"], c["ok"], c["detail"], **c["data"])
    if not checks:
        check("nvml", "timing", False, err)
