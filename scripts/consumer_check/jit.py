"""The JIT caches: where torch, inductor, Triton, FlashInfer and vLLM put
theirs, given gpuarch-hook's env with the JIT cache on."""

import ast
import collections
import getpass
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import types

from consumer_check.common import (
    CACHE, Env, FIXTURES, FLASHINFERS, Modules, ROOT, TORCH, TRITONS, VLLMS, cap,
)
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


def functions_of(path, names):
    """The top-level functions `names` of the Python file at `path`."""
    tree = ast.parse(open(path).read())
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    return compile(ast.Module(body=fns, type_ignores=[]), path, "exec")


def torch_build_directory(version):
    """torch's own _get_build_directory (cpp_extension.load's cache)."""
    return functions_of(os.path.join(CACHE, f"torch-{version}", "cpp_extension.py"),
                        ("_get_build_directory",))


def inductor_cache_dirs(version):
    """torch `version`'s inductor, by its own code: a function giving its
    cache directory and the directory its Triton kernels compile into.
    From 2.6 both are cache_dir_utils.py's; before, cache_dir() is in
    runtime_utils.py and the autotuner sets TRITON_CACHE_DIR where it is
    unset (the `if` in CachingAutotuner.__init__, triton_heuristics.py)."""
    base = os.path.join(CACHE, f"torch-{version}", "inductor", "torch", "_inductor", "runtime")
    utils = os.path.join(base, "cache_dir_utils.py")
    helpers = {"os": os, "re": re, "getpass": getpass, "tempfile": tempfile,
            "is_fbcode": lambda: False}
    if os.path.isfile(utils):
        code = functions_of(utils, ("cache_dir", "default_cache_dir", "triton_cache_dir"))

        def run():
            ns = dict(helpers)
            exec(code, ns)
            return ns["cache_dir"](), ns["triton_cache_dir"](0)
        return run
    code = functions_of(os.path.join(base, "runtime_utils.py"), ("cache_dir",))
    path = os.path.join(base, "triton_heuristics.py")
    sets = [n for n in ast.walk(ast.parse(open(path).read()))
            if isinstance(n, ast.If) and "TRITON_CACHE_DIR" in ast.unparse(n.test)]
    if len(sets) != 1:
        sys.exit(f"torch {version}: {len(sets)} places set TRITON_CACHE_DIR in {path}")
    autotuner = compile(ast.Module(body=sets, type_ignores=[]), path, "exec")

    def run():
        ns = dict(helpers)
        exec(code, ns)
        with Env({"TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR")}):
            exec(autotuner, {"os": os, "cache_dir": ns["cache_dir"],
                             "self": types.SimpleNamespace(triton_meta={"device": 0})})
            return ns["cache_dir"](), os.environ["TRITON_CACHE_DIR"]
    return run


# A kernel's key as Triton's compiler makes one: a SHA-256 in hex.
KERNEL_KEY = __import__("hashlib").sha256(b"kernel").hexdigest()


def libtriton():
    """Stands in for the two functions Triton's knobs.py takes from its C++
    part: they read the process's environment (held to the real libtriton
    by libtriton_held_to, in every run of the check)."""
    lib = types.ModuleType("triton._C.libtriton")
    lib.getenv = lambda key, default=None: os.environ.get(key, default)
    lib.getenv_bool = lambda key, default=None: (
        default if key not in os.environ
        else os.environ[key].lower() in ("1", "true", "on", "yes"))
    return lib


def libtriton_held_to(python):
    """The stand-in's readings of the env against those of the real
    libtriton that `python` imports (the torch image's: scripts/test
    installs it before this check), on set, empty and unset values and
    the spellings of a boolean: a line for each that differs, and the real
    Triton's version."""
    values = [None, "", "1", "0", "true", "ON", "yes", "no", "x", " /a b "]
    probe = ("import json, os, sys, triton\n"
             "from triton._C.libtriton import getenv, getenv_bool\n"
             "out = []\n"
             "for v in json.load(sys.stdin):\n"
             "    os.environ.pop('GPUARCH_PROBE', None)\n"
             "    if v is not None:\n"
             "        os.environ['GPUARCH_PROBE'] = v\n"
             "    out.append([getenv('GPUARCH_PROBE'), getenv('GPUARCH_PROBE', 'd'),\n"
             "                getenv_bool('GPUARCH_PROBE', None), getenv_bool('GPUARCH_PROBE', True)])\n"
             "print(json.dumps([triton.__version__, out]))\n")
    r = subprocess.run([python, "-c", probe], input=json.dumps(values), capture_output=True,
                       text=True)
    if r.returncode != 0:
        return [f"the real libtriton ({python}) could not be asked: {r.stderr.strip()}"], None
    version, real = json.loads(r.stdout)
    lib, differ = libtriton(), []
    for v, want in zip(values, real):
        with Env({"GPUARCH_PROBE": v}):
            got = [lib.getenv("GPUARCH_PROBE"), lib.getenv("GPUARCH_PROBE", "d"),
                   lib.getenv_bool("GPUARCH_PROBE", None), lib.getenv_bool("GPUARCH_PROBE", True)]
        if got != want:
            differ.append(f"libtriton's stand-in reads {v!r} as {got}, Triton {version}'s as {want}")
    return differ, version


def triton_cache(version):
    """Triton `version`'s own get_cache_manager (runtime/cache.py, and
    knobs.py from 3.4), loaded from its wheel's files: a function giving the
    directory a kernel of a given key is kept in."""
    base = os.path.join(CACHE, f"triton-{version}", "triton")
    pkg = types.ModuleType("triton")
    pkg.__path__, pkg.__version__ = [base], version
    c = types.ModuleType("triton._C")
    c.__path__ = []
    runtime = types.ModuleType("triton.runtime")
    runtime.__path__ = [os.path.join(base, "runtime")]
    mods = {"triton": pkg, "triton._C": c, "triton._C.libtriton": libtriton(),
            "triton.runtime": runtime}
    with Modules(mods):
        try:
            if os.path.isfile(os.path.join(base, "knobs.py")):
                pkg.knobs = importlib.import_module("triton.knobs")
            cache = importlib.import_module("triton.runtime.cache")
        finally:
            for k in [k for k in sys.modules if k.startswith("triton.") and k not in mods]:
                del sys.modules[k]
    return lambda key: cache.get_cache_manager(key).cache_dir


def flashinfer_jit_dir(version):
    """FlashInfer `version`'s own JIT directory (jit/env.py, built at
    import, its CompilationContext asking torch for the GPUs): a function
    giving it for a process on `gpus`."""
    path = os.path.join(CACHE, f"flashinfer-{version}", "env.py")
    tree = ast.parse(open(path).read())
    want = {"FLASHINFER_BASE_DIR", "FLASHINFER_CACHE_DIR", "FLASHINFER_WORKSPACE_DIR",
            "FLASHINFER_JIT_DIR", "_get_workspace_dir_name"}

    def named(n):
        if isinstance(n, ast.FunctionDef):
            return n.name in want
        t = n.target if isinstance(n, ast.AnnAssign) else (
            n.targets[0] if isinstance(n, ast.Assign) else None)
        return getattr(t, "id", None) in want
    workspace = compile(ast.Module(body=[n for n in tree.body if named(n)], type_ignores=[]),
                        path, "exec")
    context, mods = flashinfer_class(None, version)
    context = compile(open(context).read(), context, "exec")

    def run(gpus):
        with Modules({**mods, "torch": torch_stub(gpus, [], None)}):
            cc = {"__name__": "flashinfer.compilation_context"}
            exec(context, cc)
            logging.getLogger("flashinfer.compilation_context").setLevel(logging.ERROR)
            ns = {"os": os, "pathlib": __import__("pathlib"),
                  "CompilationContext": cc["CompilationContext"], "flashinfer_version": version}
            exec(workspace, ns)
            return str(ns["FLASHINFER_JIT_DIR"])
    return run


def vllm_cache_root(version):
    """vLLM `version`'s own reading of VLLM_CACHE_ROOT (its envs.py entry
    and get_default_cache_root), under which it keeps its torch.compile
    cache (vllm/compilation/backends.py: <root>/torch_compile_cache/<hash>)."""
    path = os.path.join(CACHE, f"vllm-{version}", "envs.py")
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
    failures = []
    torch_codes = {v: torch_build_directory(v) for v in TORCH}
    inductors = {v: inductor_cache_dirs(v) for v in TORCH}
    tritons = {v: triton_cache(v) for v in TRITONS}
    vllms = {v: vllm_cache_root(v) for v in VLLMS}
    flashinfers = {v: flashinfer_jit_dir(v) for v in FLASHINFERS}
    torch_mod = types.SimpleNamespace(version=types.SimpleNamespace(cuda="12.8", hip=None))
    work = tempfile.mkdtemp()
    jit_dir = os.path.join(work, "jit")
    default_root = os.path.join(work, "home-cache")

    def where_they_keep(gpus, flashinfer):
        """(consumer and release, the directory it keeps its cache in) for
        each release of each window, under this process's environment."""
        for version, code in torch_codes.items():
            ns = {"os": os, "sys": sys, "torch": torch_mod,
                  "logger": logging.getLogger("torch-ext"),
                  "get_default_build_root": lambda: default_root}
            exec(code, ns)
            yield f"torch {version}: extensions", ns["_get_build_directory"]("ext", False)
        for version, dirs in inductors.items():
            for d in dirs():
                yield f"torch {version} inductor", d
        for version, cache in tritons.items():
            yield f"Triton {version}: kernels", cache(KERNEL_KEY)
        for version, root in vllms.items():
            yield f"vLLM {version}: cache root", root()
        if flashinfer:
            for version, jit_dir_on in flashinfers.items():
                yield f"FlashInfer {version}: JIT dir", jit_dir_on(gpus)

    cases = 0
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
            gpus = [cap(snap["devices"][i]["compute_capability"]) for i in subset]
            with Env(seen):
                for what, d in where_they_keep(gpus, seen["FLASHINFER_CUDA_ARCH_LIST"]):
                    cases += 1
                    if not d.startswith(source + "/"):
                        failures.append(f"{where}, {what} in {d}")
        # GPUs with other targets never share a cache.
        by_source = collections.defaultdict(list)
        for devices, source in sources.items():
            by_source[source].append(devices)
        caps_of = {d: sorted({snap["devices"][int(i)]["compute_capability"]
                              for i in d.split(",")}) for d in sources}
        for source, ds in by_source.items():
            if len({tuple(caps_of[d]) for d in ds}) > 1:
                failures.append(f"{os.path.basename(fixture)}: GPUs {ds} share {source}")
    # The control: without gpuarch's env each release keeps its cache
    # elsewhere (so the check above can fail), the same whatever the GPU.
    # In a home and a temporary directory of the check's own, as some
    # create theirs (TRITON_HOME, as Triton 3.3 and later read HOME at
    # import).
    home = os.path.join(work, "home")
    unset = {**{v: None for v in JIT_VARS}, "FLASHINFER_CUDA_ARCH_LIST": None,
             "XDG_CACHE_HOME": None, "HOME": home, "TRITON_HOME": home}
    saved_tmp, tempfile.tempdir = tempfile.tempdir, os.path.join(work, "tmp")
    os.makedirs(tempfile.tempdir)
    try:
        with Env(unset):
            defaults = {what: d for what, d in where_they_keep([(8, 6)], True)}
    finally:
        tempfile.tempdir = saved_tmp
    for what, d in defaults.items():
        if d.startswith(jit_dir + "/"):
            failures.append(f"control: {what} in {d} without gpuarch's env")
    # The stand-in for libtriton, held to the real one.
    python = os.environ.get("GPUARCH_TORCH_PYTHON") or os.path.join(
        ROOT, ".local", "torch-image", "bin", "python")
    if os.path.isfile(python):
        differ, real = libtriton_held_to(python)
        failures += differ
        held = f"libtriton's stand-in reads the env as Triton {real}'s does"
    elif os.environ.get("CI") == "true":
        failures.append(f"no torch image to hold libtriton's stand-in to: {python} "
                        "(scripts/lib/setup.sh, ensure_torch_image)")
        held = ""
    else:
        held = f"libtriton's stand-in NOT held to a real one: no {python}"
    note = held + ("; " if held else "") + (
            f"without gpuarch, torch {TORCH[-1]} builds extension 'ext' in "
            f"{defaults[f'torch {TORCH[-1]}: extensions'].replace(default_root, '~/.cache/torch_extensions')}, "
            f"and Triton {TRITONS[-1]} keeps a kernel in "
            f"{defaults[f'Triton {TRITONS[-1]}: kernels'].replace(home, '~')}, on every GPU")
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return cases, failures, note
