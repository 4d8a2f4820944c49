"""The fp8 gate/up GEMV with SiLU-and-mul in its epilogue (plugins/quant/fp8_silu_gemv.py).

CPU: the Triton interpreter (child process) runs the kernel against the unfused path it replaces (the fp8 GEMV
+ SiLU-and-mul with torch's roundings), on its own quantization and on a producer's e4m3 input; an MLP with
LlamaMLP's forward gets wrapped (after the load-time check) and gives the unfused MLP's rows at one row, the
unfused forward at more rows or when switched off; an MLP with another forward is left alone. GPU-marked: the
8B gate_up shape, compiled, against the unfused path, eager and in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from tests.quant.fp8_inputs import interpreter_only, needs_cuda

pytest.importorskip("triton")

MLP = r"""
import torch
from torch import nn
from octavo.nn.activation import SiluAndMul
from octavo.nn.linear import ReplicatedLinear
from octavo.plugins.quant.fp8 import _FP8Method


class MLP(nn.Module):
    def __init__(self, d, inter, device, gemv=True):
        super().__init__()
        with torch.device(device):
            self.gate_up_proj = ReplicatedLinear(d, 2 * inter, quant_method=_FP8Method(False))
            self.down_proj = ReplicatedLinear(inter, d, quant_method=_FP8Method(False))
            self.act_fn = SiluAndMul()
        gen = torch.Generator(device=device).manual_seed(0)
        for layer in (self.gate_up_proj, self.down_proj):
            w = torch.randn(layer.output_size, layer.input_size, generator=gen, device=device) * 0.05
            for name, value in layer.quant_method.convert({"weight": w}, "t").items():
                getattr(layer, name).data.copy_(value)
            layer.process_weights_after_loading()
            layer.quant_method.fused = True
            layer.quant_method.gemv_max_m = 1 if gemv else 0  # CPU tensors: set the one-row GEMV by hand

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # [n, hidden]


class OtherMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)) * 2)
"""

INTERPRETED = MLP + r"""
from octavo.plugins.quant import fp8_silu_gemv as fs
from octavo.plugins.quant.fp8 import quantize_fp8_rows
from octavo.plugins.quant.fp8_gemv import fp8_gemv
from octavo.plugins.quant.fp8_triton import quantize_per_token_torch
from tests.quant.fp8_inputs import assert_each_refused


def unfused(y2):  # cuda_fusions' SiLU-and-mul roundings, in torch
    i = y2.shape[-1] // 2
    g, u = y2[:, :i].float(), y2[:, i:].float()
    return ((g / (1 + torch.exp(-g))).bfloat16().float() * u).bfloat16()


def close(got, want):  # the interpreter's fp32 -> bf16 cast truncates: two bf16 steps of the output
    d = (got.float() - want.float()).abs()
    return bool((d <= 2.0 ** -6 * want.float().abs() + 1e-6).all())


gen = torch.Generator().manual_seed(0)
for i, k in [(40, 200), (17, 64), (64, 96)]:
    w, ws = quantize_fp8_rows(torch.randn(2 * i, k, generator=gen))
    x = torch.randn(1, k, generator=gen).bfloat16()
    assert close(fs.fp8_gemv_silu(x, w, ws), unfused(fp8_gemv(x, w, ws))), (i, k)
    xq, xs = quantize_per_token_torch(x)
    got = fs.fp8_gemv_silu(xq, w, ws, xs)
    assert close(got, unfused(fp8_gemv(xq, w, ws, x_scale=xs))), (i, k, "prequantized")
    assert torch.equal(got, fs.fp8_gemv_silu(x, w, ws)), (i, k, "producer quantization = own")
assert_each_refused((lambda: fs.fp8_gemv_silu(torch.zeros(2, k).bfloat16(), w, ws),
                     lambda: fs.fp8_gemv_silu(xq, w, ws)))

mlp, plain = MLP(96, 48, "cpu"), MLP(96, 48, "cpu")
other = OtherMLP(96, 48, "cpu")
assert fs.fuse_fp8_silu_gemv(torch.nn.Sequential(mlp, other, MLP(96, 48, "cpu", gemv=False)), torch.device("cpu")) == 1
assert "forward" in vars(mlp) and "forward" not in vars(other)
fs.STATE["on"] = True
x = torch.randn(3, 96, generator=gen).bfloat16()
gu = mlp.gate_up_proj
one = mlp(x[:1])  # one row: the fused kernel, then down_proj (the kernel's accuracy is checked above)
assert torch.equal(one, mlp.down_proj(fs.fp8_gemv_silu(x[:1], gu.weight, gu.weight_scale))), "one row: fused"
ref = plain(x[:1]).float()  # down_proj re-quantizes its input: a bf16 step there can move one e4m3 step
assert float((one.float() - ref).abs().max()) <= 5e-2 * float(ref.abs().max()), "one row: near the unfused MLP"
assert torch.equal(mlp(x), plain(x)), "three rows: the unfused forward"
x1 = x[:1].clone()
x1._octavo_fp8 = quantize_per_token_torch(x1)  # as the quantizing norm hands it over
assert torch.equal(mlp(x1), mlp(x[:1]))
fs.STATE["on"] = False
assert torch.equal(mlp(x[:1]), plain(x[:1])), "switched off: the unfused forward"
print("ok")
"""


@interpreter_only
def test_fp8_gemv_silu_interpreted_matches_the_unfused_path():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(INTERPRETED)


@pytest.mark.gpu
@needs_cuda
def test_fp8_gemv_silu_on_cuda_in_a_graph():
    from octavo.plugins.quant import fp8_silu_gemv as fs
    from tests.quant.fp8_inputs import assert_graph_replays_match

    scope: dict = {}
    exec(MLP, scope)  # noqa: S102 - the MLP shared with the interpreter test
    mlp, plain = scope["MLP"](4096, 14336, "cuda"), scope["MLP"](4096, 14336, "cuda")
    for m in (mlp, plain):
        m.gate_up_proj.quant_method.process_weights_after_loading(m.gate_up_proj)  # the GEMV, tuned and checked
        m.down_proj.quant_method.process_weights_after_loading(m.down_proj)
    assert mlp.gate_up_proj.quant_method.gemv_max_m == 1
    assert fs.fuse_fp8_silu_gemv(mlp, torch.device("cuda")) == 1
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(4, 1, 4096, device="cuda", dtype=torch.bfloat16)
    old = fs.STATE["on"]
    try:
        fs.STATE["on"] = True
        with torch.inference_mode():
            gu = mlp.gate_up_proj
            launch = fs._launch(gu, x.device)  # the wrapper's settings: PDL + early weight block on sm_90, split acc
            got = fs.fp8_gemv_silu(x, gu.weight, gu.weight_scale, **launch)
            plain_launch = {**launch, "pdl": False, "pdl_w": False}  # PDL only moves the wait: the same bits
            for cfg in ((8, 1024, 4), (16, 512, 4), None):  # None: the gate_up GEMV's tuned tile
                assert torch.equal(fs.fp8_gemv_silu(x, gu.weight, gu.weight_scale, config=cfg, **launch),
                                   fs.fp8_gemv_silu(x, gu.weight, gu.weight_scale, config=cfg, **plain_launch))
            from octavo.plugins.platforms.cuda_fusions import silu_and_mul  # the engine's SiLU-and-mul kernel

            want = silu_and_mul(plain.gate_up_proj(x))  # the unfused GEMV (tuned tile) + SiLU-and-mul kernel
            d = (got.float() - want.float()).abs()
            assert torch.equal(got, want), float(d.max())  # the GEMV's tile and sums, the SiLU kernel's roundings
            assert torch.equal(mlp(x), mlp.down_proj(got))  # the wrapper: the kernel, then down_proj

            def block():
                return (mlp(x),)

            assert_graph_replays_match(block, block, x, src)  # replayed == eager on each new input
    finally:
        fs.STATE["on"] = old
