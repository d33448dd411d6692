"""Image-aware plans: gpuarch-hook precreate on rootfs laid out as real
images are (uv's venv, ~/.local, conda envs), its Plan fed to the
consumers' code."""

import json
import os
import re
import shutil
import tempfile

from consumer_check.common import ROOT, TORCH, cap
from consumer_check.deepspeed import check_deepspeed, check_deepspeed_ops
from consumer_check.jit import run_precreate
from consumer_check.torch import check_torch
from consumer_check.xformers import check_xformers


FIXTURE_IMAGES = os.path.join(ROOT, "tests", "fixtures", "images")

UV_PATH = "PATH=/app/.venv/bin:/usr/local/bin:/usr/bin:/bin"


def copy_site(src_fixture, src_site, root, dest_site):
    """The dist-infos of a fixture's site, copied into `root` at `dest_site`."""
    src = os.path.join(FIXTURE_IMAGES, src_fixture, src_site)
    dest = os.path.join(root, dest_site)
    os.makedirs(dest, exist_ok=True)
    for n in os.listdir(src):
        shutil.copytree(os.path.join(src, n), os.path.join(dest, n))


def uv_venv(root):
    """uv's /app/.venv: its pyvenv.cfg and its python, a link to the base."""
    os.makedirs(os.path.join(root, "app/.venv/bin"))
    with open(os.path.join(root, "app/.venv/pyvenv.cfg"), "w") as f:
        f.write("home = /usr/bin\nimplementation = CPython\nuv = 0.9.7\n"
                "include-system-site-packages = false\n")
    os.symlink("/usr/bin/python3.12", os.path.join(root, "app/.venv/bin/python3"))


def layout_images(base):
    """(name, rootfs, process env, uid, {consumer: version}) of each tree."""
    trees = []

    def tree(name):
        root = os.path.join(base, name)
        os.makedirs(root)
        return root
    root = tree("every-layout")
    shutil.copytree(os.path.join(FIXTURE_IMAGES, "layouts"), root, symlinks=True,
                    dirs_exist_ok=True)
    have = {"torch": "2.9.1", "xformers": "0.0.34", "deepspeed": "0.19.8"}
    trees.append(("every layout, root", root, [UV_PATH, "VIRTUAL_ENV=/app/.venv"], 0, have))
    trees.append(("every layout, uid 1000", root, [UV_PATH, "VIRTUAL_ENV=/app/.venv"], 1000, have))
    # The case: xformers in NGC's dist-packages, DeepSpeed in uv's
    # venv on PATH.
    root = tree("xformers-system-deepspeed-venv")
    copy_site("xformers", "usr/local/lib/python3.12/dist-packages", root,
              "usr/local/lib/python3.12/dist-packages")
    uv_venv(root)
    copy_site("deepspeed", "opt/conda/lib/python3.11/site-packages", root,
              "app/.venv/lib/python3.12/site-packages")
    trees.append(("xformers in dist-packages, DeepSpeed in uv's venv", root, [UV_PATH], 0, have))
    # DeepSpeed (with torch) only in the ~/.local of a user whose home
    # /etc/passwd names; xformers in RHEL's lib64.
    root = tree("xformers-lib64-deepspeed-user")
    copy_site("xformers", "usr/local/lib/python3.12/dist-packages", root,
              "usr/local/lib64/python3.12/site-packages")
    copy_site("deepspeed", "opt/conda/lib/python3.11/site-packages", root,
              "home/app/.local/lib/python3.12/site-packages")
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
    trees.append(("xformers in lib64, DeepSpeed in a user's ~/.local", root,
                  ["PATH=/usr/bin:/bin"], 1000, have))
    return trees


def private_config(base):
    """A config whose every path is under `base`: the hook then neither
    reads nor writes the host's /run/gpuarch or /var/cache/gpuarch. The
    image cache is left absent, so that each start reads the tree."""
    path = os.path.join(base, "config.yaml")
    with open(path, "w") as f:
        f.write(f"hook:\n  image_cache: {base}/no-image-cache\n"
                f"  record_dir: {base}/records\n"
                f"kernels:\n  mount_root: {base}/kernels\n  package_dirs: []\n"
                f"  cache_dir: {base}/cache\n  spool_dir: {base}/requests\n")
    return path


# A read stopped by its deadline (40 ms) leaves the image unread, as it
# should on a loaded host; here, where the hook runs at nice 19 beside
# cargo test, such a start is made again, up to this many times in all.
READ_TRIES = 5

OVER_TIME = re.compile(r"Python environments were not read: over \d+ ms")

slow_reads = []


def hook_plan_of(rootfs, env, uid, fixture, devices, cuda, config):
    """The variables gpuarch-hook precreate adds for a container of
    `rootfs`, and the hook's line on the image's consumers."""
    penv = [*env, f"NVIDIA_VISIBLE_DEVICES={devices}"]
    if cuda is not None:
        penv.append(f"CUDA_VERSION={cuda}.0")
    spec = {"ociVersion": "1.2.0", "root": {"path": rootfs, "readonly": True}, "mounts": [],
            "process": {"args": ["sh"], "env": penv, "user": {"uid": uid, "gid": uid}, "cwd": "/"}}
    for _ in range(READ_TRIES):
        out, log = run_precreate(spec, dict(GPUARCH_CONFIG=config, GPUARCH_INVENTORY=fixture,
                                            GPUARCH_LOG="stderr"))
        if not OVER_TIME.search(log):
            break
        slow_reads.append(rootfs)
    got = dict(e.split("=", 1) for e in out["process"]["env"] if e not in penv)
    line = next((x for x in log.splitlines() if "the image's consumers: " in x), "")
    if not line:
        line = "; ".join(log.splitlines()[:3])
    return got, line


def check_image_aware(torches, xformers, deepspeeds, toolkits, table):
    """Each layout tree on each GPU of the mixed fixtures and the B200
    pair, under each toolkit: the hook must read every environment (its
    line names each consumer the tree holds), and the consumers the tree
    holds, at the versions it holds, given the hook's Plan: torch,
    xformers, DeepSpeed's builder and its filtering ops."""
    base = tempfile.mkdtemp()
    failures, cases = [], 0
    try:
        trees = layout_images(base)
        os.mkdir(os.path.join(base, "hook"))
        config = private_config(os.path.join(base, "hook"))
        fixtures = [os.path.join(ROOT, "tests", "fixtures", f"{n}.json")
                    for n in ("2080ti-3090", "a100-h100", "blackwell-mix")]
        for name, root, env, uid, have in trees:
            for fixture in fixtures:
                snap = json.load(open(fixture))
                gpus = [cap(d["compute_capability"]) for d in snap["devices"]]
                for i, c in enumerate(gpus):
                    for cuda in toolkits:
                        got, line = hook_plan_of(root, env, uid, fixture, str(i), cuda, config)
                        where = (f"{name}: {os.path.basename(fixture)} GPU {i} {c}, CUDA "
                                 f"{cuda or 'unknown'}")
                        for dist, v in have.items():
                            if f"{dist} {v}" not in line:
                                failures.append(f"{where}: the hook did not read {dist} {v}: {line}")
                        torch_list = got.get("TORCH_CUDA_ARCH_LIST")
                        builds = set(table[cuda]) if cuda else None
                        run, supported = torches[have["torch"]]
                        cases += 3
                        failures += check_torch(f"{where}, torch {have['torch']}: "
                                                f"TORCH_CUDA_ARCH_LIST={torch_list!r}", torch_list,
                                                [c], cuda, builds, run, supported, have["torch"])
                        failures += check_xformers(f"{where}, xformers {have['xformers']}: "
                                                   f"TORCH_CUDA_ARCH_LIST={torch_list!r}", torch_list,
                                                   [c], cuda, builds, xformers[have["xformers"]],
                                                   True)[0]
                        base_run, ops = deepspeeds[have["deepspeed"]]
                        cases += len(ops)
                        failures += check_deepspeed(f"{where}, DeepSpeed {have['deepspeed']}: "
                                                    f"TORCH_CUDA_ARCH_LIST={torch_list!r}", torch_list,
                                                    [c], cuda, builds, base_run,
                                                    torches[TORCH[-1]][0])
                        failures += check_deepspeed_ops(f"{where}, DeepSpeed {have['deepspeed']}",
                                                        got, [c], cuda, builds, ops)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return cases, failures, len(trees)
