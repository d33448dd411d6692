"""What every part uses: the report's checks, running a command, and
where things are on the GPU host."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile


# The checkout: scripts/gpu_check/ is two levels down.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BINARIES = ["gpuarchctl", "gpuarchd", "gpuarch-hook", "gpuarch-runtime", "gpuarch-gpu-check"]


# What the .deb ships linked statically (scripts/package).
SHIPPED_STATIC = {"gpuarch-hook", "gpuarch-runtime"}

CHECKS = []


def check(part, name, ok, detail, **data):
    """Record and print one check."""
    CHECKS.append({"part": part, "name": name, "ok": bool(ok), "detail": detail, "data": data})
    print(f"{'PASS' if ok else 'FAIL'} {part} {name}: {detail}", flush=True)
    return ok


def skip(part, name, why):
    """Record and print a check that cannot run here: neither passed nor
    failed."""
    CHECKS.append({"part": part, "name": name, "ok": None, "detail": why, "data": {}})
    print(f"SKIP {part} {name}: {why}", flush=True)


def sh(cmd, env=None, timeout=600, stdin=None, cwd=None):
    """Run cmd, return (rc, stdout, stderr) as text; a missing program is rc 127."""
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           stdin=stdin, cwd=cwd)
        return p.returncode, p.stdout, p.stderr
    except FileNotFoundError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout} s"


class Host:
    """Where things are on the GPU host."""

    def __init__(self, args):
        self.bundle = os.path.abspath(args.bundle)
        bindir = os.path.join(self.bundle, "bin")
        if not os.path.isdir(bindir):
            bindir = os.path.join(ROOT, "target/release")
        self.bin = {b: os.path.join(bindir, b) for b in BINARIES}
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="gpu-check-")
        self.nvml = self.find_lib("libnvidia-ml.so.1")
        self.cuda = next((d for d in ["/usr/local/cuda"] if os.path.isdir(d)), None)
        self.smi = shutil.which("nvidia-smi")
        self.gpu = None  # nvidia-smi's first GPU, once part 1 has read it
        bundled = os.path.join(self.bundle, "runc/runc")
        self.runc = shutil.which("runc") or (bundled if os.access(bundled, os.X_OK) else None)
        # A rehearsal's GPU: the H100 NVML reading kept as a fixture.
        self.rehearsal_inventory = os.path.join(ROOT, "tests/fixtures/h100-real.json")
        # The Python part 7's containers run: the image's.
        self.python = os.path.abspath(args.python) if args.python else sys.executable
        self.want_arch = None
        self.run_tmp = None  # run_scratch's tmpfs directory, once made
        self.plan_env = None

    def cuobjdump(self):
        """cuobjdump: on PATH, in the toolkit, or from NVIDIA's wheel
        (GPUARCH_CUDA_DIR, where scripts/test unpacks it)."""
        found = [shutil.which("cuobjdump")]
        found += [os.path.join(d, "bin/cuobjdump")
                  for d in (self.cuda, os.environ.get("CUDA_HOME")) if d]
        wheels = os.environ.get("GPUARCH_CUDA_DIR") or os.path.join(ROOT, ".local/cuda/nvidia")
        found += sorted(glob.glob(os.path.join(wheels, "*", "bin", "cuobjdump")))
        return next((c for c in found if c and os.access(c, os.X_OK)), None)

    @staticmethod
    def find_lib(name):
        rc, out, _ = sh(["ldconfig", "-p"])
        for line in out.splitlines() if rc == 0 else []:
            if line.strip().startswith(name + " ") and "=>" in line:
                return line.split("=>")[1].strip()
        return None

    def missing(self, driver=True):
        """Why nothing GPU-facing can run here, or None."""
        if driver and not self.smi:
            return "no NVIDIA driver here (nvidia-smi not found)"
        if driver and not self.nvml:
            return "no NVIDIA driver here (libnvidia-ml.so.1 not on the library path)"
        for b, p in self.bin.items():
            if not os.access(p, os.X_OK):
                return f"{b} not found at {p}: run scripts/gpu-check bundle, or cargo build --release"
        return None

    def ctl(self, *args, env=None):
        return sh([self.bin["gpuarchctl"], "--nvml-lib", self.nvml, *args], env=env)

    def gc(self, *args, env=None, timeout=600):
        """gpuarch-gpu-check, its report read back."""
        report = os.path.join(self.tmp, "gc-report.json")
        if os.path.exists(report):
            os.unlink(report)
        rc, out, err = sh([self.bin["gpuarch-gpu-check"], "--report", report, *args],
                          env=env, timeout=timeout)
        checks = json.load(open(report)) if os.path.exists(report) else []
        return rc, checks, err.strip()


def smi_gpus(host):
    fields = "index,uuid,name,compute_cap,pci.bus_id,memory.total,mig.mode.current"
    rc, out, err = sh([host.smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if rc != 0:
        return None, err.strip() or out.strip()
    rows = []
    for line in out.strip().splitlines():
        v = [x.strip() for x in line.split(",")]
        rows.append(dict(zip(fields.split(","), v)))
    return rows, None
