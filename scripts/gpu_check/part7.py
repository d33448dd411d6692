"""Part 7: containers given the JIT cache (torch extensions, Triton, the
driver's PTX JIT)."""

import json
import os

from gpu_check.common import check, sh, skip
from gpu_check.containers import Containers, IMAGE, JIT_IN_CONTAINER
from gpu_check.tools import cuobjdump_targets, software_args


OTHER_IMAGE = "gpu-check/other:1"


def others_can_run(paths):
    """Whether a uid other than root can reach every one of `paths`: every
    directory down to each searchable by others."""
    for p in paths:
        while p != "/":
            if not os.stat(p).st_mode & 0o001:
                return False
            p = os.path.dirname(p)
    return True


def part7(host, rehearse=False):
    """Part 7: two containers of one uid and image share the JIT cache the
    hook gives them; a container of another uid, and one of another image,
    each get their own."""
    what = "containers"
    label = " (rehearsal: no GPU)" if rehearse else ""
    if not host.runc:
        return check(what, "runc", False, "no runc here, and none in the bundle "
                     "(scripts/gpu-check bundle carries one)")
    rc, _, err = sh([host.python, "-c", "import torch.utils.cpp_extension"])
    if rc != 0:
        return check(what, "torch", False, f"{host.python} has no torch: "
                     f"{err.strip().splitlines()[-1] if err.strip() else rc} (a rehearsal "
                     "takes --python from scripts/lib/setup.sh's ensure_torch_image)")
    source = ["--inventory", host.rehearsal_inventory] if rehearse else ["--nvml-lib", host.nvml]
    # The containers' rootfs holds no Python of its own when the hook reads
    # it (the host's software is bound in later): no consumer is there.
    rc, out, err = sh([host.bin["gpuarchctl"], *source, "plan", "--devices", "0",
                       *software_args(host.python), "--json"])
    if rc != 0:
        return check(what, "plan", False, f"gpuarchctl plan: {err.strip()}")
    host.want_arch = json.loads(out)["env"].get("TORCH_CUDA_ARCH_LIST")
    k = Containers(host, rehearse)
    rc, out, _ = sh([host.runc, "--version"])
    runc = f"{out.splitlines()[0]} ({host.runc})" if rc == 0 and out else host.runc
    # Where there is a GPU the kernel must have run right; in a rehearsal it
    # is built and imported, and not run.
    ran_ok = (lambda r: r["ran"] is None) if rehearse else (lambda r: r["ran"] is True)
    a = k.run(0)
    tex = a["env"]["TORCH_EXTENSIONS_DIR"]
    cache_a = a["host_cache"]
    targets, why = cuobjdump_targets(host.cuobjdump(), a["host_so"]) if a["host_so"] \
        else (None, "no build on the host")
    targets = sorted(targets or [])
    a["sass"] = targets
    arch = a["env"]["TORCH_CUDA_ARCH_LIST"] or ""
    want = sorted(f"sm_{c.replace('.', '')}" for c in arch.split(";") if c)
    check(what, "build in a container", ran_ok(a) and tex == f"{JIT_IN_CONTAINER}/torch_extensions"
          and a["host_so"] is not None and arch == host.want_arch and targets == want,
          f"{runc} through gpuarch-runtime, {len(k.devices)} NVIDIA device node(s), GPU "
          f"{a['gpu'] or '(none)'}: the hook set TORCH_CUDA_ARCH_LIST={arch} (wanted "
          f"{host.want_arch}) and TORCH_EXTENSIONS_DIR={tex}; cpp_extension.load passed "
          f"{' '.join(a['arch_flags'])} and built {a['so']} in {a['load_s']:.1f} s, on the "
          f"host at {a['host_so']}, carrying {targets} (cuobjdump{': ' + why if why else ''})"
          + (", imported, not run" if rehearse else f"; the kernel ran right: {a['ran']}")
          + label, result=a, cache=cache_a)
    if not a["host_so"]:
        return None
    mtime = os.stat(a["host_so"]).st_mtime_ns
    b = k.run(0)
    check(what, "reuse by a second container", ran_ok(b) and b["so"] == a["so"]
          and b["host_cache"] == cache_a and os.stat(a["host_so"]).st_mtime_ns == mtime
          and b["load_s"] < a["load_s"],
          f"a second container (same uid, image and GPU) loaded the first one's build in "
          f"{b['load_s']:.2f} s against {a['load_s']:.1f} s, unchanged on the host"
          f" (container start to exit {b['wall_s']:.1f} s against {a['wall_s']:.1f} s)" + label,
          result=b)
    ta, tb = a["triton"] or {}, b["triton"] or {}
    how = (f"compiled ahead of time for sm_{ta.get('compiled_for')}" if rehearse
           else "launched")
    check(what, "Triton's cache reused by a second container",
          ta.get("ok") and tb.get("ok") and ta.get("after", 0) > (ta.get("before") or 0)
          and tb.get("before") == tb.get("after") == ta.get("after")
          and tb.get("s", 1e9) < ta.get("s", 0),
          f"Triton {ta.get('version')} with TRITON_CACHE_DIR={a['env']['TRITON_CACHE_DIR']}, "
          f"a kernel {how}: {ta.get('s', 0):.2f} s in the first container, which left "
          f"{ta.get('after')} file(s) in the cache; {tb.get('s', 0):.2f} s in the second, which "
          f"added none ({tb.get('before')} before, {tb.get('after')} after)"
          + (f": {ta.get('error') or tb.get('error')}" if ta.get("error") or tb.get("error")
             else "") + label,
          first=ta, second=tb)
    # The driver writes its cache as it likes (an index, entries): what the
    # host finds in the cache after each container is the measure.
    name = "the driver's PTX JIT cache reused by a second container"
    if rehearse:
        skip(what, name, "needs a GPU and its driver; not run in a rehearsal")
    else:
        nv_a = a["ptx_files"]
        pa, pb = a["ptx"] or {}, b["ptx"] or {}
        check(what, name,
              pa.get("rc") == 0 and pb.get("rc") == 0 and nv_a > 0 and b["ptx_files"] == nv_a,
              f"CUDA_CACHE_PATH={a['env']['CUDA_CACHE_PATH']}: PTX for compute_80 loaded in "
              f"{pa.get('s', 0) * 1e3:.1f} ms (cuModuleLoadData {pa.get('rc')}) by the first "
              f"container, which left {nv_a} file(s) in the cache; the second loaded it in "
              f"{pb.get('s', 0) * 1e3:.1f} ms (cuModuleLoadData {pb.get('rc')}), "
              f"{b['ptx_files']} file(s) after", first=pa, second=pb)
    # Other tenants: uid 1000 of the same image, where that uid can run the
    # image's Python; uid 0 of another image.
    tenants = [(0, OTHER_IMAGE)]
    if others_can_run(k.python_dirs):
        tenants.insert(0, (1000, IMAGE))
    else:
        print(f"-- no uid-1000 container: {host.python} sits where other users cannot reach "
              f"({', '.join(k.python_dirs)})", flush=True)
    seen = [cache_a]
    for uid, image in tenants:
        c = k.run(uid, image)
        cache_c = c["host_cache"]
        owner = os.stat(c["host_so"]).st_uid if c["host_so"] else None
        kind = "uid" if image == IMAGE else "image"
        check(what, f"another {kind} builds its own", ran_ok(c) and c["uid"] == uid
              and cache_c not in (None, *seen) and owner == uid
              and os.stat(a["host_so"]).st_mtime_ns == mtime and c["load_s"] > b["load_s"],
              f"a container of uid {uid} and image {image} got {cache_c} (uid 0 and {IMAGE}: "
              f"{cache_a}), built its own in {c['load_s']:.1f} s, its file owned by uid "
              f"{owner}; the first build untouched" + label, result=c)
        seen.append(cache_c)
    return None
