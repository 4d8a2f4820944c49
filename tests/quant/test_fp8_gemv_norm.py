"""The fp8 one-row GEMV with the RMSNorm after it in its tail (plugins/quant/fp8_gemv_norm.py).

CPU (Triton interpreter, child process): the GEMV part equals fp8_gemv bit for bit; the norm part equals
fp8_fused.rms_norm_quant of that output (the interpreter sums both rows alike) and a float64 reference within its two
bf16 roundings; the e4m3 copy is exactly ``quantize_per_token`` of the normed row; the ticket counter is left at zero (a second
launch with it gives the same); on a loader-built 2-layer fp8 Llama the discovery forward pairs o_proj / down with the
norm after them (not the last down: the final norm does not quantize), and greedy decode steps give the same logits
with the lever on and off, with one fused launch per pair a step. sm_90 compile (Triton's own compiler): the table's
o_proj / down launch flags with the tail hold the fence, the acq_rel ticket, the L2 reads and the PDL wait.
GPU-marked: on the 8B shapes, with the engine's launch options (PDL, the table's tile and loop): the GEMV bits; the
norm within two bf16 steps of the norm kernel and within its two roundings of float64, how many elements differ
(printed); the e4m3 copy exact; CUDA-graph replays equal to the eager launch.
"""

from __future__ import annotations

import pytest
import torch

from tests.quant.fp8_inputs import needs_cuda

pytest.importorskip("triton")

KERNEL = r"""
import torch
from octavo.plugins.quant import fp8_triton
from octavo.plugins.quant.fp8_fused import rms_norm_quant
from octavo.plugins.quant.fp8_gemv import fp8_gemv
from octavo.plugins.quant.fp8_gemv_norm import fp8_gemv_norm

gen = torch.Generator().manual_seed(0)
for n, k in [(256, 192), (320, 100), (64, 1024)]:  # 320: the norm block (512) masked; 100: an uneven K
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.float8_e4m3fn)
    ws = torch.rand(n, generator=gen) * 0.02 + 0.01
    x = torch.randn(1, k, generator=gen).bfloat16()
    res = (torch.randn(1, n, generator=gen) * 3).bfloat16()
    nw = (1 + 0.1 * torch.randn(n, generator=gen)).bfloat16()
    cnt = torch.zeros(1, dtype=torch.int32)
    y, out, ro, q, s = fp8_gemv_norm(x, w, ws, res, nw, 1e-5, cnt, q_dtype=torch.float32)
    assert cnt.item() == 0, "the last program resets the ticket counter"
    y0 = fp8_gemv(x, w, ws)
    assert torch.equal(y, y0), (n, k)
    o2, r2, q2, s2 = rms_norm_quant(y0, nw, 1e-5, res, q_dtype=torch.float32)
    assert torch.equal(out, o2) and torch.equal(ro, r2) and torch.equal(q, q2) and torch.equal(s, s2), (n, k)
    # float64: the new residual is the sum within one bf16 step (the interpreter's fp32 -> bf16 rounding is not
    # torch's), the normed row within its two roundings of the exact norm of that residual
    rd = y0.double() + res.double()
    assert ((ro.double() - rd).abs() <= rd.abs() * 2 ** -7).all(), (n, k)
    want = ro.double() * torch.rsqrt(ro.double().pow(2).mean() + 1e-5) * nw.double()
    assert ((out.double() - want).abs() <= want.abs() * 2 ** -6 + 1e-30).all(), (n, k)  # two truncating roundings
    rq, rs = fp8_triton.quantize_per_token_torch(out)
    assert torch.equal(s, rs) and torch.equal(q, rq.float()), (n, k)
    again = fp8_gemv_norm(x, w, ws, res, nw, 1e-5, cnt, q_dtype=torch.float32)  # the same counter, reset
    assert all(torch.equal(a, b) for a, b in zip(again, (y, out, ro, q, s))) and cnt.item() == 0
print("ok")
"""

ENGINE = r"""
import torch
from octavo.plugins.platforms.cuda_fusions import fuse_model
from octavo.plugins.quant import fp8_gemv_norm
from tests.quant.fp8_tiny_llama import tiny_fp8_llama
from octavo.testing.model import PagedRunner


model = tiny_fp8_llama(2, one_row_gemv=True)  # the Triton kernels, interpreted, as on a GPU
fuse_model(model, torch.bfloat16, torch.device("cpu"))
runner = PagedRunner(model, num_blocks=16, device="cpu")
calls = []
real = fp8_gemv_norm.fp8_gemv_norm
fp8_gemv_norm.fp8_gemv_norm = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
with torch.inference_mode():
    runner.prompts([[1, 5, 9, 33, 70]])  # the discovery forward
    paired = sorted(n for n, m in model.named_modules() if "_octavo_norm_tail" in vars(m))
    assert paired == ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj",
                      "model.layers.1.self_attn.o_proj"], paired
    logits = {}
    for on in (False, True, False):
        fp8_gemv_norm.STATE["on"] = on
        key = ("a", on, len(logits))
        runner.step([(key, [3, 7, 11])])
        calls.clear()
        got = [runner.step([(key, [t])])[0] for t in (42, 17, 99, 5)]  # one-row decode steps
        assert len(calls) == (12 if on else 0), (on, len(calls))
        logits[len(logits)] = got
        runner.free(key)
assert all(torch.equal(a, b) for a, b in zip(logits[0], logits[1])), "lever on: other logits"
assert all(torch.equal(a, b) for a, b in zip(logits[0], logits[2]))
print("ok")
"""


def _cuda() -> bool:
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="interpreter check for CPU machines; on a GPU the compiled kernel is tested")
def test_gemv_norm_kernel_interpreted():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(KERNEL)


@pytest.mark.skipif(_cuda(), reason="interpreter check for CPU machines; on a GPU the compiled kernel is tested")
def test_gemv_norm_engine_pairs_and_same_logits_interpreted():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(ENGINE, timeout=600)


def test_sm90_tail_compiles_with_the_table_flags():
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.quant.fp8_gemv_norm import _fp8_gemv_norm_kernel

    sig = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "b_ptr": "*bf16",
           "y_ptr": "*bf16", "pf_ptr": "*fp8e4nv", "pf_total": "i64", "pf_piece": "i64", "N": "i32",
           "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_ym": "i32", "res_ptr": "*bf16",
           "nw_ptr": "*bf16", "out_ptr": "*bf16", "res_out_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32",
           "cnt_ptr": "*i32", "eps": "fp32"}
    consts = dict(M=1, QUANT_X=True, PRE_Q=False, HAS_BIAS=False, EVEN=True, SOFT_FP8=False, BLOCK_N=16,
                  BLOCK_K=1024, PREFETCH=False, USE_PDL=True, SELF_PF=False, W_BITS=False, REG_PF=False, ACC_SPLIT=16,
                  X2D=False, PDL_W=1, AMAX_KP=0, LOOP2=2, NORM_BLOCK=4096, FENCE=True)
    src = triton.compiler.ASTSource(fn=_fp8_gemv_norm_kernel, signature={**sig, **{k: "constexpr" for k in consts}},
                                    constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3}).asm["ptx"]
    for needle in ("fence.acq_rel.gpu", "atom.global.gpu.acq_rel.add", "ld.global.cg", "griddepcontrol.wait"):
        assert needle in ptx, needle


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n,k", [(4096, 4096), (4096, 14336)])
def test_gemv_norm_on_cuda(n, k):
    from octavo.plugins.quant import fp8_triton
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_fused import rms_norm_quant
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from octavo.plugins.quant.fp8_gemv_norm import fp8_gemv_norm
    from octavo.plugins.quant.fp8_prefetch import hopper
    from tests.quant.fp8_inputs import assert_graph_replays_match

    dev = torch.device("cuda")
    torch.manual_seed(0)
    w, ws = quantize_fp8_rows(torch.randn(n, k, device=dev) * 0.05)
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    res = torch.randn(1, n, device=dev, dtype=torch.bfloat16) * 3
    nw = (1 + 0.1 * torch.randn(n, device=dev)).bfloat16()
    cnt = torch.zeros(1, dtype=torch.int32, device=dev)
    launch = dict(pdl=True, pdl_w=1) if hopper(dev) else {}
    fp8_gemv(x, w, ws, **launch)  # tuned (or the table's tile) first: the tail takes the same tile
    differ = 0
    for i in range(5):
        x.copy_(torch.randn(1, k, device=dev, dtype=torch.bfloat16) * (1 + i))
        y, out, ro, q, s = fp8_gemv_norm(x, w, ws, res, nw, 1e-5, cnt, **launch)
        torch.cuda.synchronize()
        assert cnt.item() == 0
        y0 = fp8_gemv(x, w, ws, **launch)
        assert torch.equal(y, y0), i
        o2, r2, q2, s2 = rms_norm_quant(y0, nw, 1e-5, res)
        assert torch.equal(ro, r2), i
        # rstd may differ in its last bits: yv one bf16 step away, the product after the weight's rounding two
        assert ((out.float() - o2.float()).abs() <= o2.float().abs() * 2 ** -6).all(), i
        differ += int((out != o2).sum())
        want = ro.double() * torch.rsqrt(ro.double().pow(2).mean() + 1e-5) * nw.double()
        assert ((out.double() - want).abs() <= want.abs() * 1.01 * 2 ** -7 + 1e-30).all(), i  # two roundings
        rq, rs = fp8_triton.quantize_per_token(out)
        assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), i
    print(f"gemv_norm {n}x{k}: {differ} of {5 * n} normed elements differ from the norm kernel")

    def run():  # the fp8 copy compared as bytes
        return tuple(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t
                     for t in fp8_gemv_norm(x, w, ws, res, nw, 1e-5, cnt, **launch))

    assert_graph_replays_match(run, run, x, [torch.randn(1, k, device=dev, dtype=torch.bfloat16) for _ in range(3)])
