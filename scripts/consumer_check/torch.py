"""torch: `_get_cuda_arch_flags` of each pinned release run on gpuarch's
TORCH_CUDA_ARCH_LIST, against what unset would build."""

import ast
import collections
import logging
import os
import types
import typing

from consumer_check.common import (
    CACHE, TEGRA, as_named, cap, sass_runs, serves, tally, targets_of,
)


class FakeCuda:
    """torch.cuda as the container's torch would answer it."""

    def __init__(self, caps, arch_list):
        self.caps, self.arch_list = caps, arch_list

    def device_count(self):
        return len(self.caps)

    def get_device_capability(self, i):
        return self.caps[i]

    def get_arch_list(self):
        return self.arch_list

    def is_available(self):
        return True


# The SASS each torch release's own wheels carry, over all of its CUDA builds
# (x86_64 and aarch64), from the first release with that list: pytorch's
# .ci/manywheel/build_cuda.sh. No PTX that a newer major could JIT-compile:
# on a GPU of a major none has, torch's own kernels do not run, set or unset
# ("no kernel image is available": pytorch/pytorch#150733, #167244).
TORCH_WHEELS = [((2, 4), ["3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"]),
                ((2, 7), ["3.7", "5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]),
                ((2, 9), ["5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "11.0", "12.0"])]


def torch_runs(version, caps, cuda, supported):
    """Whether torch `version`'s own kernels run on every GPU: its wheels
    have SASS for it. An integrated (Tegra) GPU runs no desktop SASS;
    torch there is NVIDIA's build for the chip (JetPack's wheels), with
    its own SASS, of a release whose `supported` names take the chip's."""
    v = tuple(int(x) for x in version.split(".")[:2])
    sass = [a for since, a in TORCH_WHEELS if since <= v][-1]
    targets = [("sm", cap(a), "") for a in sass]

    def runs(named):
        if named in TEGRA:
            return f"{named[0]}.{named[1]}" in supported
        return serves(named, targets)
    return all(runs(as_named(d, cuda)) for d in caps)


def torch_stub(caps, arch_list, cuda):
    t = types.ModuleType("torch")
    t.cuda = FakeCuda(caps, arch_list)
    t.distributed = types.SimpleNamespace(is_available=lambda: False)
    t.version = types.SimpleNamespace(cuda=cuda)
    return t


def torch_function(version):
    """torch's own _get_cuda_arch_flags and supported_arches, from its file."""
    path = os.path.join(CACHE, f"torch-{version}", "cpp_extension.py")
    with open(path) as f:
        src = f.read()
    tree = ast.parse(src)
    fn = next(n for n in tree.body
              if isinstance(n, ast.FunctionDef) and n.name == "_get_cuda_arch_flags")
    supported = None
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "supported_arches":
            supported = ast.literal_eval(node.value)
    code = compile(ast.Module(body=[fn], type_ignores=[]), path, "exec")

    def run(env_value, torch):
        ns = {"os": os, "re": __import__("re"), "collections": collections,
              "torch": torch, "logger": logging.getLogger("torch-ext"),
              **{k: getattr(typing, k) for k in ("List", "Optional", "Dict", "Tuple")}}
        exec(code, ns)
        old = os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        try:
            if env_value is not None:
                os.environ["TORCH_CUDA_ARCH_LIST"] = env_value
            return ns["_get_cuda_arch_flags"]()
        finally:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            if old is not None:
                os.environ["TORCH_CUDA_ARCH_LIST"] = old

    return run, supported


TORCH_CANNOT_RUN = collections.Counter()
# Cases where torch, given gpuarch's list, builds for a GPU older code (PTX,
# or SASS of an older minor) than unset, by the GPU's major: each a failure.
TORCH_LESS_NATIVE = collections.Counter()


def native(device, targets):
    """The newest SASS of `targets` that runs on `device`: its major, a
    minor no newer (arch-specific: exactly its own), and never across
    desktop and Tegra but its very own; None if none."""
    def runs(ma, mi, suffix):
        return (ma, mi) == device if suffix == "a" else sass_runs((ma, mi), device)
    return max(((ma, mi) for kind, (ma, mi), suffix in targets
                if kind == "sm" and runs(ma, mi, suffix)), default=None)


def less_native(ours, default, caps, cuda, builds):
    """The GPUs for which `ours` holds older code than `default` (what
    the toolkit builds of it): no SASS, or SASS of an older minor."""
    if cuda is not None:
        default = [t for t in default if f"{t[1][0]}.{t[1][1]}" in builds]
    out = []
    for d in caps:
        named = as_named(d, cuda)
        theirs, mine = native(named, default), native(named, ours)
        if theirs is not None and (mine is None or mine < theirs):
            out.append(d)
    return out


def check_torch(label, torch_list, caps, cuda, builds, run, supported, version=None):
    """The failures of one torch case (see the module's doc). Where
    `version`'s own kernels do not run on the GPUs, it fails unset as set:
    the case is counted, never a failure. Older code than unset for a GPU
    (PTX, or SASS of an older minor) is a failure too."""
    failures = []
    if version is not None and not torch_runs(version, caps, cuda, supported):
        TORCH_CANNOT_RUN[version] += 1
        tally(False, False)
        return failures
    # What a torch built with this toolkit was built for.
    built = sorted(builds & set(supported), key=cap) if cuda else \
        [a for a in supported if a[-1].isdigit()]
    stub = torch_stub(caps, [f"sm_{a.replace('.', '')}" for a in built], cuda)
    try:
        default = targets_of(run(None, stub))
        unset_ok = not judge_targets("", default, default, caps, cuda, builds, "", "")
    except Exception:
        default, unset_ok = [], False
    if torch_list is None:
        return failures  # unset: torch's default is what runs
    try:
        ours = targets_of(run(torch_list, stub))
    except Exception as e:
        tally(unset_ok, False)
        return [f"{label}: torch raised {e!r}"]
    failures = judge_targets(label, ours, default, caps, cuda, builds, "asks for", "torch")
    tally(unset_ok, not failures)
    if unset_ok and not failures:
        for d in less_native(ours, default, caps, cuda, builds):
            TORCH_LESS_NATIVE[d[0]] += 1
            failures.append(f"{label}: torch builds older code for {d} than unset ({default})")
    return failures


def judge_targets(label, ours, default, caps, cuda, builds, does, whose):
    """What is wrong with the gencode targets `ours`: one the toolkit cannot
    build, or a GPU that the consumer's own `default` serves with what the
    toolkit builds (nvcc fails on the rest) and `ours` does not."""
    failures = []
    if cuda is not None:
        default = [t for t in default if f"{t[1][0]}.{t[1][1]}" in builds]
    for kind, (ma, mi), suffix in ours:
        if cuda is not None and f"{ma}.{mi}" not in builds:
            failures.append(f"{label}: CUDA {cuda} cannot build {kind}_{ma}{mi}{suffix}")
    for d in caps:
        named = as_named(d, cuda)
        if not serves(named, ours) and (cuda is None or serves(named, default)):
            failures.append(f"{label}: nothing it {does} runs on {d} ({whose}'s default: {default})")
    return failures
