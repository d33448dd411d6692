"""FlashInfer: `CompilationContext` on FLASHINFER_CUDA_ARCH_LIST, and
FLASHINFER_CUBIN_DIR in every release with a flashinfer-cubin."""

import ast
import logging
import os
import sys
import tempfile
import types

from consumer_check import common
from consumer_check.common import (
    CACHE, Env, FLASHINFER, FLASHINFER_CUBINS, Modules, ROOT, as_named, cap, sass_runs, tally,
)
from consumer_check.torch import torch_stub


def flashinfer_class(cuda, version=FLASHINFER):
    """FlashInfer's own CompilationContext, its CUDA probe answering `cuda`."""
    path = os.path.join(CACHE, f"flashinfer-{version}", "compilation_context.py")
    cpp_ext = types.ModuleType("flashinfer.jit.cpp_ext")

    def at_least(v):
        # A toolkit gpuarch was not told of: the newest of its table.
        return cap(cuda or common.NEWEST) >= cap(v)

    cpp_ext.is_cuda_version_at_least = at_least
    mods = {"flashinfer": types.ModuleType("flashinfer"),
            "flashinfer.jit": types.ModuleType("flashinfer.jit"),
            "flashinfer.jit.cpp_ext": cpp_ext}
    return path, mods


def run_flashinfer(env_value, caps, cuda, version=FLASHINFER):
    path, mods = flashinfer_class(cuda, version)
    with Modules({**mods, "torch": torch_stub(caps, [], cuda)}), \
            Env({"FLASHINFER_CUDA_ARCH_LIST": env_value}):
        ns = {"__name__": "flashinfer.compilation_context"}
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), ns)
        logging.getLogger("flashinfer.compilation_context").setLevel(logging.ERROR)
        ctx = ns["CompilationContext"]()
        return sorted(ctx.TARGET_CUDA_ARCHS)


def fi_serves(device, archs):
    """FlashInfer's (major, "minor+suffix") targets: `a` exact, `f` family."""
    for ma, m in archs:
        suffix = m[-1] if m[-1].isalpha() else ""
        mi = int(m.rstrip("af"))
        if suffix == "a" and (ma, mi) == device:
            return True
        if suffix in ("f", "") and sass_runs((ma, mi), device):
            return True
    return False


def library_root(dist):
    """The directory of a consumer library's wheel that gpuarch serves, as
    core/src/library.rs names it (its `root`)."""
    import re
    text = open(os.path.join(ROOT, "core", "src", "library.rs")).read()
    m = re.search(r'dist: "' + re.escape(dist) + r'",.*?root: "([^"]+)"', text, re.S)
    if not m:
        sys.exit(f"core/src/library.rs names no root for {dist}")
    return m.group(1)


def check_flashinfer_cubin_dir(root):
    """FLASHINFER_CUBIN_DIR in every release gpuarch can serve it to, by
    that release's own `_get_cubin_dir` (flashinfer/jit/env.py, run at
    `import flashinfer`; every reader of cubins goes through its value),
    with its own `flashinfer_cubin` package's `__init__.py` where installed:

    - gpuarch's case (the variable set, no flashinfer-cubin in the image,
      which the hook requires): the directory is the one FlashInfer reads,
      with no exception and no FLASHINFER_DISABLE_VERSION_CHECK;
    - unset, no package: the per-user cache it downloads into (what the
      container would do without gpuarch);
    - its own package installed, of its version: the package's directory,
      which must be the wheel's directory gpuarch serves (core's `root`),
      so the tree is laid out as the package is.
    `root` is the wheel's directory gpuarch serves. Returns (cases,
    failures)."""
    import pathlib
    root = root.rstrip("/")
    cases, failures = 0, []
    for v in FLASHINFER_CUBINS:
        d = os.path.join(CACHE, f"flashinfer-{v}")
        path = os.path.join(d, "env.py")
        tree = ast.parse(open(path).read())
        want = {"FLASHINFER_BASE_DIR", "FLASHINFER_CACHE_DIR", "has_flashinfer_cubin",
                "_get_cubin_dir"}

        def named(n):
            if isinstance(n, ast.FunctionDef):
                return n.name in want
            t = n.target if isinstance(n, ast.AnnAssign) else (
                n.targets[0] if isinstance(n, ast.Assign) else None)
            return getattr(t, "id", None) in want
        body = [n for n in tree.body if named(n)]
        if {getattr(n, "name", None) for n in body} & {"_get_cubin_dir", "has_flashinfer_cubin"} \
                != {"_get_cubin_dir", "has_flashinfer_cubin"}:
            failures.append(f"FlashInfer {v}: env.py has no _get_cubin_dir or has_flashinfer_cubin")
            continue
        code = compile(ast.Module(body=body, type_ignores=[]), path, "exec")
        with tempfile.TemporaryDirectory() as site:
            home = os.path.join(site, "home")
            pkg = os.path.join(site, "site-packages", "flashinfer_cubin")
            served = "/opt/gpuarch/libraries/flashinfer-cubin"

            def run(env, installed):
                """_get_cubin_dir() of release v, or the exception it raised."""
                saved = sys.modules.get("flashinfer_cubin")
                ns = {"os": os, "pathlib": pathlib, "flashinfer_version": v,
                      "__name__": "flashinfer.jit.env"}
                try:
                    with Env({"HOME": home, "FLASHINFER_WORKSPACE_BASE": None,
                              "FLASHINFER_DISABLE_VERSION_CHECK": None, **env}):
                        if installed:
                            m = types.ModuleType("flashinfer_cubin")
                            m.__file__ = os.path.join(pkg, "__init__.py")
                            build_meta = types.ModuleType("flashinfer_cubin._build_meta")
                            build_meta.__version__ = v
                            sys.modules["flashinfer_cubin._build_meta"] = build_meta
                            m.__path__ = [pkg]
                            sys.modules["flashinfer_cubin"] = m
                            src = open(os.path.join(d, "flashinfer_cubin_init.py")).read()
                            exec(compile(src, m.__file__, "exec"), m.__dict__)
                        exec(code, ns)
                        ns["has_flashinfer_cubin"] = lambda: installed
                        return pathlib.Path(ns["_get_cubin_dir"]())
                except Exception as e:
                    return e
                finally:
                    sys.modules.pop("flashinfer_cubin._build_meta", None)
                    if saved is None:
                        sys.modules.pop("flashinfer_cubin", None)
                    else:
                        sys.modules["flashinfer_cubin"] = saved
            ours = run({"FLASHINFER_CUBIN_DIR": served}, False)
            unset = run({"FLASHINFER_CUBIN_DIR": None}, False)
            own = run({"FLASHINFER_CUBIN_DIR": None}, True)
            cases += 3
            if ours != pathlib.Path(served):
                failures.append(f"FlashInfer {v}: with FLASHINFER_CUBIN_DIR={served} it reads {ours!r}")
            if unset != pathlib.Path(home, ".cache", "flashinfer", "cubins"):
                failures.append(f"FlashInfer {v}: unset, it reads {unset!r}, not its cache")
            want_own = pathlib.Path(site, "site-packages", root)
            if own != want_own:
                failures.append(f"FlashInfer {v}: its own flashinfer-cubin is at {own!r}; "
                                f"gpuarch serves {root} of the wheel ({want_own})")
    return cases, failures


def check_flashinfer(label, fi_list, caps, cuda, builds, version=FLASHINFER):
    """The failures of one FlashInfer case (see the module's doc)."""
    failures = []
    try:
        default = run_flashinfer(None, caps, cuda, version)
        unset_ok = True
    except Exception:
        default, unset_ok = [], False
    if cuda is not None:
        unset_ok = unset_ok and all(f"{t[0]}.{t[1].rstrip('af')}" in builds for t in default)
        default = [t for t in default if f"{t[0]}.{t[1].rstrip('af')}" in builds]
    if fi_list is None:
        return failures
    try:
        ours = run_flashinfer(fi_list, caps, cuda, version)
    except Exception as e:
        tally(unset_ok, False)
        return [f"{label}: FlashInfer raised {e!r} (at import)"]
    for ma, m in ours:
        if cuda is not None and f"{ma}.{m.rstrip('af')}" not in builds:
            failures.append(f"{label}: CUDA {cuda} cannot build sm_{ma}{m}")
    for d in caps:
        named = as_named(d, cuda)
        listed = f"{named[0]}.{named[1]}" in {e.rstrip("af") for e in fi_list.split()}
        if listed and not fi_serves(named, ours):
            failures.append(f"{label}: {d} listed, but {ours} does not run there")
        if fi_serves(named, default) and not fi_serves(named, ours):
            failures.append(f"{label}: {d} served by FlashInfer's default {default}, not by gpuarch's {ours}")
    tally(unset_ok, not failures)
    return failures
