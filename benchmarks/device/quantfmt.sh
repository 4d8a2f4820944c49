#!/usr/bin/env bash
# issue 9 (quantfmt): the 8-bit formats on one GPU, bounded to ~60 s.
#  1. QuantizerContract CUDA tests of compressed-tensors W8A8 (torch._int_mm, padded rows), W4A16 / W8A16
#     asymmetric and GPTQ 8-bit desc_act (the Triton int8 group dequant-GEMM, bf16 path) vs float64 references.
#  2. A microbenchmark: one Llama-3-8B-shaped linear (4096 -> 14336 and 14336 -> 4096) as bf16 F.linear, INT8 W8A8
#     (per-token activation quantization + torch._int_mm + rescale) and the int8 group kernel, at 1 / 16 / 256 rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
D="$OUT/quantfmt"
mkdir -p "$D"
echo "== contract tests (cuda)"
timeout -k 5 35 python -m pytest -q -p no:cacheprovider tests/quant/test_contract_int8.py -k cuda \
  2>&1 | tail -n 25 | tee "$D/pytest_tail.txt"
echo "== microbenchmark"
timeout -k 5 25 python - <<'PY' 2>&1 | tee "$D/bench.txt"
import json, os, torch
from octavo.plugins.quant.int8_w8a8 import int8_gemm, quantize_activations
from octavo.plugins.quant.int8_triton import int8_group_matmul

def t(fn, reps=50):
    for _ in range(3): fn()
    torch.cuda.synchronize(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): fn()
    b.record(); torch.cuda.synchronize(); return a.elapsed_time(b) / reps * 1000  # us

rows = []
for k, n in [(4096, 14336), (14336, 4096)]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    wq = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
    sw = torch.rand(1, n, device="cuda")
    wt = wq.t().contiguous(); s = torch.rand(k // 128, n, device="cuda"); z = torch.zeros_like(s)
    for m in (1, 16, 256):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        def w8a8():
            xq, sx, _ = quantize_activations(x, True, True)
            return (int8_gemm(xq, wq).float() * (sx * sw)).to(torch.bfloat16)
        r = {"k": k, "n": n, "m": m, "bf16_us": t(lambda: torch.nn.functional.linear(x, w)),
             "w8a8_us": t(w8a8), "int8_group_triton_us": t(lambda: int8_group_matmul(x, wt, s, z))}
        print(r, flush=True); rows.append(r)
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(os.path.join(os.environ["OUT"], "quantfmt", "bench.json"), "w"), indent=1)
PY
echo "== done"
