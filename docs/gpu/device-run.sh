#!/bin/bash
# One device run, as the `run` tool of the workplace makes it: from a copy
# of the checkout with .gpu-bundle (scripts/gpu-check bundle) beside it, on
# the GPU host, writing under $OUT. What the host holds, then every part of
# scripts/gpu-check.
set -u
O=${OUT:-/tmp/device-out}
mkdir -p "$O"
exec > >(tee -a "$O/run.log") 2>&1
echo "== $(date -u +%FT%TZ) start"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
(nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2
command -v python3
python3 - <<'PY'
import sys
try:
    import torch
    print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
          "archs", torch.cuda.get_arch_list(), "cap", torch.cuda.get_device_capability())
except Exception as e:
    print("torch:", e)
PY
python3 -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|accelerate|flash|xformers|deepspeed|vllm|numpy|pybind11) '
echo "== gpu-check, all parts"
timeout "${GC_TIMEOUT:-480}" python3 scripts/gpu-check run --out "$O/gc"
rc=$?
echo "== $(date -u +%FT%TZ) end rc=$rc"
