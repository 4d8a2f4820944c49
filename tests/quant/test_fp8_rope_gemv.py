"""The fp8 qkv GEMV with the rotary embedding in its epilogue (plugins/quant/fp8_rope_gemv.py).

CPU: the Triton interpreter (child process) runs the kernel against the unfused path it replaces (the fp8 GEMV,
then the rotary embedding's torch arithmetic on the rounded outputs), on its own quantization and on a producer's
e4m3 input, at several positions and head layouts; an attention with LlamaAttention's forward gets wrapped (after
the load-time check) and hands attention the fused kernel's q, k, v at one row, the unfused ones at more rows or when
switched off; another forward is left alone. GPU-marked: the 8B qkv shape, compiled, against the fp8 GEMV +
the platform's rotary kernel (bit for bit with the GEMV's tuned tile), PDL on/off bit for bit, and in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from tests.quant.fp8_inputs import interpreter_only, needs_cuda

pytest.importorskip("triton")

INTERPRETED = r"""
import torch
from octavo.nn.rotary import get_rope
from octavo.plugins.quant import fp8_rope_gemv as fr
from octavo.plugins.quant.fp8 import quantize_fp8_rows
from octavo.plugins.quant.fp8_gemv import fp8_gemv
from octavo.plugins.quant.fp8_triton import quantize_per_token_torch
from tests.quant.fp8_inputs import assert_each_refused


def unfused(y, rope, pos, hq, hk, d):  # the GEMV's bf16 outputs, rotated by the module's torch path
    q, k, v = y.split([hq * d, hk * d, hk * d], -1)
    q, k = rope(pos, q, k)
    return torch.cat([q, k, v], -1)


def close(got, want):  # the interpreter's fp32 -> bf16 cast truncates: two bf16 steps of the output
    d = (got.float() - want.float()).abs()
    return bool((d <= 2.0 ** -6 * want.float().abs() + 1e-6).all())


gen = torch.Generator().manual_seed(0)
for hq, hk, d, k in [(4, 2, 16, 64), (2, 1, 32, 96), (8, 2, 8, 128)]:
    rope = get_rope(d, 4096, 10000.0, None)
    n = (hq + 2 * hk) * d
    w, ws = quantize_fp8_rows(torch.randn(n, k, generator=gen))
    x = torch.randn(1, k, generator=gen).bfloat16()
    xq, xs = quantize_per_token_torch(x)
    for p in (0, 5, 4000):
        pos = torch.tensor([p])
        args = (w, ws, pos, rope.cos_cache, rope.sin_cache, d, (hq + hk) * d)
        # the GEMV's tile and accumulator: its bits (position 0 rotates by nothing); then the same rotation, whose
        # rounding to bf16 the interpreter truncates (torch rounds): within that elsewhere
        same = torch.equal if p == 0 else close
        got = fr.fp8_gemv_rope(x, *args)
        assert same(got, unfused(fp8_gemv(x, w, ws), rope, pos, hq, hk, d)), (hq, hk, d, k, p)
        pre = fr.fp8_gemv_rope(xq, *args, x_scale=xs)
        assert same(pre, unfused(fp8_gemv(xq, w, ws, x_scale=xs), rope, pos, hq, hk, d)), (hq, hk, d, p)
        assert torch.equal(got, pre), (hq, hk, d, p, "producer quantization = own")
assert_each_refused((lambda: fr.fp8_gemv_rope(torch.zeros(2, k).bfloat16(), *args),
                     lambda: fr.fp8_gemv_rope(xq, *args),
                     lambda: fr.fp8_gemv_rope(x, *args, pdl=True)))

# the wrapper: an attention with LlamaAttention's forward code gets wrapped after the load-time check; at one row it
# gives the fused kernel's q, k, v to attn, at more rows (or switched off) the unfused forward; another forward not
from torch import nn
from octavo.nn.linear import ReplicatedLinear
from octavo.plugins.quant.fp8 import _FP8Method


class Attn(nn.Module):
    def __init__(self, hq, hk, d, hidden, gemv=True):
        super().__init__()
        self.q_size, self.kv_size = hq * d, hk * d
        self.qkv_proj = ReplicatedLinear(hidden, (hq + 2 * hk) * d, quant_method=_FP8Method(False))
        gen = torch.Generator().manual_seed(3)
        w = torch.randn((hq + 2 * hk) * d, hidden, generator=gen) * 0.05
        for name, value in self.qkv_proj.quant_method.convert({"weight": w}, "t").items():
            getattr(self.qkv_proj, name).data.copy_(value)
        self.qkv_proj.process_weights_after_loading()
        self.qkv_proj.quant_method.fused = True
        self.qkv_proj.quant_method.gemv_max_m = 1 if gemv else 0
        self.rotary_emb = get_rope(d, 512, 10000.0, None)
        self.o_proj = nn.Identity()
        self.attn = lambda q, k, v, ctx: torch.cat([q, k, v], -1)  # what attention was handed

    def forward(self, positions, hidden_states, ctx):
        qkv = self.qkv_proj(hidden_states)  # [n, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, ctx))  # [n, hidden]


class OtherAttn(Attn):
    def forward(self, positions, hidden_states, ctx):
        return self.qkv_proj(hidden_states)


att, plain, other = Attn(4, 2, 16, 64), Attn(4, 2, 16, 64), OtherAttn(4, 2, 16, 64)
assert fr.fuse_fp8_rope_gemv(nn.Sequential(att, other, Attn(4, 2, 16, 64, gemv=False)), torch.device("cpu")) == 1
assert "forward" in vars(att) and "forward" not in vars(other)
fr.STATE["on"] = True
x = torch.randn(3, 64, generator=gen).bfloat16()
pos = torch.tensor([37])
one = att(pos, x[:1], None)
qkv = att.qkv_proj
assert torch.equal(one, fr.fp8_gemv_rope(x[:1], qkv.weight, qkv.weight_scale, pos, att.rotary_emb.cos_cache,
                                         att.rotary_emb.sin_cache, 16, 6 * 16)), "one row: the fused kernel"
assert close(one, plain(pos, x[:1], None)), "one row: the unfused forward (interpreter: truncating casts)"
assert torch.equal(att(torch.tensor([0]), x[:1], None), plain(torch.tensor([0]), x[:1], None)), "position 0: bits"
x1 = x[:1].clone()
x1._octavo_fp8 = quantize_per_token_torch(x1)  # as the quantizing norm hands it over
assert torch.equal(att(pos, x1, None), one)
pos3 = torch.tensor([1, 2, 3])
assert torch.equal(att(pos3, x, None), plain(pos3, x, None)), "three rows: the unfused forward"
fr.STATE["on"] = False
assert torch.equal(att(pos, x[:1], None), plain(pos, x[:1], None)), "switched off: the unfused forward"
print("ok")
"""


@interpreter_only
def test_fp8_gemv_rope_interpreted_matches_the_unfused_path():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(INTERPRETED)


@pytest.mark.gpu
@needs_cuda
def test_fp8_gemv_rope_on_cuda_pdl_and_graph():
    from octavo.nn.rotary import get_rope
    from octavo.plugins.platforms.cuda_fusions import rotary
    from octavo.plugins.quant import fp8_gemv as fg
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from octavo.plugins.quant.fp8_rope_gemv import fp8_gemv_rope
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    torch.manual_seed(0)
    hq, hk, d, k = 32, 8, 128, 4096
    with torch.device("cuda"):
        rope = get_rope(d, 8192, 500000.0, None)
    w, ws = quantize_fp8_rows(torch.randn((hq + 2 * hk) * d, k, device="cuda") * 0.05)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = quantize_per_token(x)
    pos = torch.tensor([777], device="cuda")
    args = (w, ws, pos, rope.cos_cache, rope.sin_cache, d, (hq + hk) * d)
    with torch.inference_mode():
        for split, cfg in ((0, (16, 512, 4)), (fg.ACC_SPLIT, (8, 1024, 4)), (fg.ACC_SPLIT, None), (0, None)):
            got = fp8_gemv_rope(xq, *args, x_scale=xs, acc_split=split, config=cfg)
            assert torch.equal(got, fp8_gemv_rope(xq, *args, x_scale=xs, acc_split=split, pdl=True, pdl_w=True,
                                                  config=cfg)), "PDL moves only the wait"
            y = fp8_gemv(xq, w, ws, x_scale=xs, out_dtype=torch.bfloat16, acc_split=split)
            q, kk = rotary(rope, pos, y[:, :hq * d], y[:, hq * d:(hq + hk) * d])
            want = torch.cat([q, kk, y[:, (hq + hk) * d:]], -1).float()
            diff = (got.float() - want).abs()
            if cfg is None:  # the GEMV's own tuned tile: its bits, then the rotary kernel's
                assert torch.equal(got.float(), want), float(diff.max())
            else:  # another tile sums in another order: an output a bf16 step apart
                assert bool((diff <= 2.0**-6 * want.abs() + 1e-6).all()), float(diff.max())
        src, buf = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(3)], x.clone()
        g = torch.cuda.CUDAGraph()
        kw = dict(acc_split=fg.ACC_SPLIT, config=(16, 512, 4))
        fp8_gemv_rope(buf, *args, pdl=True, pdl_w=True, **kw)  # compile outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            out = fp8_gemv_rope(buf, *args, pdl=True, pdl_w=True, **kw)
        for i, s in enumerate(src):
            buf.copy_(s)
            pos.fill_(100 * i + 3)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, fp8_gemv_rope(s, *args, **kw)), i
