"""The bundle the GPU host is given: release binaries as the .deb ships
them, the unit's seccomp programs, a dbus-daemon and runc."""

import os
import re
import shutil
import subprocess
import sys

from gpu_check.common import BINARIES, ROOT, SHIPPED_STATIC


def copy_libs(program, into):
    """Copy the shared libraries `program` links beyond glibc into `into`."""
    ldd = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    for m in re.finditer(r"^\s*(\S+) => (/\S+)", ldd, re.M):
        name, path = m.groups()
        if not re.match(r"lib(c|m|dl|pthread|rt)\.so", name):
            shutil.copy2(path, os.path.join(into, name))


def bundle(out):
    """Release binaries, seccomp programs and a dbus-daemon for the GPU host."""
    # The binaries as the .deb ships them: scripts/package's (gpuarch-hook
    # and gpuarch-runtime static), stripped as cargo deb --strip strips
    # them; and gpuarch-gpu-check, which only this bundle carries.
    subprocess.run([os.path.join(ROOT, "scripts/package"), "--build-only"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--locked", "--quiet", "-p", "gpuarch-gpucheck"],
                   cwd=ROOT, check=True)
    if not shutil.which("strip"):
        sys.exit("bundle: strip not found (apt install binutils)")
    shutil.rmtree(out, ignore_errors=True)
    for d in ["bin", "seccomp", "dbus/lib"]:
        os.makedirs(os.path.join(out, d))
    for b in BINARIES:
        static = os.path.join(ROOT, "target/release/static", b)
        src = static if b in SHIPPED_STATIC else os.path.join(ROOT, "target/release", b)
        subprocess.run(["strip", "-o", os.path.join(out, "bin", b), src], check=True)
    if subprocess.run(["/usr/bin/python3", "-c", "import seccomp"],
                      capture_output=True).returncode != 0:
        sys.exit("bundle: libseccomp's Python module not found (apt install python3-seccomp)")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts/lib/seccomp-bpf.py"),
                    os.path.join(out, "seccomp")], check=True)
    # dbus-daemon and the libraries it links beyond glibc: the GPU host may
    # have no D-Bus at all (a container image).
    daemon = shutil.which("dbus-daemon")
    if not daemon:
        sys.exit("bundle: dbus-daemon not found (apt install dbus-daemon)")
    shutil.copy2(daemon, os.path.join(out, "dbus/dbus-daemon"))
    copy_libs(daemon, os.path.join(out, "dbus/lib"))
    # runc, for part 7 where the GPU host has none, with the libraries it
    # links beyond glibc beside it (RUNPATH $ORIGIN/lib: `runc init` is
    # runc re-executed, without the caller's environment).
    runc = shutil.which("runc")
    if not runc:
        sys.exit("bundle: runc not found (apt install runc)")
    if not shutil.which("patchelf"):
        sys.exit("bundle: patchelf not found (apt install patchelf)")
    os.makedirs(os.path.join(out, "runc/lib"))
    shutil.copy2(runc, os.path.join(out, "runc/runc"))
    copy_libs(runc, os.path.join(out, "runc/lib"))
    subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/lib", os.path.join(out, "runc/runc")],
                   check=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    print(f"{out}: {size / 2**20:.1f} MiB")
