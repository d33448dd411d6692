#!/usr/bin/python3
"""Write gpuarchd.service's seccomp sandbox as classic BPF programs, for
`gpuarch-gpu-check sandbox --bpf` on hosts where systemd cannot apply it.

  seccomp-bpf.py OUTDIR

- OUTDIR/system-service.bpf: SystemCallFilter=@system-service with
  SystemCallErrorNumber=EPERM and SystemCallArchitectures=native. The
  group is expanded by this machine's `systemd-analyze syscall-filter`,
  so it is systemd's own list, nested groups included.
- OUTDIR/mdwe.bpf: MemoryDenyWriteExecute=yes as systemd before 256
  installs it: mmap with PROT_WRITE|PROT_EXEC, mprotect and pkey_mprotect
  adding PROT_EXEC, and shmat with SHM_EXEC fail with EPERM.

Needs python3-seccomp (libseccomp's bindings) and systemd-analyze; run it
with Debian's /usr/bin/python3.
"""
import errno
import mmap
import subprocess
import sys

import seccomp


def group(name, seen):
    """Syscall names in a systemd group, nested groups expanded."""
    out = subprocess.run(["systemd-analyze", "syscall-filter", name],
                         check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if word.startswith("@"):
            if word not in seen:
                seen.add(word)
                names |= group(word, seen)
        else:
            names.add(word)
    return names


def export(f, path):
    with open(path, "wb") as fh:
        f.export_bpf(fh)


def main():
    out = sys.argv[1]
    allow = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    known = 0
    for name in sorted(group("@system-service", {"@system-service"})):
        try:
            allow.add_rule(seccomp.ALLOW, name)
            known += 1
        except (RuntimeError, ValueError):
            pass  # not a syscall of this architecture (arm_fadvise64_64...)
    export(allow, f"{out}/system-service.bpf")

    mdwe = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    wx = mmap.PROT_WRITE | mmap.PROT_EXEC
    mdwe.add_rule(deny, "mmap", seccomp.Arg(2, seccomp.MASKED_EQ, wx, wx))
    for call in ("mprotect", "pkey_mprotect"):
        mdwe.add_rule(deny, call,
                      seccomp.Arg(2, seccomp.MASKED_EQ, mmap.PROT_EXEC, mmap.PROT_EXEC))
    shm_exec = 0o100000
    mdwe.add_rule(deny, "shmat", seccomp.Arg(2, seccomp.MASKED_EQ, shm_exec, shm_exec))
    export(mdwe, f"{out}/mdwe.bpf")
    print(f"{out}: system-service.bpf ({known} syscalls allowed), mdwe.bpf")


if __name__ == "__main__":
    main()
