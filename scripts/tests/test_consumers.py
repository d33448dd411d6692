"""scripts/consumers' modules, one by one, where no wheel is needed: the
readers every consumer's check trusts (gencode targets, what serves a
GPU, a toolkit's name for it), the judge of "never worse than unset",
the stand-ins for a process's env and modules, and the pins. The
consumers' own code runs in scripts/test's full matrix."""

import os
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, SCRIPTS)

from consumer_check import cli, common, flashinfer, torch, wheels  # noqa: E402


def test_gencode_flags_are_read_as_targets():
    flags = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_86,code=sm_86",
             "-gencode=arch=compute_120,code=compute_120", "-gencode=arch=compute_100f,code=sm_100f"]
    assert common.targets_of(flags) == [("sm", (9, 0), "a"), ("sm", (8, 6), ""),
                                        ("compute", (12, 0), ""), ("sm", (10, 0), "f")]


def test_what_serves_a_gpu():
    sm86 = [("sm", (8, 6), "")]
    assert common.serves((8, 9), sm86), "SASS runs on a later minor of its major"
    assert not common.serves((8, 0), sm86), "nor on an earlier one"
    assert not common.serves((9, 0), sm86), "nor on another major"
    assert common.serves((9, 0), [("sm", (9, 0), "a")])
    assert not common.serves((10, 0), [("sm", (9, 0), "a")]), "an `a` target is exact"
    assert common.serves((12, 0), [("compute", (9, 0), "")]), "PTX JITs forward"
    assert not common.serves((8, 6), [("compute", (9, 0), "")]), "never back"
    # Never across desktop and Tegra: Orin (8.7), Thor (10.1).
    assert not common.serves((8, 7), sm86), "desktop SASS on Orin"
    assert not common.serves((10, 1), [("sm", (10, 0), "")]), "sm_100 on Thor"
    assert not common.serves((7, 5), [("sm", (7, 2), "")]), "Xavier's SASS on Turing"
    assert common.serves((8, 7), [("sm", (8, 7), "")])
    assert common.serves((8, 7), [("compute", (8, 6), "")]), "PTX JITs on Tegra too"


def test_thor_is_named_by_its_toolkit():
    assert common.as_named((11, 0), "12.9") == (10, 1)
    assert common.as_named((11, 0), "13.0") == (11, 0)
    assert common.as_named((11, 0), None) == (11, 0)
    assert common.as_named((9, 0), "12.0") == (9, 0)


def test_flashinfer_targets_family_and_exact():
    assert flashinfer.fi_serves((10, 3), [(10, "0f")])
    assert not flashinfer.fi_serves((10, 3), [(10, "0a")])
    assert flashinfer.fi_serves((12, 0), [(12, "0a")])
    assert not flashinfer.fi_serves((12, 1), [(11, "0")])


def test_never_worse_than_unset_is_judged_per_gpu():
    builds = {"8.0", "8.6", "9.0"}
    default = [("sm", (8, 0), ""), ("sm", (9, 0), "")]
    # Ours serves both GPUs: nothing wrong.
    ok = torch.judge_targets("x", [("sm", (8, 6), ""), ("sm", (9, 0), "")], default,
                             [(8, 6), (9, 0)], "12.8", builds, "builds", "torch")
    assert ok == []
    # Ours loses the Hopper GPU the default serves.
    lost = torch.judge_targets("x", [("sm", (8, 6), "")], default, [(8, 6), (9, 0)], "12.8",
                               builds, "builds", "torch")
    assert len(lost) == 1 and "runs on (9, 0)" in lost[0]
    # Ours asks for what the toolkit cannot build.
    cannot = torch.judge_targets("x", [("sm", (10, 0), "")], default, [], "12.8", builds,
                                 "builds", "torch")
    assert cannot == ["x: CUDA 12.8 cannot build sm_100"]


def test_torch_wheels_by_release():
    # A desktop GPU's case is judged by the wheels alone, whatever names
    # the release takes.
    names = []
    assert torch.torch_runs("2.4.1", [(9, 0)], "12.4", names)
    assert not torch.torch_runs("2.4.1", [(10, 0)], "12.8", names), "2.4 wheels have no Blackwell"
    assert torch.torch_runs("2.7.1", [(10, 0), (12, 0)], "12.8", names)
    assert not torch.torch_runs("2.9.1", [(3, 7)], "12.8", names), "2.9 dropped Kepler"
    # On a Tegra GPU, NVIDIA's build of a release that takes its name.
    assert torch.torch_runs("2.8.0", [(10, 1)], "12.9", ["9.0", "10.0", "10.1"])
    assert not torch.torch_runs("2.9.1", [(10, 1)], "12.9", ["9.0", "10.0", "11.0"])


def test_tally_counts_by_outcome():
    before = common.OUTCOMES.copy()
    common.tally(True, False)
    common.tally(True, False)
    assert common.OUTCOMES[("unset works", "gpuarch fails")] == \
        before[("unset works", "gpuarch fails")] + 2
    common.OUTCOMES.clear()
    common.OUTCOMES.update(before)


def test_env_and_modules_are_given_back(monkeypatch):
    monkeypatch.setenv("GPUARCH_TEST_A", "kept")
    monkeypatch.delenv("GPUARCH_TEST_B", raising=False)
    with common.Env({"GPUARCH_TEST_A": None, "GPUARCH_TEST_B": "set"}):
        assert "GPUARCH_TEST_A" not in os.environ
        assert os.environ["GPUARCH_TEST_B"] == "set"
    assert os.environ["GPUARCH_TEST_A"] == "kept"
    assert "GPUARCH_TEST_B" not in os.environ
    stand_in = object()
    with common.Modules({"json": stand_in, "gpuarch_no_such_module": stand_in}):
        assert sys.modules["json"] is stand_in
    import json
    assert sys.modules["json"] is json and json.dumps(1) == "1"
    assert "gpuarch_no_such_module" not in sys.modules


def test_one_gpu_per_capability_makes_a_valid_snapshot():
    snap = cli.majors_inventory(["7.5", "9.0"])
    assert [d["compute_capability"] for d in snap["devices"]] == ["7.5", "9.0"]
    assert len({d["uuid"] for d in snap["devices"]}) == 2
    assert len({d["pci_bus_id"] for d in snap["devices"]}) == 2


def test_the_pins_are_in_order_and_the_newest_is_tested():
    def key(v):
        return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in v.split(".")[:3])
    for pins, newest in [(common.FLASHINFERS, None), (common.ACCELERATES, common.ACCELERATE),
                         (common.DEEPSPEEDS, common.DEEPSPEED),
                         (common.FLASH_ATTNS, common.FLASH_ATTN), (common.TORCH, None),
                         (common.VLLMS, None), (common.TRITONS, None)]:
        assert pins == sorted(pins, key=key) and len(set(pins)) == len(pins), pins
        if newest:
            assert pins[-1] == newest
    assert set(common.FLASHINFER_CUBINS) <= set(common.FLASHINFERS)


def test_a_release_newer_than_the_window_is_said(monkeypatch):
    import io
    import json
    import urllib.request
    newest = {"torch": "2.15.0", "flashinfer-python": "0.7.5", "flash-attn": "2.8.3.post2",
              "accelerate": "1.15.0", "deepspeed": "0.19.8", "xformers": "0.0.35.post1",
              "vllm": "0.33.0rc1", "triton": "3.9.1", "flashinfer-cubin": "0.6.13",
              "nvidia-cuda-nvrtc": "13.6.20"}

    def urlopen(url, timeout):
        dist = url.split("/")[-2]
        if dist == "flash-attn":
            raise OSError("no route to host")
        return io.BytesIO(json.dumps({"info": {"version": newest[dist]}}).encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(wheels, "FLASHINFERS", ["0.6.18.post1", "0.7.2.post1", "0.7.4"])
    monkeypatch.setattr(wheels, "XFORMERS", ["0.0.34", "0.0.35"])
    monkeypatch.setattr(wheels, "VLLMS", ["0.32.0", "0.33.0"])
    monkeypatch.setattr(wheels, "TRITONS", ["3.8.0", "3.9.0"])
    lines = wheels.newer_than_the_window()
    assert any(line.startswith("flashinfer-python 0.7.5 is on PyPI, newer than the window's 0.7.4")
               for line in lines), lines
    assert any(line.startswith("xformers 0.0.35.post1") for line in lines), "a post-release is newer"
    assert any(line.startswith("flash-attn: could not ask PyPI") for line in lines), lines
    assert any(line.startswith("triton 3.9.1 is on PyPI") for line in lines), lines
    assert any(line.startswith("nvidia-cuda-nvrtc 13.6.20 is on PyPI, newer than the "
                               "window's 13.5.37") for line in lines), lines
    assert not any(line.startswith("flashinfer-cubin") for line in lines), lines
    assert not any(line.startswith(("torch", "vllm")) for line in lines), \
        "the newest in the window, and a release candidate, are not newer"

