"""The experimental fp8-KV decode kernel (plugins/attention/_fp8_kv_decode.py) against a float64 reference on the
dequantized e4m3 cache: Triton's conversion (deq 0) and the bit trick in integer ops (deq 2, value * 2**-8 with
the 2**8 folded into the scales), register double buffering on and off, GQA 4 and 2, contexts across several key
tiles and a context shorter than one tile, shuffled blocks, k/v scales. TRITON_INTERPRET=1 in a subprocess
(~15 s on the shared CPU); the same script runs compiled on a GPU (``gpu`` marker) and there also checks deq 1
(the PTX bit trick) and deq 3 (Triton's conversion as pinned inline PTX), which the interpreter cannot run. On CPU
also through the ``triton`` backend: ``OCTAVO_FP8_KV_DECODE`` routes the decode rows here (decode-only and mixed
steps) with the table kernel's outputs, and malformed values are refused.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.quant.fp8_inputs import needs_cuda

SCRIPT = r"""
import os
import torch
from octavo.plugins.attention._fp8_kv_decode import fp8_kv_decode
from octavo.plugins.attention._triton_decode import longest_first
from tests.quant.fp8_attn_cases import paged_case, reference

PAGE = 16
DEV = torch.device(os.environ.get("DECODE_TEST_DEVICE", "cpu"))
gen = torch.Generator().manual_seed(0)
E4M3 = torch.float8_e4m3fn


def _edge_values(k):  # e4m3 subnormals, a large value, -0
    k[1, 0, 0, :4] = torch.tensor([1e-3, -2e-3, 400.0, -0.0])


def run(heads, kv_heads, d, ctx, ks, vs, deqs, block_n, combos=None):
    q, kc, vc, kf, vf, bt, tables = paged_case(gen, heads, kv_heads, d, ctx, E4M3, torch.bfloat16, ks, vs, PAGE,
                                               k_edit=_edge_values)
    want = reference(q, kf, vf, tables, ctx, d ** -0.5)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    qsl = torch.arange(len(ctx) + 1, dtype=torch.int32, device=DEV)
    combos = combos or [(deq, prefetch, ordered, None) for deq in deqs for prefetch in (True, False)
                        for ordered in (False, True)]
    for deq, prefetch, ordered, maxnreg in combos:
        out = torch.full_like(q, float("nan")).to(DEV)
        fp8_kv_decode(q.to(DEV), kc.to(DEV), vc.to(DEV), out, bt.to(DEV), lens, qsl, num_reqs=len(ctx),
                      num_kv_heads=kv_heads, scale=d ** -0.5 * ks, v_scale=vs, block_size=PAGE,
                      block_n=block_n, deq=deq, prefetch=prefetch, maxnreg=maxnreg,
                      num_stages=1 if deq == 3 else None,
                      order=longest_first(lens, len(ctx)) if ordered else None)
        err = float((out.cpu().double() - want).abs().max() / want.abs().max())
        # bf16 output (2**-9 relative) + fp16 P and Q in the dots: 1e-2 of the largest output
        assert err <= 1e-2, (heads, kv_heads, d, deq, prefetch, ordered, err)
        print("ok", heads, kv_heads, d, "deq", deq, "prefetch", prefetch, "ordered", ordered, f"{err:.2e}")


CUDA_COMBOS = [(3, False, True, 128), (3, False, False, None), (0, False, True, None), (1, False, True, None),
               (2, False, True, None), (0, True, True, None)]  # (deq, prefetch, ordered, maxnreg); first = TABLE's
if DEV.type == "cuda":  # the benchmarked shape only (each launch config compiles): Llama-3-8B heads, 128-key tiles
    run(32, 8, 128, [1000, 1500, 7, 2000], 0.05, 0.02, (), 128, CUDA_COMBOS)
else:
    run(8, 2, 64, [1, 17, 70, 130], 0.5, 0.25, (0, 2), 32)
    run(16, 4, 32, [5, 64, 16], 1.0, 2.0, (0, 2), 16)

# through the triton backend: OCTAVO_FP8_KV_DECODE routes an e4m3 cache's decode rows (a decode-only step, and the
# leading decodes of a step with a prefill chunk) to this kernel; 0 keeps the table kernel; same outputs
if DEV.type == "cpu":
    import octavo.plugins.attention._fp8_kv_decode as fk
    from octavo.plugins.attention.triton import TritonAttentionBackend
    from octavo.testing.attention import make_layout

    CALLS = []
    _orig = fk.fp8_kv_decode
    fk.fp8_kv_decode = lambda *a, **kw: (CALLS.append(kw["num_reqs"]), _orig(*a, **kw))[1]
    ctx = [9, 40, 77]
    outs = {}
    for flag in ("0", "block_n=16,warps=4,stages=1,deq=0"):
        os.environ["OCTAVO_FP8_KV_DECODE"] = flag
        impl = TritonAttentionBackend(num_heads=8, head_size=32, num_kv_heads=2, scale=32 ** -0.5)
        impl.k_scale, impl.v_scale = 0.5, 0.25
        g = torch.Generator().manual_seed(1)
        cache = torch.zeros(2, 40, PAGE, 2, 32, dtype=E4M3)
        tables = [[1, 2], [3, 4, 5], [6, 7, 8, 9, 10], [11, 12]]

        def step(layout, g=g, impl=impl, cache=cache):
            md = TritonAttentionBackend.build_metadata(layout, DEV)
            n = layout.num_tokens
            k, v = torch.randn(n, 2, 32, generator=g) * 4, torch.randn(n, 2, 32, generator=g) * 2
            return impl.forward(torch.randn(n, 8, 32, generator=g), k, v, cache, md)

        CALLS.clear()
        step(make_layout(tables[:3], [0, 0, 0], [c - 2 for c in ctx], PAGE))
        got = (step(make_layout(tables[:3], [c - 2 for c in ctx], [1, 1, 1], PAGE)),
               step(make_layout(tables, [c - 1 for c in ctx] + [0], [1, 1, 1, 20], PAGE)))
        assert CALLS == ([] if flag == "0" else [3, 3]), (flag, CALLS)
        outs[flag] = got
    for a, b in zip(*outs.values()):
        err = float((a.double() - b.double()).abs().max() / b.double().abs().max())
        assert err <= 1e-2, err
    print("ok backend", CALLS)
    for bad in ("block_n=128", "block_n=100,warps=4,stages=1,deq=3", "on"):
        os.environ["OCTAVO_FP8_KV_DECODE"] = bad
        try:
            fk.fp8_launch(E4M3, 4, 128)
            raise AssertionError(bad)
        except ValueError as e:
            assert "OCTAVO_FP8_KV_DECODE" in str(e)
    os.environ["OCTAVO_FP8_KV_DECODE"] = ""  # the measured TABLE: Llama-3-8B's e4m3 shape only
    assert fk.fp8_launch(E4M3, 4, 128)["deq"] == 3 and fk.fp8_launch(E4M3, 2, 128) is None
    assert fk.fp8_launch(torch.float8_e5m2, 4, 128) is None and fk.fp8_launch(E4M3, 4, 96) is None
    os.environ["OCTAVO_FP8_KV_DECODE"] = "0"
    assert fk.fp8_launch(E4M3, 4, 128) is None
    os.environ["OCTAVO_FP8_KV_DECODE"] = "block_n=64,warps=4,stages=1,deq=3,maxnreg=96"
    assert fk.fp8_launch(E4M3, 2, 64) == dict(block_n=64, num_warps=4, num_stages=1, deq=3, maxnreg=96,
                                              prefetch=False)
    os.environ["OCTAVO_FP8_KV_DECODE"] = ""
print("PASS")
"""


def _run(env_extra):
    env = {**os.environ, **env_extra}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_fp8_kv_decode_interpreted():
    out = _run({"TRITON_INTERPRET": "1", "DECODE_TEST_DEVICE": "cpu"})
    assert out.count("ok ") == 2 * 2 * 2 * 2 + 1 and "ok backend [3, 3]" in out


@pytest.mark.gpu
@needs_cuda
def test_fp8_kv_decode_on_cuda():
    out = _run({"DECODE_TEST_DEVICE": "cuda"})
    assert out.count("ok ") == 6
