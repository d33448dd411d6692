"""This host's root seen as an image: its process env, a scratch tmpfs,
and the shipped config pointed at private directories."""

import os
import tempfile

from gpu_check.common import ROOT
from gpu_check.containers import python_paths


def image_process_env(host):
    """The process env of an image that is this host: its Python's
    directory first on PATH (a venv's bin, as images with a venv set it),
    VIRTUAL_ENV where that Python is a venv's, and the host's CUDA_VERSION
    where it has one."""
    _, prefix, base = python_paths(host.python)
    env = [f"PATH={os.path.dirname(host.python)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
           "/sbin:/bin", "NVIDIA_VISIBLE_DEVICES=0", "HOME=/root"]
    if prefix != base:
        env.append(f"VIRTUAL_ENV={prefix}")
    if os.environ.get("CUDA_VERSION"):
        env.append(f"CUDA_VERSION={os.environ['CUDA_VERSION']}")
    return env


def tmpfs_dirs():
    """Mount points of tmpfs, from /proc/self/mounts."""
    try:
        lines = open("/proc/self/mounts").read().splitlines()
    except OSError:
        return set()
    return {f[1] for f in (line.split() for line in lines) if len(f) > 2 and f[2] == "tmpfs"}


def run_scratch(host):
    """A scratch directory on a tmpfs, as /run/gpuarch is where the .deb
    installs it (a cache file made on a disk costs a start more): under
    /run or /dev/shm where either is a writable tmpfs, else this run's
    scratch directory. Removed with it."""
    if host.run_tmp is None:
        mounted = tmpfs_dirs()
        base = next((d for d in ("/run", "/dev/shm") if d in mounted and os.access(d, os.W_OK)), None)
        host.run_tmp = tempfile.mkdtemp(prefix="gpu-check-", dir=base) if base else host.tmp
    return host.run_tmp


def shipped_config(host, name):
    """packaging/config.yaml as the .deb installs it, its image cache and
    record directory moved into a scratch directory on a tmpfs where there
    is one: (config path, image cache path)."""
    return shipped_config_in(os.path.join(run_scratch(host), name))


def shipped_config_in(d, log=None):
    """packaging/config.yaml as the .deb installs it, written to
    d/config.yaml with its image cache and record directory moved to
    d/images and d/containers (made, as tmpfiles.d makes them), and its log
    file to `log` where given: (config path, image cache path). Also
    scripts/bench-hook's shipped config."""
    cache, records = os.path.join(d, "images"), os.path.join(d, "containers")
    os.makedirs(cache, mode=0o700)
    os.makedirs(records, mode=0o700)
    text = open(os.path.join(ROOT, "packaging/config.yaml")).read()
    moved = [("/run/gpuarch/images", cache), ("/run/gpuarch/containers", records)]
    if log is not None:
        moved.append(("/run/gpuarch/gpuarch.log", log))
    for old, new in moved:
        if old not in text:
            raise RuntimeError(f"packaging/config.yaml no longer names {old}")
        text = text.replace(old, new)
    path = os.path.join(d, "config.yaml")
    open(path, "w").write(text)
    return path, cache
