"""The helper against the env and the kernel manifest gpuarch writes.

fixtures/rmsnorm/manifest.json is the view manifest as the hook writes it:
a Rust test (wire/src/manifest.rs) fails when the format and that file part.
"""

import json
import os
import shutil
import sys
import types

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gpuarch  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

# What gpuarch sets for a container on a 2080 Ti (7.5) and a 3090 (8.6).
TURING_AND_AMPERE = {
    "TORCH_CUDA_ARCH_LIST": "7.5;8.6",
    "FLASHINFER_CUDA_ARCH_LIST": "7.5 8.6",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "GPUARCH_COMPUTE_CAPABILITIES": "7.5,8.6",
    "GPUARCH_MIN_COMPUTE_CAPABILITY": "7.5",
    "GPUARCH_DTYPE": "float16",
    "GPUARCH_ATTN_IMPLEMENTATION": "sdpa",
    "GPUARCH_TF32": "0",
    "GPUARCH_FP8": "0",
}
# ... and on a 3090 alone.
AMPERE = dict(TURING_AND_AMPERE, TORCH_CUDA_ARCH_LIST="8.6", GPUARCH_COMPUTE_CAPABILITIES="8.6",
              GPUARCH_MIN_COMPUTE_CAPABILITY="8.6", GPUARCH_DTYPE="bfloat16",
              GPUARCH_ATTN_IMPLEMENTATION="flash_attention_2", GPUARCH_TF32="1",
              FLASH_ATTN_CUDA_ARCHS="80")


@pytest.fixture
def no_torch(monkeypatch):
    """As if neither torch nor flash_attn were installed."""
    real = gpuarch.importlib.util.find_spec
    monkeypatch.setattr(gpuarch.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "flash_attn") else real(name, *a))


@pytest.fixture
def fake_torch(monkeypatch):
    """A stand-in torch module (the real one is 70 MB and not needed to
    show the helper hands back its dtype objects), and flash_attn present."""
    torch = types.ModuleType("torch")
    torch.bfloat16, torch.float16 = object(), object()
    flash_attn = types.ModuleType("flash_attn")
    flash_attn.__spec__ = types.SimpleNamespace(name="flash_attn")
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn)
    real = gpuarch.importlib.util.find_spec
    monkeypatch.setattr(gpuarch.importlib.util, "find_spec",
                        lambda name, *a: object() if name in ("torch", "flash_attn") else real(name, *a))
    return torch


def test_outside_gpuarch_every_answer_is_the_default(no_torch):
    assert gpuarch.dtype_name(env={}) is None
    assert gpuarch.torch_dtype("float32", env={}) == "float32"
    assert gpuarch.attn_implementation(env={}) == "sdpa"
    assert gpuarch.attn_implementation("eager", env={}) == "eager"
    p = gpuarch.plan(env={})
    assert p["compute_capabilities"] == [] and p["dtype"] is None and p["kernels"] == {}
    with pytest.raises(gpuarch.GpuarchError, match="GPUARCH_KERNELS_DIR is not set"):
        gpuarch.kernel_file("rmsnorm", env={})
    # With a default, the application's own file, as every other function.
    assert gpuarch.kernel_file("rmsnorm", 0, env={}, default="/opt/app/rmsnorm.cubin") \
        == "/opt/app/rmsnorm.cubin"
    assert gpuarch.kernel_manifest("rmsnorm", env={}, default=None) is None


def test_zonos_bf16_becomes_fp16_on_turing(fake_torch):
    # Zonos hard-codes torch.bfloat16, which Turing lacks; the helper gives
    # what every GPU of the container has.
    assert gpuarch.torch_dtype(env=TURING_AND_AMPERE) is fake_torch.float16
    assert gpuarch.torch_dtype(env=AMPERE) is fake_torch.bfloat16


def test_without_torch_the_dtype_is_its_name(no_torch):
    assert gpuarch.torch_dtype(env=TURING_AND_AMPERE) == "float16"
    assert gpuarch.dtype_name(env=AMPERE) == "bfloat16"


def test_vila_fa2_becomes_sdpa_before_ampere(fake_torch):
    assert gpuarch.attn_implementation(env=TURING_AND_AMPERE) == "sdpa"
    assert gpuarch.attn_implementation(env=AMPERE) == "flash_attention_2"


def test_fa2_only_when_flash_attn_is_installed(no_torch):
    # transformers raises ImportError for flash_attention_2 without it.
    assert gpuarch.attn_implementation(env=AMPERE) == "sdpa"


def test_values_gpuarch_never_writes_are_not_believed(no_torch):
    bad = dict(AMPERE, GPUARCH_DTYPE="float64", GPUARCH_ATTN_IMPLEMENTATION="magic",
               GPUARCH_COMPUTE_CAPABILITIES="8.6,x,9")
    assert gpuarch.dtype_name("d", env=bad) == "d"
    assert gpuarch.attn_implementation("a", env=bad) == "a"
    assert gpuarch.plan(env=bad)["compute_capabilities"] == [(8, 6)]


def kernels(tmp_path):
    root = tmp_path / "kernels"
    shutil.copytree(FIXTURES, root)
    (root / "rmsnorm" / "sm_75").mkdir()
    (root / "rmsnorm" / "sm_75" / "rmsnorm.cubin").write_bytes(b"cubin")
    (root / "handmade").mkdir()
    (root / "handmade" / "manifest.json").write_text('{"targets": ["sm_80"]}')
    return dict(TURING_AND_AMPERE, GPUARCH_KERNELS_DIR=str(root)), root


def test_kernel_file_per_gpu_and_the_reason_when_there_is_none(tmp_path):
    env, root = kernels(tmp_path)
    path = gpuarch.kernel_file("rmsnorm", 0, env=env)
    assert path == str(root / "rmsnorm" / "sm_75" / "rmsnorm.cubin")
    assert open(path, "rb").read() == b"cubin"
    with pytest.raises(gpuarch.GpuarchError, match=r"GPU 1: no build runs on GPU 1 .* yet"):
        gpuarch.kernel_file("rmsnorm", 1, env=env)
    with pytest.raises(gpuarch.GpuarchError, match="no GPU 2 in this container"):
        gpuarch.kernel_file("rmsnorm", 2, env=env)
    with pytest.raises(gpuarch.GpuarchError, match="'flash' is not mounted"):
        gpuarch.kernel_file("flash", 0, env=env)
    with pytest.raises(gpuarch.GpuarchError, match="does not map files to GPUs"):
        gpuarch.kernel_file("handmade", 0, env=env)
    with pytest.raises(gpuarch.GpuarchError, match="not a package name"):
        gpuarch.kernel_file("../etc", 0, env=env)


def test_a_broken_manifest_is_a_clear_error(tmp_path):
    env, root = kernels(tmp_path)
    (root / "rmsnorm" / "manifest.json").write_text("{")
    with pytest.raises(gpuarch.GpuarchError, match="not JSON"):
        gpuarch.kernel_file("rmsnorm", 0, env=env)


def test_plan_is_everything(tmp_path, no_torch):
    env, root = kernels(tmp_path)
    p = gpuarch.plan(env=env)
    assert p["compute_capabilities"] == [(7, 5), (8, 6)]
    assert p["min_compute_capability"] == (7, 5)
    assert (p["dtype"], p["attn_implementation"], p["tf32"], p["fp8"]) == ("float16", "sdpa", False, False)
    assert p["torch_cuda_arch_list"] == "7.5;8.6"
    assert p["flash_attn_cuda_archs"] is None
    assert sorted(p["kernels"]) == ["handmade", "rmsnorm"]
    assert p["kernels"]["rmsnorm"]["gpus"][0]["variant"] == "fp16"
    assert p["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_it_reads_the_process_env_by_default(monkeypatch, no_torch):
    for k, v in AMPERE.items():
        monkeypatch.setenv(k, v)
    assert gpuarch.dtype_name() == "bfloat16"
    assert gpuarch.plan()["flash_attn_cuda_archs"] == "80"


# --- hostile and broken kernel directories: every failure a GpuarchError ---


def manifest_of(root, text):
    (root / "rmsnorm" / "manifest.json").write_text(text) if isinstance(text, str) \
        else (root / "rmsnorm" / "manifest.json").write_bytes(text)


@pytest.mark.parametrize("text", ["[]", '"rmsnorm"', "1", "null", "true", "[{}]"])
def test_a_manifest_of_any_other_json_type_is_an_error(tmp_path, text, no_torch):
    env, root = kernels(tmp_path)
    manifest_of(root, text)
    with pytest.raises(gpuarch.GpuarchError, match="not an object"):
        gpuarch.kernel_manifest("rmsnorm", env=env)
    with pytest.raises(gpuarch.GpuarchError):
        gpuarch.kernel_file("rmsnorm", 0, env=env)
    assert "rmsnorm" not in gpuarch.plan(env=env)["kernels"]


@pytest.mark.parametrize("data", [b"[" * 200_000, b"\xff\xfe{}", b"", b"{" + b" " * (2 << 20) + b"}"])
def test_unreadable_manifests_are_errors(tmp_path, data, no_torch):
    env, root = kernels(tmp_path)
    manifest_of(root, data)
    with pytest.raises(gpuarch.GpuarchError):
        gpuarch.kernel_manifest("rmsnorm", env=env)
    assert sorted(gpuarch.plan(env=env)["kernels"]) == ["handmade"]


def test_directories_where_files_belong_and_files_where_directories_do(tmp_path, no_torch):
    env, root = kernels(tmp_path)
    (root / "rmsnorm" / "manifest.json").unlink()
    (root / "rmsnorm" / "manifest.json").mkdir()
    with pytest.raises(gpuarch.GpuarchError, match="manifest.json"):
        gpuarch.kernel_manifest("rmsnorm", env=env)
    # A listed file that is a directory.
    env, root = kernels(tmp_path / "b")
    shutil.rmtree(root / "rmsnorm" / "sm_75")
    (root / "rmsnorm" / "sm_75" / "rmsnorm.cubin").mkdir(parents=True)
    with pytest.raises(gpuarch.GpuarchError, match="is not a file in the package"):
        gpuarch.kernel_file("rmsnorm", 0, env=env)
    # The kernels directory is a file; a package is a file.
    f = tmp_path / "plain"
    f.write_text("x")
    for bad in (dict(env, GPUARCH_KERNELS_DIR=str(f)),):
        with pytest.raises(gpuarch.GpuarchError, match="is not a directory"):
            gpuarch.kernel_file("rmsnorm", 0, env=bad)
        assert gpuarch.plan(env=bad)["kernels"] == {}
    (root / "afile").write_text("x")
    with pytest.raises(gpuarch.GpuarchError, match="is not mounted"):
        gpuarch.kernel_manifest("afile", env=env)


@pytest.mark.parametrize("name", ["rms\0norm", "", ".", "..", "a/b", None, 5, b"rmsnorm"])
def test_names_that_are_not_package_names(tmp_path, name):
    env, _ = kernels(tmp_path)
    with pytest.raises(gpuarch.GpuarchError, match="not a package name"):
        gpuarch.kernel_file(name, 0, env=env)


@pytest.mark.parametrize("root", ["relative/kernels", "/opt/gpu\0arch", ""])
def test_kernels_dirs_that_are_not_absolute_directories(root, no_torch):
    env = dict(TURING_AND_AMPERE, GPUARCH_KERNELS_DIR=root)
    with pytest.raises(gpuarch.GpuarchError):
        gpuarch.kernel_file("rmsnorm", 0, env=env)
    assert gpuarch.plan(env=env)["kernels"] == {}


def gpu0_files(root, files):
    m = json.loads((root / "rmsnorm" / "manifest.json").read_text())
    m["gpus"][0]["files"] = files
    (root / "rmsnorm" / "manifest.json").write_text(json.dumps(m))


def test_never_a_path_outside_the_package(tmp_path):
    env, root = kernels(tmp_path)
    secret = tmp_path / "secret.cubin"
    secret.write_bytes(b"host")
    (root / "other").mkdir()
    (root / "other" / "x.cubin").write_bytes(b"other")
    (root / "rmsnorm" / "up").symlink_to(tmp_path)
    (root / "rmsnorm" / "abs.cubin").symlink_to(secret)
    (root / "rmsnorm" / "rel.cubin").symlink_to("../other/x.cubin")
    for files, why in [
        (["../other/x.cubin"], "leads outside"),
        (["sm_75/../../other/x.cubin"], "leads outside"),
        ([str(secret)], "not a file name"),
        (["up/secret.cubin"], "leads outside"),
        (["abs.cubin"], "leads outside"),
        (["rel.cubin"], "leads outside"),
        (["sm_75/rmsnorm.cubin\0x"], "not a file name"),
        ([5], "not a file name"),
        ([None], "not a file name"),
        ("sm_75/rmsnorm.cubin", "no file listed"),
        ({"0": "sm_75/rmsnorm.cubin"}, "no file listed"),
        ([], "no file listed"),
    ]:
        gpu0_files(root, files)
        with pytest.raises(gpuarch.GpuarchError, match=why):
            gpuarch.kernel_file("rmsnorm", 0, env=env)
    # A package that is a link out of the kernels directory.
    outside = tmp_path / "elsewhere"
    shutil.copytree(root / "rmsnorm", outside, symlinks=True)
    (root / "linked").symlink_to(outside)
    with pytest.raises(gpuarch.GpuarchError, match="leads outside"):
        gpuarch.kernel_manifest("linked", env=env)
    # A link within the package is followed and the real path returned.
    (root / "rmsnorm" / "in.cubin").symlink_to("sm_75/rmsnorm.cubin")
    gpu0_files(root, ["in.cubin"])
    assert gpuarch.kernel_file("rmsnorm", 0, env=env) == str(root / "rmsnorm" / "sm_75" / "rmsnorm.cubin")


@pytest.mark.parametrize("index", [True, False, 0.0, "0", -1, None])
def test_a_bool_or_anything_but_a_whole_number_is_not_a_device_index(tmp_path, index):
    env, _ = kernels(tmp_path)
    with pytest.raises(gpuarch.GpuarchError, match="not a device index"):
        gpuarch.kernel_file("rmsnorm", index, env=env)


def test_a_manifest_index_that_is_a_bool_names_no_gpu(tmp_path):
    env, root = kernels(tmp_path)
    m = json.loads((root / "rmsnorm" / "manifest.json").read_text())
    m["gpus"] = [dict(m["gpus"][0], index=True)]
    (root / "rmsnorm" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(gpuarch.GpuarchError, match="no GPU 1 in this container"):
        gpuarch.kernel_file("rmsnorm", 1, env=env)


class Unanswerable(dict):
    def get(self, *a):
        raise RuntimeError("no")


@pytest.mark.parametrize("env", [
    {"GPUARCH_KERNELS_DIR": 5, "GPUARCH_COMPUTE_CAPABILITIES": None, "GPUARCH_TF32": 1},
    {"GPUARCH_COMPUTE_CAPABILITIES": "9" * 5000 + ".0,8.6,,x.y,1.2.3,\u00b2.0"},
    Unanswerable(),
    dict(TURING_AND_AMPERE, GPUARCH_KERNELS_DIR="/proc/self/fd/0"),
    dict(TURING_AND_AMPERE, GPUARCH_KERNELS_DIR="/dev"),
])
def test_plan_never_raises(env, no_torch):
    p = gpuarch.plan(env=env)
    assert p["compute_capabilities"] in ([], [(8, 6)], [(7, 5), (8, 6)])
    assert isinstance(p["kernels"], dict)


def test_fa2_never_without_flash_attn_whatever_the_default(no_torch, monkeypatch):
    assert gpuarch.attn_implementation("flash_attention_2", env={}) == "sdpa"
    assert gpuarch.attn_implementation("flash_attention_2", env=AMPERE) == "sdpa"
    assert gpuarch.attn_implementation("eager", env={}) == "eager"
    # A flash_attn module with no spec (find_spec raises): not importable.
    monkeypatch.undo()
    broken = types.ModuleType("flash_attn")
    broken.__spec__ = None
    monkeypatch.setitem(sys.modules, "flash_attn", broken)
    assert gpuarch.attn_implementation("flash_attention_2", env={}) == "sdpa"


def test_the_readme_one_liners_keep_the_applications_choice_outside_gpuarch(fake_torch):
    # VILA: FA2 unconditionally; Zonos: bfloat16. Outside gpuarch (no
    # GPUARCH_* variables) the documented form hands back the application's
    # own value; inside, gpuarch's.
    assert gpuarch.attn_implementation(default="flash_attention_2", env={}) == "flash_attention_2"
    assert gpuarch.torch_dtype(default=fake_torch.bfloat16, env={}) is fake_torch.bfloat16
    assert gpuarch.attn_implementation(default="flash_attention_2", env=TURING_AND_AMPERE) == "sdpa"
    assert gpuarch.torch_dtype(default=fake_torch.bfloat16, env=TURING_AND_AMPERE) is fake_torch.float16
