"""Part 4: the consumers (torch's cpp_extension, transformers,
accelerate) under gpuarch's Plan."""

import json
import os
import sys

from gpu_check.common import check, sh
from gpu_check.tools import cuobjdump_targets, software_args


EXT_CU = r"""
#include <torch/extension.h>
__global__ void twice(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
torch::Tensor run(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    twice<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""

EXT_PY = r"""
import json, sys, time
t = time.perf_counter()
from torch.utils import cpp_extension
import torch
m = cpp_extension.load(name="gpuarch_probe", sources=[sys.argv[1]], verbose=False)
load_s = time.perf_counter() - t
x = torch.arange(1000, dtype=torch.float32, device="cuda")
ok = bool(torch.equal(m.run(x), 2 * x))
print(json.dumps({"load_s": load_s, "ok": ok, "so": m.__file__,
                  "arch_flags": cpp_extension._get_cuda_arch_flags()}))
"""

HF_PY = r"""
import json, os, sys
import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM
impl = sys.argv[1]
dtype = getattr(torch, os.environ["GPUARCH_DTYPE"])
cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
out = {"impl": impl, "dtype": str(dtype), "transformers": transformers.__version__}
try:
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=impl, dtype=dtype).cuda()
    ids = torch.randint(0, 256, (2, 32), device="cuda")
    with torch.no_grad():
        logits = model(ids).logits
    out.update(ok=bool(torch.isfinite(logits.float()).all()), used=model.config._attn_implementation,
               logits_dtype=str(logits.dtype))
except Exception as e:
    out.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
print(json.dumps(out))
"""

ACC_PY = r"""
import json
from accelerate import Accelerator
a = Accelerator()
print(json.dumps({"mixed_precision": a.mixed_precision}))
"""


def part4(host):
    rc, out, err = host.ctl("plan", "--devices", "0", *software_args(sys.executable), "--json")
    if rc != 0:
        return check("consumers", "plan", False, f"gpuarchctl plan: {err.strip()}")
    plan = json.loads(out)["env"]
    host.plan_env = plan
    check("consumers", "plan", "TORCH_CUDA_ARCH_LIST" in plan,
          " ".join(f"{k}={v}" for k, v in sorted(plan.items())), env=plan)
    env = dict(os.environ, **plan, PYTHONUNBUFFERED="1")
    # The per-arch JIT cache the consumers issue lays out:
    # <cache>/jit/<scope>/<arch-set>/torch_extensions.
    arch_set = plan["TORCH_CUDA_ARCH_LIST"].replace(";", "_")
    ext_dir = os.path.join(host.tmp, "jit/default", arch_set, "torch_extensions")
    env["TORCH_EXTENSIONS_DIR"] = ext_dir
    src = os.path.join(host.tmp, "gpuarch_probe.cu")
    open(src, "w").write(EXT_CU)
    py = os.path.join(host.tmp, "ext.py")
    open(py, "w").write(EXT_PY)
    runs = []
    for attempt in ("first", "second"):
        rc, out, err = sh([sys.executable, py, src], env=env, timeout=580)
        if rc != 0:
            return check("consumers", f"cpp_extension {attempt}", False, err.strip()[-500:])
        runs.append(json.loads(out.strip().splitlines()[-1]))
    first, second = runs
    targets, why = cuobjdump_targets(host.cuobjdump(), first["so"])
    want = {f"sm_{c.replace('.', '')}" for c in plan["TORCH_CUDA_ARCH_LIST"].split(";")}
    check("consumers", "cpp_extension build", first["ok"] and targets == want,
          f"TORCH_CUDA_ARCH_LIST={plan['TORCH_CUDA_ARCH_LIST']}: torch passed "
          f"{' '.join(first['arch_flags'])}; the .so carries {sorted(targets or [])} "
          f"(wanted {sorted(want)}); the kernel ran and was right: {first['ok']}",
          flags=first["arch_flags"], targets=sorted(targets or []), error=why)
    check("consumers", "cpp_extension cache", second["ok"] and second["so"] == first["so"]
          and second["load_s"] < first["load_s"],
          f"first process built it in {first['load_s']:.1f} s, a second with the same "
          f"TORCH_EXTENSIONS_DIR loaded it in {second['load_s']:.2f} s "
          f"(saved {first['load_s'] - second['load_s']:.1f} s per container start)",
          first_s=first["load_s"], second_s=second["load_s"])
    # transformers with the attention and dtype hints as given, and with
    # sdpa, which needs no extra package.
    hf = os.path.join(host.tmp, "hf.py")
    open(hf, "w").write(HF_PY)
    hinted = plan.get("GPUARCH_ATTN_IMPLEMENTATION", "sdpa")
    for impl in dict.fromkeys([hinted, "sdpa"]):
        rc, out, err = sh([sys.executable, hf, impl], env=env, timeout=300)
        r = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else \
            {"ok": False, "error": err.strip()[-400:]}
        label = "transformers " + ("hinted " if impl == hinted else "") + impl
        check("consumers", label, r["ok"] or impl == hinted,
              (f"tiny Llama, {r.get('dtype')}, attn {r.get('used')}: forward pass finite"
               if r["ok"] else f"does not load: {r.get('error')}")
              + ("" if r["ok"] or impl != hinted else
                 " (recorded, not failed: the hint names an implementation this image lacks)"),
              result=r)
    acc = os.path.join(host.tmp, "acc.py")
    open(acc, "w").write(ACC_PY)
    mp = "bf16" if plan.get("GPUARCH_DTYPE") == "bfloat16" else "fp16"
    rc, out, err = sh([sys.executable, acc], env=dict(env, ACCELERATE_MIXED_PRECISION=mp))
    got = json.loads(out.strip().splitlines()[-1])["mixed_precision"] if rc == 0 else None
    check("consumers", "accelerate", got == mp,
          f"ACCELERATE_MIXED_PRECISION={mp} -> Accelerator().mixed_precision={got!r}"
          + ("" if rc == 0 else f": {err.strip()[-300:]}"))
