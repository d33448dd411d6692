"""The matrix: every fixture, GPU subset and toolkit, each consumer's
check, and the summary."""

import collections
import json
import os
import sys
import tempfile

from consumer_check import common
from consumer_check.accelerate import accelerate_precision, check_accelerate
from consumer_check.common import (
    ACCELERATE, ACCELERATES, DEEPSPEED, DEEPSPEEDS, FIXTURES, FLASHINFERS,
    FLASHINFER_CUBINS, FLASH_ATTN, FLASH_ATTNS, OUTCOMES, TORCH, TRITONS, VLLMS, XFORMERS, cap,
    ctl, targets_of,
)
from consumer_check.deepspeed import (
    check_deepspeed, check_deepspeed_ops, deepspeed_builder, deepspeed_ops,
)
from consumer_check.flash_attn import check_flash_attn, flash_attn_gencodes
from consumer_check.flashinfer import check_flashinfer, check_flashinfer_cubin_dir, library_root
from consumer_check.image_aware import check_image_aware, slow_reads
from consumer_check.jit import check_jit
from consumer_check.nvrtc import nvrtc_check
from consumer_check.torch import (
    TORCH_CANNOT_RUN, TORCH_LESS_NATIVE, check_torch, torch_function, torch_runs,
)
from consumer_check.wheels import fetch, newer_than_the_window
from consumer_check.xformers import check_xformers, xformers_fa3


def majors_inventory(caps):
    """A snapshot of one GPU of each capability in `caps`."""
    return {"schema": 1, "source": "consumers", "generated_at": "2026-11-25T00:00:00Z",
            "driver_version": "580.95.05", "cuda_driver_version": "13.0",
            "devices": [{"index": i, "minor": i, "uuid": f"GPU-major-{i}", "name": f"sm_{c}",
                         "compute_capability": c, "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
                         "memory_bytes": 1 << 34, "mig": []} for i, c in enumerate(caps)]}


def plan(fixture, devices, cuda, software=(), env=()):
    args = ["plan", "--inventory", fixture, "--devices", devices, "--json"]
    if cuda is not None:
        args += ["-e", f"CUDA_VERSION={cuda}.0"]
    for e in env:
        args += ["-e", e]
    for s in software:
        args += ["--software", s]
    env = ctl(*args)["env"]
    return (env.get("TORCH_CUDA_ARCH_LIST"), env.get("FLASHINFER_CUDA_ARCH_LIST"),
            env.get("FLASH_ATTN_CUDA_ARCHS"), env.get("ACCELERATE_MIXED_PRECISION"), env)


def main():
    fetch()
    if "--fetch" in sys.argv[1:]:
        return
    config_dir = tempfile.mkdtemp()
    common.CONFIG = os.path.join(config_dir, "config.yaml")
    with open(common.CONFIG, "w") as f:
        f.write("env:\n  enable: [ACCELERATE_MIXED_PRECISION]\n")
    table = ctl("arch", "toolkit", "--json")["releases"]
    common.NEWEST = max(table, key=cap)
    toolkits = [None, *table]
    torches = {v: torch_function(v) for v in TORCH}
    failures_table = []
    # gpuarch's table of torch releases against each release's own list.
    for version, (_, supported) in torches.items():
        ours = ctl("arch", "torch", version, "--json")["releases"]
        ours = next(iter(ours.values()))
        if ours != supported:
            failures_table.append(f"torch {version} takes {supported}; gpuarch's table says {ours}")
    flash_attns = {v: flash_attn_gencodes(v) for v in FLASH_ATTNS}
    accelerates = {v: accelerate_precision(v) for v in ACCELERATES}
    xformers = {v: xformers_fa3(v) for v in XFORMERS}
    xformers_unknown_lost = 0
    deepspeeds = {v: (deepspeed_builder(v),
                      [(var, deepspeed_builder(v, filt)) for var, filt in deepspeed_ops(v)])
                  for v in DEEPSPEEDS}
    # The newest of each, for the controls and the DeepSpeed summary.
    flash_attn, accelerate = flash_attns[FLASH_ATTN], accelerates[ACCELERATE]
    deepspeed = deepspeeds[DEEPSPEED][0]
    failures, cases, pairs = failures_table, 0, collections.Counter()
    # One GPU of each major from Pascal, beside the fixtures: where each
    # DeepSpeed op's own filter starts keeping architectures.
    majors = os.path.join(config_dir, "one-per-major.json")
    with open(majors, "w") as f:
        json.dump(majors_inventory(["6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0",
                                    "10.0", "12.0"]), f)
    for fixture in [*FIXTURES, majors]:
        snap = json.load(open(fixture))
        gpus = [cap(d["compute_capability"]) for d in snap["devices"]]
        subsets = [[i] for i in range(len(gpus))]
        if len(gpus) > 1 and fixture != majors:
            subsets.append(list(range(len(gpus))))
        for subset in subsets:
            caps = [gpus[i] for i in subset]
            for cuda in toolkits:
                torch_list, fi_list, fa_list, acc, env = plan(fixture, ",".join(map(str, subset)), cuda)
                where = f"{os.path.basename(fixture)} GPUs {subset} {caps}, CUDA {cuda or 'unknown'}"
                builds = set(table[cuda]) if cuda else None
                newest = torches[TORCH[-1]][0]
                # DeepSpeed: the base builder, ahead of time and at JIT
                # load, and each op that keeps only some architectures.
                for version, (base, ops) in deepspeeds.items():
                    cases += 1 + len(ops)
                    failures += check_deepspeed(
                        f"{where}, DeepSpeed {version}: TORCH_CUDA_ARCH_LIST={torch_list!r}",
                        torch_list, caps, cuda, builds, base, newest)
                    failures += check_deepspeed_ops(
                        f"{where}, DeepSpeed {version}", env, caps, cuda, builds, ops)
                # An image not read whose env names its torch (NGC's
                # PYTORCH_VERSION): the Plan made for that torch, given to
                # it and, as any DeepSpeed may be there, to every DeepSpeed
                # (each list once).
                named = {}
                for version in torches:
                    got = plan(fixture, ",".join(map(str, subset)), cuda,
                               env=[f"PYTORCH_VERSION={version}"])[0]
                    named.setdefault(got, version)
                    if fixture != majors:
                        run, supported = torches[version]
                        cases += 1
                        failures += check_torch(
                            f"{where}, torch {version} named by PYTORCH_VERSION (image not read): "
                            f"TORCH_CUDA_ARCH_LIST={got!r}",
                            got, caps, cuda, builds, run, supported, version)
                for got, version in named.items():
                    if got == torch_list:
                        continue
                    for ds, (base, _) in deepspeeds.items():
                        cases += 1
                        failures += check_deepspeed(
                            f"{where}, DeepSpeed {ds} beside torch {version} named by "
                            f"PYTORCH_VERSION (image not read): TORCH_CUDA_ARCH_LIST={got!r}",
                            got, caps, cuda, builds, base, torches[version][0])
                if fixture == majors:
                    continue
                # An image whose torch is not known: the one Plan, given to
                # every torch release. Then an image of each release: the
                # Plan made for it, given to it.
                for version, (run, supported) in torches.items():
                    pairs[version] += 1
                    cases += 2
                    failures += check_torch(
                        f"{where}, torch {version} (image not known): TORCH_CUDA_ARCH_LIST={torch_list!r}",
                        torch_list, caps, cuda, builds, run, supported, version)
                    own = plan(fixture, ",".join(map(str, subset)), cuda, [f"torch=={version}"])[0]
                    failures += check_torch(
                        f"{where}, torch {version} in the image: TORCH_CUDA_ARCH_LIST={own!r}",
                        own, caps, cuda, builds, run, supported, version)
                # FlashInfer, whose context is built at import: every release.
                for version in FLASHINFERS:
                    cases += 1
                    failures += check_flashinfer(
                        f"{where}, FlashInfer {version}: FLASHINFER_CUDA_ARCH_LIST={fi_list!r}",
                        fi_list, caps, cuda, builds, version)
                # xformers: an image known to have it (and not DeepSpeed),
                # and the image not read (the Plan every consumer takes).
                for version, run in xformers.items():
                    cases += 2
                    known = plan(fixture, ",".join(map(str, subset)), cuda,
                                 [f"xformers=={version}"])[0]
                    failures += check_xformers(
                        f"{where}, xformers {version} in the image: TORCH_CUDA_ARCH_LIST={known!r}",
                        known, caps, cuda, builds, run, True)[0]
                    found, lost = check_xformers(
                        f"{where}, xformers {version} (image not known): TORCH_CUDA_ARCH_LIST={torch_list!r}",
                        torch_list, caps, cuda, builds, run, False)
                    failures += found
                    xformers_unknown_lost += lost
                for version, run in accelerates.items():
                    cases += 1
                    failures += check_accelerate(
                        f"{where}, accelerate {version}: ACCELERATE_MIXED_PRECISION={acc!r}",
                        acc, caps, run)
                for version, run in flash_attns.items():
                    cases += 1
                    failures += check_flash_attn(
                        f"{where}, flash-attn {version}: FLASH_ATTN_CUDA_ARCHS={fa_list!r}",
                        fa_list, caps, cuda, run)
    image_cases, image_failures, image_trees = check_image_aware(torches, xformers, deepspeeds,
                                                                 toolkits, table)
    failures += image_failures
    cases += image_cases
    print(f"image-aware: {image_cases} cases: {image_trees} rootfs trees of real layouts "
          f"(consumers split over two environments in two), each planned by gpuarch-hook on "
          f"every GPU of 2080ti-3090, a100-h100 and blackwell-mix under every toolkit, given to "
          f"the torch, xformers and DeepSpeed (builder and ops) the tree holds")
    if slow_reads:
        print(f"image-aware: {len(slow_reads)} starts read again: their read passed its "
              f"deadline on this loaded host")
    # Two B200s, torch not known, in an image read and found without a
    # DeepSpeed (0.12 to 0.15 cannot parse a two-digit major): their own
    # 10.0 under every toolkit that builds sm_100 and under one not known,
    # and every torch release takes it or has no kernels for a B200.
    b200 = os.path.join(config_dir, "b200-pair.json")
    with open(b200, "w") as f:
        json.dump(majors_inventory(["10.0", "10.0"]), f)
    for cuda in (None, "12.8", "13.0"):
        got = plan(b200, "0,1", cuda, ["flash-attn==2.8.3"])[0]
        if got != "10.0":
            failures.append(f"B200 pair, torch not known, CUDA {cuda or 'unknown'}: "
                            f"TORCH_CUDA_ARCH_LIST={got!r}, not '10.0'")
        for version, (run, supported) in torches.items():
            builds = set(table[cuda]) if cuda else None
            failures += check_torch(f"B200 pair, CUDA {cuda or 'unknown'}, torch {version} "
                                    f"(not known): TORCH_CUDA_ARCH_LIST={got!r}",
                                    got, [(10, 0), (10, 0)], cuda, builds, run, supported, version)
    rejecting = [v for v, (_, supported) in torches.items() if "10.0" not in supported]
    for v in rejecting:
        if torch_runs(v, [(10, 0), (10, 0)], None, torches[v][1]):
            failures.append(f"torch {v} rejects 10.0, yet its own wheels run on a B200")
    print(f"B200 pair, torch not known, no DeepSpeed: 10.0 under CUDA unknown, 12.8 and 13.0, "
          f"given to every torch release; those that reject 10.0 ({', '.join(rejecting)}) have "
          f"no kernels for it either")
    print(f"torch releases whose own wheels have no kernels for the case's GPUs (fail unset "
          f"as set; not judged): {dict(TORCH_CANNOT_RUN)}")
    print(f"torch given older code than unset (PTX, or SASS of an older minor; a failure "
          f"each), by the GPU's major: {dict(sorted(TORCH_LESS_NATIVE.items()))}")
    outcomes = dict(OUTCOMES)
    print(f"consumers: {cases} cases over {len(FIXTURES)} fixtures and one GPU of each major "
          f"(DeepSpeed), toolkits {', '.join(t or 'unknown' for t in toolkits)}; torch (each "
          f"image-unknown and image-known, and named by PYTORCH_VERSION in an image not read, "
          f"that Plan given to every DeepSpeed too) {dict(pairs)}; FlashInfer {', '.join(FLASHINFERS)}; "
          f"flash-attn {', '.join(FLASH_ATTNS)} (before 2.7 it does not read FLASH_ATTN_CUDA_ARCHS); "
          f"accelerate {', '.join(ACCELERATES)}; DeepSpeed {', '.join(DEEPSPEEDS)} (base builder, "
          f"and the ops that filter: {', '.join(sorted({v for _, ops in deepspeeds.values() for v, _ in ops}))})")
    print(f"xformers {', '.join(XFORMERS)}: FlashAttention 3 keeps its sm_90a where the image is "
          f"known to have xformers and no DeepSpeed; where a DeepSpeed is, or may be, there too "
          f"(an image not read), a Hopper's TORCH_CUDA_ARCH_LIST is left unset (DeepSpeed cannot "
          f"parse 9.0a, and 9.0 traps FA3): {xformers_unknown_lost} cases build it as plain sm_90")
    worse = outcomes.get(("unset works", "gpuarch fails"), 0)
    less = outcomes.get(("unset works", "gpuarch builds less"), 0)
    print(f"never worse than unset, per case where gpuarch sets the variable: "
          f"{outcomes.get(('unset works', 'gpuarch works'), 0)} both work; "
          f"{outcomes.get(('unset fails', 'gpuarch works'), 0)} unset fails and gpuarch works; "
          f"{outcomes.get(('unset fails', 'gpuarch fails'), 0)} both fail; "
          f"{worse} gpuarch fails and unset works; "
          f"{less} gpuarch builds less native code (xformers' FlashAttention 3 as sm_90, "
          f"not sm_90a)")
    if worse:
        failures.append(f"{worse} cases where gpuarch fails and unset works (listed above)")
    if less:
        failures.append(f"{less} cases where gpuarch builds less native code than unset")
    # The control: the same checks catch what gpuarch did before it knew the
    # toolkit (each GPU's exact capability), in the case.
    gb10, builds = [(12, 1)], set(table["12.8"])
    control = check_torch("control", "12.1", gb10, "12.8", builds, *torches["2.7.1"]) + \
        check_flashinfer("control", "12.1", gb10, "12.8", builds)
    # flash-attn's build ignores an entry it does not know: "86" builds nothing.
    control += check_flash_attn("control", "86", [(8, 6)], "12.8", flash_attn)
    # accelerate does not take GPUARCH_DTYPE's spelling.
    control += check_accelerate("control", "bfloat16", [(8, 6)], accelerate)
    # DeepSpeed cannot parse an arch-specific target: `9.0a` (what xformers'
    # FA3 build wants) fails every op build, one reason gpuarch never emits it.
    control += check_deepspeed("control", "9.0a", [(9, 0)], "12.8", set(table["12.8"]),
                               deepspeed, torches[TORCH[-1]][0])
    # A DeepSpeed op that keeps nothing of a Turing's list, left on; and
    # one switched off although it builds for an Ampere.
    fp_quantizer = dict(deepspeeds[DEEPSPEED][1])["DS_BUILD_FP_QUANTIZER"]
    control += check_deepspeed_ops("control", {"TORCH_CUDA_ARCH_LIST": "7.5"}, [(7, 5)], "12.8",
                                   set(table["12.8"]), [("DS_BUILD_FP_QUANTIZER", fp_quantizer)])
    control += check_deepspeed_ops("control", {"TORCH_CUDA_ARCH_LIST": "8.6",
                                               "DS_BUILD_FP_QUANTIZER": "0"}, [(8, 6)], "12.8",
                                   set(table["12.8"]), [("DS_BUILD_FP_QUANTIZER", fp_quantizer)])
    # xformers known in the image, on an H100, given a plain 9.0.
    control += check_xformers("control", "9.0", [(9, 0)], "12.8", set(table["12.8"]),
                              xformers["0.0.34"], True)[0]
    want = ["Unknown CUDA arch (12.1)", "SM 12.1+ requires CUDA >= 12.9", "flash-attn builds []",
            "accelerate does not take 'bfloat16'", "DeepSpeed raised ValueError",
            "DS_BUILD_FP_QUANTIZER not switched off", "DS_BUILD_FP_QUANTIZER=0, but the op builds",
            "builds FlashAttention 3 as sm_90a"]
    for w in want:
        if not any(w in c for c in control):
            failures.append(f"control: a GB10's exact 12.1 under CUDA 12.8 was not caught ({w!r}): {control}")
    print(f"control, GB10 (12.1) under CUDA 12.8 with the exact capability, and DeepSpeed ops "
          f"left on or switched off wrongly, caught: {control}")
    # What gpuarch changes in DeepSpeed's ahead-of-time builds, from its own
    # default: on a 3090 the default list has pre-Ampere archs, so no bf16
    # kernels; under CUDA 13 it has only archs that toolkit dropped.
    seen = {}
    for cuda in ("12.8", "13.0"):
        for value in (None, "8.6"):
            flags, bf16 = deepspeed(value, [(8, 6)], cuda, False)
            archs = sorted({f"{ma}.{mi}" for _, (ma, mi), _ in targets_of(flags)}, key=cap)
            seen[cuda, value] = (archs, bf16, [a for a in archs if a not in table[cuda]])
    print(f"DeepSpeed {DEEPSPEED} ahead of time on a 3090: its default builds "
          f"{seen['12.8', None][0]} under CUDA 12.8 with BF16_AVAILABLE={seen['12.8', None][1]}, "
          f"and {seen['13.0', None][0]} under CUDA 13.0, which cannot build "
          f"{seen['13.0', None][2]}; with gpuarch's 8.6: "
          f"{seen['12.8', '8.6'][0]}, BF16_AVAILABLE={seen['12.8', '8.6'][1]}")
    if seen["12.8", None][1] or not seen["12.8", "8.6"][1] \
            or seen["13.0", None][2] != seen["13.0", None][0] or seen["13.0", "8.6"][2]:
        failures.append(f"DeepSpeed {DEEPSPEED}'s default is not what docs/CONSUMERS.md says: {seen}")
    jit_cases, jit_failures, jit_note = check_jit()
    failures += jit_failures
    print(f"JIT caches: {jit_cases} cases (torch {', '.join(TORCH)}: cpp_extension and "
          f"inductor; Triton {', '.join(TRITONS)}; vLLM {', '.join(VLLMS)}; FlashInfer "
          f"{FLASHINFERS[0]} to {FLASHINFERS[-1]}); {jit_note}")
    cubin_cases, cubin_failures = check_flashinfer_cubin_dir(library_root("flashinfer-cubin"))
    failures += cubin_failures
    print(f"FLASHINFER_CUBIN_DIR: {cubin_cases} cases, FlashInfer {', '.join(FLASHINFER_CUBINS)} "
          f"(each release's own _get_cubin_dir, and its own flashinfer_cubin package where "
          f"installed): {len(cubin_failures)} failures")
    # Control: a release whose package kept its kernels elsewhere would be
    # served a tree in the wrong layout; the check must say so.
    _, wrong = check_flashinfer_cubin_dir("flashinfer_cubin/kernels/")
    if not wrong or not all("gpuarch serves flashinfer_cubin/kernels" in w for w in wrong):
        failures.append(f"control: a tree in another layout than the package's was not caught: {wrong}")
    failures += nvrtc_check(table)
    for line in newer_than_the_window():
        print(f"window: {line}")
    if failures:
        print(f"{len(failures)} failures:")
        for f in failures:
            print("  " + f)
        sys.exit(1)
    print("consumers: every case parsed, every GPU served, never worse than the default")
