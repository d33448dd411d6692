"""flash-attn: `cuda_archs()` and its setup.py's gencodes on
FLASH_ATTN_CUDA_ARCHS."""

import ast
import os
import sys

from consumer_check import common
from consumer_check.common import CACHE, FLASH_ATTN, as_named, serves, tally, targets_of


def flash_attn_gencodes(version=FLASH_ATTN):
    """flash-attn's own gencode choices from its setup.py: its `cuda_archs`
    and each `if` that asks it, run as the build runs them. Returns
    run(env_value, cuda) -> the `arch=...,code=sm_XY` flags, or None for a
    release that does not read FLASH_ATTN_CUDA_ARCHS (before 2.7: the
    variable cannot change what it builds)."""
    try:
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.version import Version
    path = os.path.join(CACHE, f"flash-attn-{version}", "setup.py")
    with open(path) as f:
        source = f.read()
    if "FLASH_ATTN_CUDA_ARCHS" not in source:
        return None
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cuda_archs")

    def asks(node):
        return any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "cuda_archs"
                   for c in ast.walk(node))
    ifs = [n for n in ast.walk(tree) if isinstance(n, ast.If) and asks(n.test)]
    if len(ifs) < 4:
        sys.exit(f"flash-attn {version} setup.py: {len(ifs)} uses of cuda_archs(), expected 4")
    code = compile(ast.Module(body=[fn, *ifs], type_ignores=[]), path, "exec")

    def run(env_value, cuda):
        old = os.environ.pop("FLASH_ATTN_CUDA_ARCHS", None)
        try:
            if env_value is not None:
                os.environ["FLASH_ATTN_CUDA_ARCHS"] = env_value
            ns = {"os": os, "functools": __import__("functools"), "Version": Version, "cc_flag": [],
                  "bare_metal_version": Version(cuda or common.NEWEST), "CUDA_HOME": "/usr/local/cuda"}
            exec(code, ns)
            return [f for f in ns["cc_flag"] if f.startswith("arch=")]
        finally:
            os.environ.pop("FLASH_ATTN_CUDA_ARCHS", None)
            if old is not None:
                os.environ["FLASH_ATTN_CUDA_ARCHS"] = old
    return run


def check_flash_attn(label, value, caps, cuda, run):
    """gpuarch sets it only when FlashAttention-2 runs on every GPU (8.0
    on); then flash-attn's own build compiles something that runs on each."""
    if any(d < (8, 0) for d in caps):
        return [f"{label}: set although a GPU is below 8.0"] if value is not None else []
    if value is None or run is None:
        return []
    sm = lambda flags: [t for t in targets_of(["," + f for f in flags]) if t[0] == "sm"]  # noqa: E731
    unset_ok = all(serves(as_named(d, cuda), sm(run(None, cuda))) for d in caps)
    flags = run(value, cuda)
    failures = [f"{label}: flash-attn builds {flags}, nothing of which runs on {d}"
                for d in caps if not serves(as_named(d, cuda), sm(flags))]
    tally(unset_ok, not failures)
    return failures
