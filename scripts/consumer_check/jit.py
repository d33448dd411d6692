"""The JIT caches: where torch, inductor, Triton, FlashInfer and vLLM put
theirs, given gpuarch-hook's env with the JIT cache on."""

import ast
import collections
import json
import logging
import os
import subprocess
import sys
import tempfile
import types

from consumer_check.common import CACHE, Env, FIXTURES, FLASHINFER, Modules, ROOT, TORCH, VLLM, cap
from consumer_check.flashinfer import flashinfer_class
from consumer_check.torch import torch_stub


JIT_DEST = "/var/cache/gpuarch/jit"

JIT_VARS = ["TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
            "CUDA_CACHE_PATH", "FLASHINFER_WORKSPACE_BASE", "VLLM_CACHE_ROOT"]


def run_precreate(spec, env):
    """gpuarch-hook precreate (GPUARCH_HOOK, else the debug build) on the
    OCI config `spec`, with `env` added to this process's: the config it
    wrote, and what it logged. Exits where the hook fails."""
    exe = os.environ.get("GPUARCH_HOOK") or os.path.join(ROOT, "target", "debug", "gpuarch-hook")
    r = subprocess.run([exe, "precreate"], input=json.dumps(spec), capture_output=True,
                       text=True, env=dict(os.environ, **env))
    if r.returncode != 0:
        sys.exit(f"gpuarch-hook precreate: {r.returncode}: {r.stderr}")
    return json.loads(r.stdout), r.stderr


def hook_precreate(fixture, devices, jit_dir, image="torch:test"):
    """The env and JIT mount source gpuarch-hook gives a container."""
    config = os.path.join(os.path.dirname(jit_dir), "hook-config.yaml")
    with open(config, "w") as f:
        f.write(f"jit_cache:\n  enable: true\n  dir: {jit_dir}\n"
                f"log:\n  to: file\n  file: {os.path.join(os.path.dirname(jit_dir), 'hook.log')}\n")
    uid = os.getuid()
    spec = {"ociVersion": "1.2.0", "root": {"path": "rootfs"}, "mounts": [],
            "process": {"args": ["sh"], "env": [f"NVIDIA_VISIBLE_DEVICES={devices}"],
                        "user": {"uid": uid, "gid": os.getgid()}},
            "annotations": {"io.kubernetes.cri.image-name": image}}
    out, _ = run_precreate(spec, dict(GPUARCH_CONFIG=config, GPUARCH_INVENTORY=fixture))
    got = dict(e.split("=", 1) for e in out["process"]["env"])
    mounts = [m for m in out["mounts"] if m["destination"] == JIT_DEST]
    return got, (mounts[0]["source"] if mounts else None)


def torch_build_directory(version):
    """torch's own _get_build_directory (cpp_extension.load's cache)."""
    path = os.path.join(CACHE, f"torch-{version}", "cpp_extension.py")
    tree = ast.parse(open(path).read())
    fn = next(n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "_get_build_directory")
    return compile(ast.Module(body=[fn], type_ignores=[]), path, "exec")


def inductor_cache_dirs():
    """torch._inductor's own cache_dir() and triton_cache_dir()."""
    path = os.path.join(CACHE, f"torch-{TORCH[-1]}", "cache_dir_utils.py")
    tree = ast.parse(open(path).read())
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)
           and n.name in ("cache_dir", "default_cache_dir", "triton_cache_dir")]
    return compile(ast.Module(body=fns, type_ignores=[]), path, "exec")


def flashinfer_workspace(cuda):
    """FlashInfer's own workspace directory (jit/env.py), built at import."""
    path = os.path.join(CACHE, f"flashinfer-{FLASHINFER}", "env.py")
    tree = ast.parse(open(path).read())
    want = {"FLASHINFER_BASE_DIR", "FLASHINFER_CACHE_DIR", "FLASHINFER_WORKSPACE_DIR",
            "FLASHINFER_JIT_DIR", "_get_workspace_dir_name"}

    def named(n):
        if isinstance(n, ast.FunctionDef):
            return n.name in want
        t = n.target if isinstance(n, ast.AnnAssign) else (
            n.targets[0] if isinstance(n, ast.Assign) else None)
        return getattr(t, "id", None) in want
    return compile(ast.Module(body=[n for n in tree.body if named(n)], type_ignores=[]),
                   path, "exec")


def vllm_cache_root():
    """vLLM's own reading of VLLM_CACHE_ROOT (its envs.py entry and
    get_default_cache_root), under which it keeps its torch.compile cache
    (vllm/compilation/backends.py: <root>/torch_compile_cache/<hash>)."""
    path = os.path.join(CACHE, f"vllm-{VLLM}", "envs.py")
    tree = ast.parse(open(path).read())
    fn = next(n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "get_default_cache_root")
    table = next(n for n in tree.body if isinstance(n, ast.AnnAssign)
                 and getattr(n.target, "id", None) == "environment_variables")
    entry = next(v for k, v in zip(table.value.keys, table.value.values)
                 if isinstance(k, ast.Constant) and k.value == "VLLM_CACHE_ROOT")
    read = ast.Assign(targets=[ast.Name(id="VLLM_CACHE_ROOT", ctx=ast.Store())], value=entry)
    code = compile(ast.fix_missing_locations(ast.Module(body=[fn, read], type_ignores=[])),
                   path, "exec")

    def run():
        ns = {"os": os}
        exec(code, ns)
        return ns["VLLM_CACHE_ROOT"]()
    return run


def check_jit():
    """Each consumer keeps its cache inside the mounted cache, and the cache
    differs where the GPUs' targets do. Returns (cases, failures, notes)."""
    cases, failures = 0, []
    torch_codes = {v: torch_build_directory(v) for v in TORCH}
    inductor = inductor_cache_dirs()
    vllm = vllm_cache_root()
    torch_mod = types.SimpleNamespace(version=types.SimpleNamespace(cuda="12.8", hip=None))
    work = tempfile.mkdtemp()
    jit_dir = os.path.join(work, "jit")
    default_root = os.path.join(work, "home-cache")
    defaults = {}
    for fixture in FIXTURES:
        snap = json.load(open(fixture))
        n = len(snap["devices"])
        subsets = [[i] for i in range(n)] + ([list(range(n))] if n > 1 else [])
        sources = {}
        for subset in subsets:
            devices = ",".join(map(str, subset))
            where = f"{os.path.basename(fixture)} GPUs {subset}"
            env, source = hook_precreate(fixture, devices, jit_dir)
            cases += 1
            if source is None:
                failures.append(f"{where}: no JIT cache mounted")
                continue
            sources[devices] = source
            missing = [v for v in JIT_VARS if not env.get(v, "").startswith(JIT_DEST + "/")]
            if missing:
                failures.append(f"{where}: {missing} not under {JIT_DEST}: {env}")
                continue
            # Inside the container JIT_DEST is `source`.
            seen = {k: env[k].replace(JIT_DEST, source, 1) for k in JIT_VARS}
            seen["FLASHINFER_CUDA_ARCH_LIST"] = env.get("FLASHINFER_CUDA_ARCH_LIST")
            with Env(seen):
                for version, code in torch_codes.items():
                    cases += 1
                    ns = {"os": os, "sys": sys, "torch": torch_mod,
                          "logger": logging.getLogger("torch-ext"),
                          "get_default_build_root": lambda: default_root}
                    exec(code, ns)
                    d = ns["_get_build_directory"]("ext", False)
                    if not d.startswith(source + "/"):
                        failures.append(f"{where}, torch {version}: extensions built in {d}")
                cases += 1
                ns = {"os": os, "re": __import__("re"), "getpass": __import__("getpass"),
                      "tempfile": tempfile, "is_fbcode": lambda: False}
                exec(inductor, ns)
                for d in (ns["cache_dir"](), ns["triton_cache_dir"](0)):
                    if not d.startswith(source + "/"):
                        failures.append(f"{where}, torch {TORCH[-1]} inductor: cache in {d}")
                cases += 1
                d = vllm()
                if not d.startswith(source + "/"):
                    failures.append(f"{where}, vLLM {VLLM}: cache root {d}")
                cases += 1
                ws = flashinfer_workspace(None)
                path, mods = flashinfer_class(None)
                gpus = [cap(snap["devices"][i]["compute_capability"]) for i in subset]
                with Modules({**mods, "torch": torch_stub(gpus, [], None)}):
                    cc = {"__name__": "flashinfer.compilation_context"}
                    exec(compile(open(path).read(), path, "exec"), cc)
                    logging.getLogger("flashinfer.compilation_context").setLevel(logging.ERROR)
                    ns = {"os": os, "pathlib": __import__("pathlib"),
                          "CompilationContext": cc["CompilationContext"],
                          "flashinfer_version": FLASHINFER}
                    if seen["FLASHINFER_CUDA_ARCH_LIST"]:
                        exec(ws, ns)
                        d = str(ns["FLASHINFER_JIT_DIR"])
                        if not d.startswith(source + "/"):
                            failures.append(f"{where}, FlashInfer {FLASHINFER}: JIT dir {d}")
        # GPUs with other targets never share a cache.
        by_source = collections.defaultdict(list)
        for devices, source in sources.items():
            by_source[source].append(devices)
        caps_of = {d: sorted({snap["devices"][int(i)]["compute_capability"]
                              for i in d.split(",")}) for d in sources}
        for source, ds in by_source.items():
            if len({tuple(caps_of[d]) for d in ds}) > 1:
                failures.append(f"{os.path.basename(fixture)}: GPUs {ds} share {source}")
    # The control: without TORCH_EXTENSIONS_DIR, torch's directory for an
    # extension is the same whatever the GPU (it names Python and CUDA only).
    with Env({"TORCH_EXTENSIONS_DIR": None}):
        ns = {"os": os, "sys": sys, "torch": torch_mod, "logger": logging.getLogger("x"),
              "get_default_build_root": lambda: default_root}
        exec(torch_codes[TORCH[-1]], ns)
        defaults = {ns["_get_build_directory"]("ext", False)}
    note = (f"without gpuarch, torch {TORCH[-1]} builds extension 'ext' in "
            f"{defaults.pop().replace(default_root, '~/.cache/torch_extensions')} on every GPU")
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return cases, failures, note
