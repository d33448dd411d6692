"""Containers through gpuarch-runtime and runc on the GPU host, for parts
7 and 8: the host's root as an image, its probes and what they read."""

import json
import os
import time

from gpu_check.common import sh


# What part 7 reads back from each container's environment.
CONTAINER_VARS = ["TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH",
                  "TRITON_CACHE_DIR"]


# A kernel as PTX alone, for the driver to compile: for a GPU newer than
# sm_80 that is what a library shipped without its SASS runs by.
PTX = r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry gpuarch_twice(.param .u64 p_x, .param .u32 p_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [p_x];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, %f1;
    st.global.f32 [%rd4], %f2;
DONE:
    ret;
}
"""


# Which directory the container was given as its JIT cache, by device and
# inode (a bind mount keeps both), for the host to find it.
CACHE_PY = r"""
def cache():
    try:
        st = os.stat("/var/cache/gpuarch/jit")
        return [st.st_dev, st.st_ino]
    except OSError:
        return None


def files(d):
    # How many files a cache directory holds (None: no such variable).
    return None if d is None else sum(len(f) for _, _, f in os.walk(d))
"""


# Part 7's extension: the same kernel behind a plain pybind11 binding.
# cpp_extension.load builds it as it builds any CUDA extension (nvcc with
# the -gencode flags torch derives from TORCH_CUDA_ARCH_LIST, linked against
# torch), without torch/extension.h, which alone costs nvcc a minute and a
# half on two cores.
PYBIND_CU = r"""
#include <cstdint>
#include <pybind11/pybind11.h>
__global__ void twice(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
static int run(std::uintptr_t x, std::uintptr_t y, int n) {
    twice<<<(n + 255) / 256, 256>>>(reinterpret_cast<const float *>(x),
                                    reinterpret_cast<float *>(y), n);
    return static_cast<int>(cudaDeviceSynchronize());
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""


# What runs in each part-7 container: torch's cpp_extension.load (built into
# TORCH_EXTENSIONS_DIR, or found there), a Triton kernel (TRITON_CACHE_DIR)
# and PTX for the driver (CUDA_CACHE_PATH). Where there is no GPU (a
# rehearsal) the extension is built and imported but not run, the Triton
# kernel is compiled ahead of time for the GPU the hook planned for, and the
# driver is not asked.
PROBE_PY = r"""
import json, os, re, sys, time
CONTAINER_VARS = @VARS@
PTX = @PTX@
@CACHE@
t = time.perf_counter()
from torch.utils import cpp_extension
import torch
m = cpp_extension.load(name="gpuarch_probe", sources=[sys.argv[1]], verbose=False)
load_s = time.perf_counter() - t
gpu = torch.cuda.is_available()
ran = None
if gpu:
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    rc = m.run(x.data_ptr(), y.data_ptr(), x.numel())
    ran = rc == 0 and bool(torch.equal(y, 2 * x))


def triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add1(p, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(p + i, tl.load(p + i, mask=i < n) + 1, mask=i < n)

    d = os.environ.get("TRITON_CACHE_DIR")
    before = files(d)
    t = time.perf_counter()
    if gpu:
        y = torch.zeros(1000, device="cuda")
        add1[(4,)](y, 1000, BLOCK=256)
        torch.cuda.synchronize()
        ok, target = bool((y == 1).all()), None
    else:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        major, minor = re.match(r"(\d+)\.(\d+)", os.environ["TORCH_CUDA_ARCH_LIST"]).groups()
        target = int(major) * 10 + int(minor)
        src = ASTSource(fn=add1, signature={"p": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 256})
        ok = "cubin" in triton.compile(src, target=GPUTarget("cuda", target, 32)).asm
    return {"s": time.perf_counter() - t, "ok": ok, "before": before, "after": files(d),
            "version": triton.__version__, "compiled_for": target}


try:
    tr = triton_kernel()
except Exception as e:
    tr = {"ok": False, "error": f"{type(e).__name__}: {e}"}
ptx = None
if gpu:
    # PTX alone, loaded into torch's context: the driver compiles it, or
    # finds the result in CUDA_CACHE_PATH.
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    mod = ctypes.c_void_p()
    t = time.perf_counter()
    rc = cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX.encode()))
    ptx = {"rc": rc, "s": time.perf_counter() - t}
    if rc == 0:
        cu.cuModuleUnload(mod)
print(json.dumps({"load_s": load_s, "ran": ran, "so": m.__file__,
                  "arch_flags": cpp_extension._get_cuda_arch_flags(),
                  "gpu": torch.cuda.get_device_name(0) if gpu else None, "uid": os.getuid(),
                  "env": {k: os.environ.get(k) for k in CONTAINER_VARS}, "cache": cache(),
                  "triton": tr, "ptx": ptx}))
""".replace("@VARS@", repr(CONTAINER_VARS)).replace("@CACHE@", CACHE_PY).replace("@PTX@", repr(PTX))


# A part-7 container sees every top-level host directory but these,
# read-only: the host's own software (Python, torch, the CUDA toolkit, the
# driver's libraries), wherever it is installed, is the image. /tmp, /run and
# /var are the container's own.
NOT_HOST_DIRS = {"proc", "sys", "dev", "run", "tmp", "var", "boot", "mnt", "media",
                 "lost+found"}


# The host environment a part-7 container is given, as an image's env would
# carry it.
IMAGE_VARS = ["PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VERSION",
              "VIRTUAL_ENV", "PYTHONPATH", "LANG"]

JIT_IN_CONTAINER = "/var/cache/gpuarch/jit"


# The image a CRI runtime would name: the default JIT scope is uid + image.
IMAGE = "gpu-check/host-torch:1"


def nvidia_devices():
    """The host's /dev/nvidia* character devices: (path, major, minor)."""
    found = []
    for d in ["/dev", "/dev/nvidia-caps"]:
        for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            path = os.path.join(d, n)
            if not (n.startswith("nvidia") and os.path.exists(path)):
                continue
            st = os.stat(path)
            if (st.st_mode & 0o170000) == 0o020000:
                found.append((path, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def python_paths(python):
    """The directories `python` runs from: its executable's, its prefix
    (a venv's) and its base prefix, as real paths."""
    rc, out, err = sh([python, "-c", "import os, sys; print(os.path.realpath(sys.executable)); "
                       "print(sys.prefix); print(sys.base_prefix)"])
    if rc != 0:
        raise RuntimeError(f"{python}: {err.strip() or 'does not run'}")
    exe, *prefixes = out.split()
    return [os.path.dirname(exe)] + [os.path.realpath(p) for p in prefixes]


class Containers:
    """runc through gpuarch-runtime, with jit_cache on, in a scratch
    directory: a rootfs that binds the host's software read-only, the
    NVIDIA device nodes passed as an OCI runtime's GPU support passes them,
    and GPU 0 assigned by NVIDIA_VISIBLE_DEVICES."""

    def __init__(self, host, rehearse):
        self.host = host
        self.dir = os.path.join(host.tmp, "containers")
        self.jit = os.path.join(self.dir, "jit")
        self.rootfs = os.path.join(self.dir, "rootfs")
        self.probe = os.path.join(self.dir, "probe")
        for d in [self.rootfs, self.probe]:
            os.makedirs(d)
        # /tmp as an image has it: runc 1.1 gives a tmpfs the mode of the
        # directory it is mounted on, whatever its mode= option says, so
        # a 0755 one (runc's own mkdir) keeps other uids from writing there.
        os.makedirs(os.path.join(self.rootfs, "tmp"))
        os.chmod(os.path.join(self.rootfs, "tmp"), 0o1777)
        open(os.path.join(self.probe, "gpuarch_probe.cu"), "w").write(PYBIND_CU)
        open(os.path.join(self.probe, "probe.py"), "w").write(PROBE_PY)
        self.python = host.python
        self.python_dirs = python_paths(self.python)
        self.runc = host.runc
        self.config = os.path.join(self.dir, "gpuarch.yaml")
        self.log = os.path.join(self.dir, "gpuarch.log")
        open(self.config, "w").write(
            f"jit_cache:\n  enable: true\n  dir: {self.jit}\n"
            f"kernels:\n  mount_root: {self.dir}/kernels\n"
            f"log:\n  to: file\n  file: {self.log}\n"
            f"runtime:\n  path: {self.runc}\n")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("GPUARCH_") and k not in CONTAINER_VARS}
        self.env["GPUARCH_CONFIG"] = self.config
        if rehearse:
            self.env["GPUARCH_INVENTORY"] = host.rehearsal_inventory
        else:
            self.env["GPUARCH_NVML_LIB"] = host.nvml
        # runc needs a cgroup hierarchy; a bare VM may have none mounted.
        self.wrap = []
        if not os.path.ismount("/sys/fs/cgroup"):
            self.wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                         'mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"', "sh"]
        self.devices = nvidia_devices()
        self.n = 0

    def bundle(self, uid, image):
        self.n += 1
        b = os.path.join(self.dir, f"bundle{self.n}")
        os.makedirs(b)
        rc, _, err = sh([self.runc, "spec"], cwd=b)
        if rc != 0:
            raise RuntimeError(f"{self.runc} spec: {err.strip()}")
        c = json.load(open(os.path.join(b, "config.json")))
        c["root"] = {"path": self.rootfs, "readonly": False}
        env = [f"{k}={os.environ[k]}" for k in IMAGE_VARS if k in os.environ]
        env += ["HOME=/tmp", "PYTHONUNBUFFERED=1", "NVIDIA_VISIBLE_DEVICES=0"]
        c["process"].update(terminal=False, cwd="/tmp", env=env,
                            user={"uid": uid, "gid": uid},
                            args=[self.python, "/probe/probe.py", "/probe/gpuarch_probe.cu"])
        mounts = c["mounts"]
        for d in sorted(set(os.listdir("/")) - NOT_HOST_DIRS):
            src = "/" + d
            if os.path.islink(src):
                link = os.path.join(self.rootfs, d)
                if not os.path.lexists(link):
                    os.symlink(os.readlink(src), link)
            elif os.path.isdir(src):
                mounts.append({"destination": src, "type": "bind", "source": src,
                               "options": ["rbind", "ro"]})
        mounts += [{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777"]},
                   {"destination": "/probe", "type": "bind", "source": self.probe,
                    "options": ["bind", "ro"]}]
        # The image's Python where it sits in a directory the container
        # keeps its own (a checkout under /tmp, say).
        for p in dict.fromkeys(self.python_dirs):
            if p.split("/")[1] in NOT_HOST_DIRS:
                mounts.append({"destination": p, "type": "bind", "source": p,
                               "options": ["rbind", "ro"]})
        linux = c["linux"]
        linux["devices"] = [{"path": p, "type": "c", "major": ma, "minor": mi,
                             "fileMode": 0o666, "uid": 0, "gid": 0}
                            for p, ma, mi in self.devices]
        linux.setdefault("resources", {}).setdefault("devices", []).extend(
            {"allow": True, "type": "c", "major": ma, "minor": mi, "access": "rwm"}
            for _, ma, mi in self.devices)
        c["annotations"] = {"io.kubernetes.cri.image-name": image}
        json.dump(c, open(os.path.join(b, "config.json"), "w"))
        return b

    def run(self, uid, image=IMAGE):
        """One container as `uid` of `image`: what PROBE_PY printed, or
        raise with why."""
        b = self.bundle(uid, image)
        cmd = [*self.wrap, self.host.bin["gpuarch-runtime"], "run", "--bundle", b,
               f"gpu-check-{os.getpid()}-{self.n}"]
        t0 = time.perf_counter()
        rc, out, err = sh(cmd, env=self.env, timeout=580)
        wall = time.perf_counter() - t0
        lines = out.strip().splitlines()
        if rc != 0 or not lines:
            log = open(self.log).read()[-400:] if os.path.exists(self.log) else ""
            raise RuntimeError(f"container as uid {uid} exited {rc}: {err.strip()[-800:]} "
                               f"{log.strip()}")
        r = json.loads(lines[-1])
        r["wall_s"] = wall
        r["host_cache"] = self.on_host(r["cache"])
        rel = os.path.relpath(r["so"], JIT_IN_CONTAINER)
        p = r["host_cache"] and os.path.join(r["host_cache"], rel)
        r["host_so"] = p if p and not rel.startswith("..") and os.path.isfile(p) else None
        nv = os.path.relpath(r["env"]["CUDA_CACHE_PATH"] or "/", JIT_IN_CONTAINER)
        nv = r["host_cache"] and not nv.startswith("..") and os.path.join(r["host_cache"], nv)
        r["ptx_files"] = sum(len(f) for _, _, f in os.walk(nv)) if nv else 0
        return r

    def on_host(self, ident):
        """The cache directory under jit/<scope>/<targets>/ that a container
        had as its JIT cache ([st_dev, st_ino]), or None."""
        for scope in sorted(os.listdir(self.jit)) if ident and os.path.isdir(self.jit) else []:
            for targets in sorted(os.listdir(os.path.join(self.jit, scope))):
                p = os.path.join(self.jit, scope, targets)
                st = os.stat(p)
                if [st.st_dev, st.st_ino] == ident:
                    return p
        return None
