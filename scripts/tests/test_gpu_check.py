"""scripts/gpu-check's modules, one by one, where no GPU is needed: the
parts the command line runs, the report, and the readers each part
trusts (cuobjdump's listing, an arch list's targets, an ELF's kind)."""

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, SCRIPTS)

import gpu_check  # noqa: E402
from gpu_check import cli, common, part5, part7, part8, tools  # noqa: E402


def test_the_command_line_runs_every_part_the_docs_name():
    assert sorted(cli.PARTS) == list(range(1, 10))
    for n, fn in cli.PARTS.items():
        assert fn.__name__ == f"part{n}"
        assert fn.__module__ == f"gpu_check.part{n}"
        assert f"\n  {n} " in gpu_check.__doc__, f"part {n} is not described"
    assert set(cli.REHEARSED) == {7, 8, 9}
    assert all(cli.REHEARSED[n] is cli.PARTS[n] for n in cli.REHEARSED)


def test_root_is_the_checkout():
    assert os.path.isfile(os.path.join(common.ROOT, "Cargo.toml"))
    assert os.path.isfile(os.path.join(common.ROOT, "scripts", "gpu-check"))


def test_a_check_and_a_skip_are_recorded_and_printed(capsys):
    before = len(common.CHECKS)
    assert common.check("p", "n", True, "fine", x=1) is True
    common.skip("p", "m", "not here")
    assert common.CHECKS[before:] == [
        {"part": "p", "name": "n", "ok": True, "detail": "fine", "data": {"x": 1}},
        {"part": "p", "name": "m", "ok": None, "detail": "not here", "data": {}},
    ]
    assert capsys.readouterr().out == "PASS p n: fine\nSKIP p m: not here\n"
    del common.CHECKS[before:]


def test_sh_says_missing_and_timed_out():
    assert common.sh(["/nonexistent/program"])[0] == 127
    rc, _, err = common.sh(["sleep", "5"], timeout=0.2)
    assert (rc, err) == (124, "timed out after 0.2 s")
    assert common.sh(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\n", "err\n")


def test_cuobjdump_listing_is_read_as_sass_and_ptx(tmp_path):
    fake = tmp_path / "cuobjdump"
    fake.write_text("#!/bin/sh\n"
                    "echo 'ELF file    1: libx.1.sm_90a.cubin'\n"
                    "echo 'ELF file    2: libx.2.sm_80.cubin'\n"
                    "echo 'PTX file    1: libx.1.sm_90.ptx'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert tools.cuobjdump_targets(str(fake), "libx.so") == (
        {"sm_90a", "sm_80", "compute_90"}, None)
    assert tools.cuobjdump_targets(None, "libx.so") == (None, "not found")
    fails = tmp_path / "fails"
    fails.write_text("#!/bin/sh\necho 'cuobjdump fatal: bad file' >&2\nexit 1\n")
    fails.chmod(0o755)
    assert tools.cuobjdump_targets(str(fails), "x") == (None, "cuobjdump fatal: bad file")


def test_an_arch_list_names_the_targets_a_build_carries():
    assert part8.want_targets("8.6;9.0+PTX") == {"sm_86", "sm_90", "compute_90"}
    assert part8.want_targets("7.5 8.0") == {"sm_75", "sm_80"}
    assert part8.want_targets("") == set()


def test_elf_kind_without_file(tmp_path):
    dynamic = tmp_path / "d"
    dynamic.write_bytes(b"\x7fELF" + b"\0" * 60 + b"/lib64/ld-linux-x86-64.so.2\0"
                        + b"\0.symtab\0.strtab\0")
    static = tmp_path / "s"
    static.write_bytes(b"\x7fELF" + b"\0" * 200 + b"\0.shstrtab\0.text\0")
    assert part5.elf_kind(dynamic) == ("dynamic", "not stripped")
    assert part5.elf_kind(static) == ("static", "stripped")
    assert part5.elf_kind(sys.executable)[0] == "dynamic"


def test_others_can_run_needs_every_directory_searchable(tmp_path):
    d = tmp_path / "a" / "b"
    d.mkdir(parents=True)
    os.chmod(tmp_path / "a", 0o700)
    assert not part7.others_can_run([str(d)])
    assert part7.others_can_run(["/usr/bin", "/etc"])
    assert not part7.others_can_run(["/usr/bin", str(d)])


def test_without_a_driver_every_part_fails_at_once_and_the_report_is_written(tmp_path):
    if shutil.which("nvidia-smi", path="/usr/bin:/bin"):
        pytest.skip("an NVIDIA driver is here: gpu-check would run for real")
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu-check"), "run",
                        "--bundle", str(tmp_path / "none"), "--out", str(tmp_path)],
                       capture_output=True, text=True, env=dict(os.environ, PATH="/usr/bin:/bin"),
                       timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["failed"] == 9 and report["passed"] == 0
    assert {c["part"] for c in report["checks"]} == {f"part{n}" for n in range(1, 10)}
    assert all(c["name"] == "prerequisites" for c in report["checks"])


def test_rehearse_goes_with_parts_7_8_9_alone(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu-check"), "run", "--rehearse",
                        "--parts", "1,7", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "--rehearse goes with parts 7, 8 and 9 alone" in r.stderr
