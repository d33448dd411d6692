"""gpuarchd on the GPU host, on a private bus, for parts 5 and 6."""

import os
import shutil
import socket
import subprocess
import time

from gpu_check.common import ROOT, sh


BUS_CONF = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={dir}/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


class Daemon:
    """A private dbus-daemon, and gpuarchd on it with the real NVML."""

    def __init__(self, host, name, kernels=True):
        self.host = host
        self.dir = os.path.join(host.tmp, name)
        os.makedirs(os.path.join(self.dir, "run"))
        open(os.path.join(self.dir, "bus.conf"), "w").write(BUS_CONF.format(dir=self.dir))
        d = self.dir
        cuda = f"[{host.cuda}]" if host.cuda else "[]"
        packages = f"[{ROOT}/kernels/packages]" if kernels else "[]"
        open(os.path.join(d, "config.yaml"), "w").write(
            f"kernels:\n  package_dirs: {packages}\n  cache_dir: {d}/cache\n"
            f"  mount_root: {d}/kernels\n  spool_dir: {d}/spool\n  view_dir: {d}/views\n"
            f"  cuda_dirs: {cuda}\n")
        dbus = os.path.join(host.bundle, "dbus/dbus-daemon")
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(host.bundle, "dbus/lib"))
        if not os.path.exists(dbus):
            dbus, env = shutil.which("dbus-daemon"), None
        self.bus = subprocess.Popen([dbus, f"--config-file={d}/bus.conf", "--nofork",
                                     "--print-address"], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=env, text=True)
        self.address = self.bus.stdout.readline().strip()
        self.notify_path = os.path.join(d, "notify")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.proc = None

    def env(self):
        return dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=self.address)

    def start(self, wrapper=()):
        """Start gpuarchd (under `wrapper`), wait for READY=1: seconds, or None."""
        cmd = [*wrapper, self.host.bin["gpuarchd"], "--nvml-lib", self.host.nvml,
               "--snapshot", os.path.join(self.dir, "run/inventory.json"),
               "--config", os.path.join(self.dir, "config.yaml")]
        env = dict(self.env(), NOTIFY_SOCKET=self.notify_path)
        log = open(os.path.join(self.dir, "daemon.log"), "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stderr=log, stdout=log)
        self.notify.settimeout(0.2)
        while time.perf_counter() - t0 < 20:
            try:
                if b"READY=1" in self.notify.recv(4096):
                    return time.perf_counter() - t0
            except socket.timeout:
                if self.proc.poll() is not None:
                    return None
        return None

    def log(self):
        return open(os.path.join(self.dir, "daemon.log")).read()[-600:]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def close(self):
        self.stop()
        self.bus.terminate()
        self.bus.wait(5)

    def ctl(self, *args):
        return sh([self.host.bin["gpuarchctl"], *args], env=self.env(), timeout=300)

    def rss_mib(self):
        """Resident MiB: total, and its anonymous part (the rest is pages of
        mapped files, such as NVRTC's library, which the kernel can drop)."""
        v = {}
        for line in open(f"/proc/{self.proc.pid}/status"):
            k, _, rest = line.partition(":")
            if k in ("VmRSS", "RssAnon"):
                v[k] = int(rest.split()[0]) / 1024
        return v["VmRSS"], v["RssAnon"]

    def device_fds(self):
        out = set()
        fd_dir = f"/proc/{self.proc.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                t = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if t.startswith("/dev/"):
                out.add(t)
        return sorted(out)
