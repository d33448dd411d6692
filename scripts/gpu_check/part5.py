"""Part 5: gpuarchd on real NVML, and gpuarch-hook precreate as the .deb
ships it, timed."""

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from gpu_check.common import ROOT, check, sh
from gpu_check.daemon import Daemon
from gpu_check.scratch import image_process_env, shipped_config


def timed(cmd, stdin_path, env):
    """Wall seconds of one run of cmd (stdin from a file), which must succeed."""
    with open(stdin_path, "rb") as fin:
        t = time.perf_counter()
        p = subprocess.run(cmd, stdin=fin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=env)
        dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}")
    return dt


def bench_hook_module():
    path = os.path.join(ROOT, "scripts/bench-hook")
    loader = importlib.machinery.SourceFileLoader("bench_hook", path)
    spec = importlib.util.spec_from_loader("bench_hook", loader)
    mod = importlib.util.module_from_spec(spec)
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        loader.exec_module(mod)
    finally:
        sys.argv = argv
    return mod


def part5(host):
    # Idle, with no kernel packages: NVML alone. (With packages, the pre-warm
    # at start loads NVRTC into the daemon, below.)
    bare = Daemon(host, "daemon-no-kernels", kernels=False)
    try:
        t = bare.start()
        if t is None:
            return check("daemon", "READY", False, f"gpuarchd did not get ready: {bare.log()}")
        time.sleep(0.5)
        rss_bare = bare.rss_mib()
    finally:
        bare.close()
    node = Daemon(host, "daemon")
    try:
        ready = []
        for _ in range(5):
            t = node.start()
            if t is None:
                return check("daemon", "READY", False, f"gpuarchd did not get ready: {node.log()}")
            ready.append(t)
            node.stop()
        rc, out, err = sh([host.bin["gpuarchd"], "--check-config", "/dev/null"])
        t0 = time.perf_counter()
        for _ in range(5):
            sh([host.bin["gpuarchd"], "--check-config", "/dev/null"])
        bare = (time.perf_counter() - t0) / 5
        node.start()
        rc, _, _ = node.ctl("prewarm")  # the start's pre-warm, finished
        time.sleep(0.5)
        rss = node.rss_mib()
        check("daemon", "READY", True,
              f"exec to READY=1 on real NVML: median {statistics.median(ready) * 1e3:.1f} ms of 5 "
              f"(exec to exit of --check-config {bare * 1e3:.1f} ms); idle RSS {rss_bare[0]:.1f} MiB "
              f"({rss_bare[1]:.1f} anonymous) without kernel packages, {rss[0]:.1f} MiB "
              f"({rss[1]:.1f} anonymous) after pre-warming the samples with NVRTC",
              ready_ms=[r * 1e3 for r in ready], check_config_ms=bare * 1e3,
              rss_mib_no_kernels=rss_bare, rss_mib_after_prewarm=rss)
        rc, checks, err = host.gc("plan-rate", "--address", node.address, "--devices", "0")
        for c in checks:
            check("daemon", c["name"], c["ok"], c["detail"], **c["data"])
        if not checks:
            check("daemon", "plan-rate", False, err)
        t0 = time.perf_counter()
        rc, out, err = node.ctl("prewarm")
        dt = time.perf_counter() - t0
        rc2, kout, _ = node.ctl("--json", "kernels")
        entries = json.loads(kout) if rc2 == 0 else []
        check("daemon", "prewarm", rc == 0 and len(entries) > 0,
              f"gpuarchctl prewarm for this host's arch through gpuarchd: exit {rc} in {dt:.1f} s, "
              f"{len(entries)} builds in the cache" + ("" if rc == 0 else f": {(out + err).strip()[-400:]}"),
              kernels=entries)
        snapshot = os.path.join(node.dir, "run/inventory.json")
        precreate(host, snapshot)
    finally:
        node.close()


def emptied(d):
    """`d` with nothing in it: an image cache before a first read."""
    for n in os.listdir(d):
        p = os.path.join(d, n)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
    return d


def elf_kind(path):
    """("static" or "dynamic", "stripped" or "not stripped") of an ELF
    file, without file(1), which a GPU host may lack: a dynamic program
    names its interpreter near the start; an unstripped one keeps a
    .symtab section, named in the section-name table."""
    with open(path, "rb") as f:
        data = f.read()
    linked = "dynamic" if b"/ld-linux" in data[:4096] else "static"
    return linked, "not stripped" if b"\0.symtab\0" in data else "stripped"


def precreate(host, snapshot):
    """gpuarch-hook precreate as the .deb ships it (the bundle's: static
    and stripped) against cat, on bench-hook's realistic 7 KB config: with
    no config file (no image read), with the NVML fallback, and with the
    shipped config file and this host's own root as the image, its read
    cached and not."""
    bh = bench_hook_module()
    cfg_doc = bh.realistic_config()
    cfg_doc["process"]["env"] = [e.replace("NVIDIA_VISIBLE_DEVICES=0,1", "NVIDIA_VISIBLE_DEVICES=0")
                                 for e in cfg_doc["process"]["env"]]
    cfg = os.path.join(host.tmp, "config.json")
    json.dump(cfg_doc, open(cfg, "w"))
    image_doc = json.loads(json.dumps(cfg_doc))
    image_doc["root"] = {"path": "/", "readonly": True}
    image_doc["process"]["env"] = [e for e in cfg_doc["process"]["env"]
                                   if not e.startswith(("PATH=", "NVIDIA_VISIBLE_DEVICES=",
                                                        "HOME="))] + image_process_env(host)
    image_cfg = os.path.join(host.tmp, "config-image.json")
    json.dump(image_doc, open(image_cfg, "w"))
    shipped, cache = shipped_config(host, "shipped")
    hook = [host.bin["gpuarch-hook"], "precreate"]
    linked, stripped = elf_kind(hook[0])
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUARCH_")}
    # name: (stdin, env, before each run)
    rows = {
        "snapshot": (cfg, dict(base, GPUARCH_CONFIG="/dev/null", GPUARCH_INVENTORY=snapshot), None),
        "nvml": (cfg, dict(base, GPUARCH_CONFIG="/dev/null", GPUARCH_NVML_LIB=host.nvml), None),
        "shipped config, no image": (cfg, dict(base, GPUARCH_CONFIG=shipped,
                                                GPUARCH_INVENTORY=snapshot), None),
        "image cached": (image_cfg, dict(base, GPUARCH_CONFIG=shipped, GPUARCH_INVENTORY=snapshot),
                         None),
        "image first read": (image_cfg, dict(base, GPUARCH_CONFIG=shipped,
                                             GPUARCH_INVENTORY=snapshot), lambda: emptied(cache)),
    }
    if os.path.exists("/run/gpuarch/inventory.json"):
        return check("daemon", "precreate", False,
                     "/run/gpuarch/inventory.json exists here, so the NVML fallback cannot be timed")
    notes = {}
    for k, (stdin, env, _) in rows.items():
        out = subprocess.run(hook, stdin=open(stdin, "rb"), env=dict(env, GPUARCH_LOG="stderr"),
                             capture_output=True)
        # (GPUARCH_COMPUTE_CAPABILITIES: set for any GPU, where the torch
        # list is not for an image not known on a Hopper.)
        want = f"GPUARCH_COMPUTE_CAPABILITIES={host.gpu['compute_cap']}".encode()
        if out.returncode != 0 or want not in out.stdout:
            return check("daemon", f"precreate {k}", False,
                         f"the hook did not apply the Plan: {out.stderr.decode()[-300:]}")
        notes[k] = next((line for line in out.stderr.decode().splitlines()
                         if "the image's consumers" in line), "")
    runs = 200
    t = {"cat": [], **{k: [] for k in rows}}
    for _ in range(runs):
        t["cat"].append(timed(["cat", cfg], cfg, base))
        for k, (stdin, env, before) in rows.items():
            if before:
                before()
            t[k].append(timed(hook, stdin, env))
    med = {k: statistics.median(v) for k, v in t.items()}
    cache_on = "a tmpfs" if host.run_tmp != host.tmp else "the scratch disk (no writable tmpfs)"
    for k in rows:
        shipped_row = rows[k][1].get("GPUARCH_CONFIG") == shipped
        # What reading the image adds to a start with the same config.
        over = (med[k] - med["shipped config, no image"]) * 1e3 if k.startswith("image") else None
        check("daemon", f"precreate {k}", True,
              f"{linked}, {stripped}: median {med[k] * 1e3:.2f} ms against cat "
              f"{med['cat'] * 1e3:.2f} ms: {med[k] / med['cat']:.2f}x ({runs} runs each, "
              f"interleaved)" + (f"; {over:+.2f} ms over no image" if over is not None else "")
              + (f"; cache and records on {cache_on}" if shipped_row else "")
              + (f"; {notes[k].split(': ', 1)[-1]}" if notes[k] else ""),
              median_ms=med[k] * 1e3, cat_ms=med["cat"] * 1e3, ratio=med[k] / med["cat"],
              over_no_image_ms=over, linked=linked, stripped=stripped, note=notes[k])
