"""gpu-check's command line: bundle, and run the parts."""

import argparse
import json
import os
import shutil
import sys
import time

import gpu_check

from gpu_check.bundle import bundle
from gpu_check.common import CHECKS, Host, ROOT, check, smi_gpus
from gpu_check.part1 import part1
from gpu_check.part2 import part2
from gpu_check.part3 import part3
from gpu_check.part4 import part4
from gpu_check.part5 import part5
from gpu_check.part6 import part6
from gpu_check.part7 import part7
from gpu_check.part8 import part8
from gpu_check.part9 import part9


PARTS = {1: part1, 2: part2, 3: part3, 4: part4, 5: part5, 6: part6, 7: part7, 8: part8,
         9: part9}


# The parts that can be rehearsed where there is no GPU.
REHEARSED = {7: part7, 8: part8, 9: part9}


def run(args):
    host = Host(args)
    parts = [int(p) for p in args.parts.split(",")]
    if args.rehearse and not set(parts) <= set(REHEARSED):
        sys.exit("gpu-check: --rehearse goes with parts 7, 8 and 9 alone")
    why = host.missing(driver=not args.rehearse)
    started = time.time()
    for p in parts:
        if why:
            check(f"part{p}", "prerequisites", False, why)
            continue
        if p != 1 and host.gpu is None and not args.rehearse:
            rows, err = smi_gpus(host)
            host.gpu = rows[0] if rows else None
        t0 = time.perf_counter()
        try:
            if args.rehearse:
                REHEARSED[p](host, rehearse=True)
            else:
                PARTS[p](host)
        except Exception as e:  # a broken part is a failed check, the rest still run
            check(f"part{p}", "error", False, f"{type(e).__name__}: {e}")
        print(f"-- part {p}: {time.perf_counter() - t0:.1f} s", flush=True)
    report = {
        "gpu": host.gpu,
        "rehearsal": args.rehearse,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "passed": sum(c["ok"] is True for c in CHECKS),
        "failed": sum(c["ok"] is False for c in CHECKS),
        "skipped": sum(c["ok"] is None for c in CHECKS),
        "checks": CHECKS,
    }
    path = os.path.join(host.out, "gpu-check.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped; "
          f"report: {path}")
    shutil.rmtree(host.tmp, ignore_errors=True)
    if host.run_tmp:
        shutil.rmtree(host.run_tmp, ignore_errors=True)
    return 0 if report["failed"] == 0 else 1


def main():
    ap = argparse.ArgumentParser(prog="gpu-check", description=gpu_check.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bundle")
    b.add_argument("dir", nargs="?", default=os.path.join(ROOT, ".gpu-bundle"))
    r = sub.add_parser("run")
    r.add_argument("--bundle", default=os.path.join(ROOT, ".gpu-bundle"))
    r.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "gpu-check-out"))
    r.add_argument("--parts", default="1,2,3,4,5,6,7,8,9")
    r.add_argument("--rehearse", action="store_true",
                   help="parts 7 and 8 without a GPU: the H100 fixture for NVML; "
                        "torch builds the extensions and Triton compiles, nothing runs "
                        "on a GPU")
    r.add_argument("--python", help="the Python (with torch) of parts 7 and 8: the image's; "
                   "default: this one")
    args = ap.parse_args()
    if args.cmd == "bundle":
        bundle(os.path.abspath(args.dir))
        return 0
    return run(args)
