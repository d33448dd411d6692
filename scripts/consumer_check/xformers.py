"""xformers: its setup.py's FlashAttention-3 choice on
TORCH_CUDA_ARCH_LIST."""

import ast
import os
import sys

from consumer_check import common
from consumer_check.common import CACHE, Env, OUTCOMES, cap, tally, targets_of
from consumer_check.torch import torch_stub


def xformers_fa3(version):
    """xformers' own choice of FlashAttention 3 targets from its setup.py
    (`get_flash_attention3_nvcc_archs_flags`, on TORCH_CUDA_ARCH_LIST, or
    on the first GPU when it is unset). Returns run(env_value, caps, cuda)
    -> the gencode flags, or None for a release without FA3 in its build
    (its CUDA build is torch's, on the same list: the torch cases)."""
    path = os.path.join(CACHE, f"xformers-{version}", "setup.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    nodes = [n for n in tree.body
             if (isinstance(n, ast.FunctionDef) and n.name == "get_flash_attention3_nvcc_archs_flags")
             or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "PARSE_CUDA_ARCH_RE")]
    if not nodes:
        return None
    if len(nodes) != 2:
        sys.exit(f"xformers {version} setup.py: its FlashAttention 3 arch flags moved")
    import platform
    import re
    code = compile(ast.Module(body=nodes, type_ignores=[]), path, "exec")

    def run(env_value, caps, cuda):
        torch = torch_stub(caps, [], cuda)
        torch.cuda.get_device_capability = lambda dev=None: caps[0]
        ns = {"os": os, "re": re, "sys": sys, "platform": platform, "torch": torch}
        exec(code, ns)
        with Env({"TORCH_CUDA_ARCH_LIST": env_value, "XFORMERS_DISABLE_FLASH_ATTN": None}):
            c = cap(cuda or common.NEWEST)
            return ns["get_flash_attention3_nvcc_archs_flags"](c[0] * 100 + c[1])
    return run


def check_xformers(label, torch_list, caps, cuda, builds, run, known):
    """xformers' FlashAttention 3 build on gpuarch's TORCH_CUDA_ARCH_LIST:
    no exception; only what the toolkit builds; and, for an image known to
    have xformers, every GPU its own default gives an arch-specific FA3
    target (an H100: sm_90a, whose wgmma code a plain sm_90 build traps)
    gets one too. Returns (failures, whether FA3 lost an `a` target)."""
    if torch_list is None or run is None:
        return [], False
    try:
        default = targets_of(run(None, caps, cuda))
        unset_ok = cuda is None or all(f"{ma}.{mi}" in builds for _, (ma, mi), _ in default)
    except Exception:
        default, unset_ok = [], False
    try:
        ours = targets_of(run(torch_list, caps, cuda))
    except Exception as e:
        tally(unset_ok, False)
        return [f"{label}: xformers raised {e!r}"], False
    failures = [f"{label}: CUDA {cuda} cannot build {k}_{ma}{mi}{sfx}"
                for k, (ma, mi), sfx in ours if cuda is not None and f"{ma}.{mi}" not in builds]
    exact = lambda ts, d: any(k == "sm" and sfx == "a" and t == d for k, t, sfx in ts)  # noqa: E731
    lost = [d for d in caps if exact(default, d) and unset_ok and not exact(ours, d)]
    if known:
        failures += [f"{label}: xformers' own default builds FlashAttention 3 as sm_{d[0]}{d[1]}a "
                     f"for {d}; gpuarch's list does not" for d in lost]
    if lost and not known and not failures:
        OUTCOMES[("unset works", "gpuarch builds less")] += 1
    else:
        tally(unset_ok, not failures)
    return failures, bool(lost)
