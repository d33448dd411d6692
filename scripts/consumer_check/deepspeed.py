"""DeepSpeed: its op builder (`compute_capability_args`), ahead of time
and at JIT load, and each op's own filter, on TORCH_CUDA_ARCH_LIST."""

import ast
import glob
import os
import sys
import types
import typing

from consumer_check import common
from consumer_check.common import (
    CACHE, DEEPSPEED, Env, Modules, as_named, cap, serves, tally, targets_of,
)
from consumer_check.torch import judge_targets, torch_stub


def deepspeed_ops(version):
    """Each op of DeepSpeed `version` whose builder keeps only some
    architectures (its own `filter_ccs`): (BUILD_VAR, the method's AST)."""
    d = os.path.join(CACHE, f"deepspeed-{version}", "op_builder")
    ops = []
    for path in sorted(glob.glob(os.path.join(d, "*.py"))):
        with open(path) as f:
            tree = ast.parse(f.read())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            var = next((n.value.value for n in cls.body if isinstance(n, ast.Assign)
                        and getattr(n.targets[0], "id", None) == "BUILD_VAR"), None)
            filt = next((n for n in cls.body
                         if isinstance(n, ast.FunctionDef) and n.name == "filter_ccs"), None)
            if var and filt:
                ops.append((var, filt))
    return ops


def deepspeed_builder(version=DEEPSPEED, op_filter=None):
    """DeepSpeed's own reading of TORCH_CUDA_ARCH_LIST: CUDAOpBuilder's
    compute_capability_args and filter_ccs (or an op's own `op_filter`),
    and its default list (get_default_compute_capabilities), from
    op_builder/builder.py of its sdist. Returns run(env_value, caps, cuda,
    jit) -> (flags or the list it hands torch, enable_bf16), or (None, None)
    at JIT load for a release that builds for the visible GPUs whatever the
    variable says (before 0.19)."""
    path = os.path.join(CACHE, f"deepspeed-{version}", "op_builder", "builder.py")
    with open(path) as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CUDAOpBuilder")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)
               and n.name in ("compute_capability_args", "filter_ccs")]
    module = [n for n in tree.body
              if (isinstance(n, ast.FunctionDef) and n.name == "get_default_compute_capabilities")
              or (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None)
                  in ("DEFAULT_COMPUTE_CAPABILITIES", "YELLOW", "END", "WARNING"))]
    if len(methods) != 2 or len(module) != 5:
        sys.exit(f"DeepSpeed {version} builder.py: CUDAOpBuilder or its defaults moved")
    jit_reads_list = "_jit_arch_list" in ast.unparse(methods[0])
    if op_filter is not None:
        methods = [m for m in methods if m.name != "filter_ccs"] + [op_filter]
    cls = ast.ClassDef(name="CUDAOpBuilder", bases=[], keywords=[], decorator_list=[],
                       body=methods, type_params=[]) if sys.version_info >= (3, 12) else \
        ast.ClassDef(name="CUDAOpBuilder", bases=[], keywords=[], decorator_list=[], body=methods)
    code = compile(ast.fix_missing_locations(ast.Module(body=[*module, cls], type_ignores=[])),
                   path, "exec")

    def run(env_value, caps, cuda, jit):
        if jit and not jit_reads_list:
            return None, None
        toolkit = cap(cuda or common.NEWEST)
        torch = torch_stub(caps, [], cuda)
        ext = types.ModuleType("torch.utils.cpp_extension")
        ext.CUDA_HOME = "/usr/local/cuda"
        torch.utils = types.SimpleNamespace(cpp_extension=ext)
        ns = {"os": os, "torch": torch, "List": typing.List,
              "installed_cuda_version": lambda name="": toolkit}
        exec(code, ns)
        b = ns["CUDAOpBuilder"]()
        b.name, b.jit_mode = "gpuarch_check", jit
        b.warning = lambda msg: None
        # jit_load() keeps the variable's value for compute_capability_args.
        b._jit_arch_list = (env_value or "").strip() or None
        with Modules({"torch": torch, "torch.utils": torch.utils,
                      "torch.utils.cpp_extension": ext}), \
                Env({"TORCH_CUDA_ARCH_LIST": env_value}):
            flags = b.compute_capability_args()
            # In JIT mode it rewrites the variable and lets torch build from it.
            return (os.environ["TORCH_CUDA_ARCH_LIST"] if jit else flags), b.enable_bf16
    return run


def check_deepspeed(label, torch_list, caps, cuda, builds, run, torch_run):
    """DeepSpeed's op builder on gpuarch's TORCH_CUDA_ARCH_LIST, both ways
    it builds: ahead of time (DS_BUILD_OPS=1 pip install, gencode flags of
    its own) and at JIT load (it rewrites the list, then torch's
    cpp_extension builds from it, here the newest torch paired with the
    toolkit). Each: no exception, only what the toolkit builds, every GPU
    served wherever DeepSpeed's own default serves it, and its bf16 kernels
    (BF16_AVAILABLE) built exactly where every GPU the flags serve has bf16
    and the toolkit has cuda_bf16.h (11.0 on)."""
    if torch_list is None:
        return []
    failures = []
    stub = torch_stub(caps, [], cuda)
    for jit in (False, True):
        mode = "JIT load" if jit else "ahead-of-time build"

        def targets(value):
            out, bf16 = run(value, caps, cuda, jit)
            if out is None:
                return None, None
            return targets_of(torch_run(out, stub) if jit else out), bf16
        try:
            default, _ = targets(None)
            unset_ok = default is not None and not judge_targets("", default, default, caps, cuda,
                                                                 builds, "builds", "")
        except Exception:
            default, unset_ok = [], False
        try:
            ours, bf16 = targets(torch_list)
        except Exception as e:
            failures.append(f"{label}, {mode}: DeepSpeed raised {e!r}")
            tally(unset_ok, False)
            continue
        if ours is None:
            continue  # this release builds for the visible GPUs at JIT load
        found = judge_targets(f"{label}, {mode}", ours, default, caps, cuda, builds,
                              "builds", "DeepSpeed")
        # Its ops run only where the flags do: a GPU the toolkit cannot
        # build for (a V100 under CUDA 13) is not theirs to mind.
        served = [d for d in caps if serves(as_named(d, cuda), ours)]
        want = all(d >= (8, 0) for d in served) and (cuda is None or cap(cuda) >= (11, 0))
        if bf16 != want:
            found.append(f"{label}, {mode}: DeepSpeed's BF16_AVAILABLE is {bf16} for GPUs "
                         f"{served}, where {want} is right")
        tally(unset_ok, not found)
        failures += found
    return failures


def check_deepspeed_ops(label, env, caps, cuda, builds, ops):
    """Each op that keeps only some architectures, built ahead of time
    (DS_BUILD_OPS=1) with gpuarch's env: switched off (DS_BUILD_<OP>=0)
    exactly where its own filter keeps nothing of TORCH_CUDA_ARCH_LIST
    (DeepSpeed then raises and the install fails), and otherwise built
    without an exception, with only what the toolkit builds. Unset, the
    default list builds it (for GPUs that are not these, maybe)."""
    torch_list = env.get("TORCH_CUDA_ARCH_LIST")
    if torch_list is None:
        return []
    failures = []
    for var, run in ops:
        off = env.get(var) == "0"
        try:
            default = targets_of(run(None, caps, cuda, False)[0])
            unset_ok = not [t for t in default if cuda and f"{t[1][0]}.{t[1][1]}" not in builds]
        except Exception:
            unset_ok = False
        try:
            flags, _ = run(torch_list, caps, cuda, False)
            keeps = True
        except RuntimeError as e:
            if "no compute capabilities remaining" not in str(e):
                raise
            flags, keeps = [], False
        found = []
        if off and keeps:
            found.append(f"{label}: {var}=0, but the op builds {flags}")
        if not off and not keeps:
            found.append(f"{label}: {var} not switched off, and the op keeps nothing of "
                         f"{torch_list!r}: DS_BUILD_OPS=1 fails")
        if keeps and not off and cuda is not None:
            found += [f"{label}: {var}: CUDA {cuda} cannot build {k}_{ma}{mi}"
                      for k, (ma, mi), _ in targets_of(flags) if f"{ma}.{mi}" not in builds]
        tally(unset_ok, not found)
        failures += found
    return failures
