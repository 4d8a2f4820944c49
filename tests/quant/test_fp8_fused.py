"""fp8 activation quantization fused into RMSNorm and SiLU-and-mul (plugins/quant/fp8_fused.py).

On CPU machines the Triton interpreter (child process) checks: the kernels' bf16 outputs against the eager
``octavo.nn`` layers, their e4m3 bytes and scales equal to ``quantize_per_token`` of those outputs, and the
one-forward linking on a loader-built fp8 Llama (fp8 matmuls by torch's CPU ``_scaled_mm``): both norms and
SiLU-and-mul get linked, only o_proj still quantizes its input, and the logits keep the same bits. ``GPU_CHECKS`` (also run by benchmarks/fp8perf.py) repeat this on a GPU against
the cuda platform's plain fused kernels, and replay the linked block from a CUDA graph.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

BLOCK_MODEL = r"""
import torch
from torch import nn
from octavo.nn.activation import SiluAndMul
from octavo.nn.layernorm import RMSNorm
from octavo.nn.linear import ReplicatedLinear
from octavo.plugins.quant.fp8 import _FP8Method


class Block(nn.Module):
    def __init__(self, d, inter, device):
        super().__init__()
        with torch.device(device):
            self.norm = RMSNorm(d, eps=1e-5).to(torch.bfloat16)
            self.up = ReplicatedLinear(d, 2 * inter, quant_method=_FP8Method(False))
            self.act = SiluAndMul()
            self.down = ReplicatedLinear(inter, d, quant_method=_FP8Method(False))
        gen = torch.Generator(device=device).manual_seed(0)
        for layer in (self.up, self.down):
            w = torch.randn(layer.output_size, layer.input_size, generator=gen, device=device) * 0.05
            for name, value in layer.quant_method.convert({"weight": w}, "t").items():
                getattr(layer, name).data.copy_(value)
            layer.process_weights_after_loading()
            layer.quant_method.fused = True  # the Triton per-token kernel (interpreted on CPU)
            layer.quant_method.gemv_max_m = 0
        self.norm.weight.data.copy_(1 + 0.1 * torch.randn(d, generator=gen, device=device))

    def forward(self, x, residual):
        h, residual = self.norm(x, residual)
        return self.down(self.act(self.up(h))), residual
"""

INTERPRETED = r"""
import torch
from octavo.nn.activation import SiluAndMul
from octavo.nn.layernorm import RMSNorm
from octavo.plugins.quant import fp8_triton
from octavo.plugins.quant.fp8 import _FP8Method
from octavo.plugins.quant.fp8_fused import link_fp8_inputs, rms_norm_quant, silu_and_mul_quant

gen = torch.Generator().manual_seed(1)
# 1. kernels vs the eager layers and vs quantize_per_token of their own output
for rows, d in [(3, 64), (2, 200)]:
    norm = RMSNorm(d, eps=1e-5).to(torch.bfloat16)
    norm.weight.data.copy_(1 + 0.1 * torch.randn(d, generator=gen))
    x = (torch.randn(rows, d, generator=gen) * 4).bfloat16()
    r = torch.randn(rows, d, generator=gen).bfloat16()
    for res in (None, r):
        out, new_res, q, s = rms_norm_quant(x, norm.weight, norm.eps, res, q_dtype=torch.float32)
        want = norm(x) if res is None else norm(x, res)
        w0 = want if res is None else want[0]
        assert torch.allclose(out.float(), w0.float(), rtol=1.6e-2, atol=1.6e-2), (rows, d)
        if res is not None:  # one bf16 step: the interpreter's own fp32 -> bf16 rounding is not torch's
            assert torch.allclose(new_res.float(), want[1].float(), rtol=2 ** -7, atol=0)
        rq, rs = fp8_triton.quantize_per_token_torch(out)
        assert torch.equal(s, rs) and torch.equal(q, rq.float()), (rows, d, res is None)
for rows, d in [(2, 48), (3, 5000)]:  # 5000: two blocks, the second pass reads back the first
    x = (torch.randn(rows, 2 * d, generator=gen) * 3).bfloat16()
    x[1] = 0
    out, q, s = silu_and_mul_quant(x, q_dtype=torch.float32)
    assert torch.allclose(out.float(), SiluAndMul()(x).float(), rtol=1.6e-2, atol=1e-2), (rows, d)
    rq, rs = fp8_triton.quantize_per_token_torch(out)
    assert torch.equal(s, rs) and torch.equal(q, rq.float()), (rows, d)

# 2. linking on a (1-layer, random) Llama built by the loader with the fp8 quantizer, fp8 matmuls by torch's
#    CPU _scaled_mm, the plain forwards the platform's fused kernels (interpreted too, as on a GPU): after
#    the discovery forward both norms and SiLU-and-mul quantize, only o_proj quantizes its own input, and the
#    logits are the same bits as before linking.
from tests.quant.fp8_tiny_llama import tiny_fp8_llama
from octavo.plugins.platforms.cuda_fusions import fuse_model
from octavo.testing.model import PagedRunner


model = tiny_fp8_llama(1)
methods = [m.quant_method for m in model.modules() if isinstance(getattr(m, "quant_method", None), _FP8Method)]
assert len(methods) == 4 and all(m.gemv_max_m == 0 for m in methods)  # CPU tensors: no GEMV
for m in methods:
    m.fused = True  # the Triton per-token kernel, interpreted
counts = fuse_model(model, torch.bfloat16, torch.device("cpu"))
assert counts["RMSNorm"] == 3 and counts["SiluAndMul"] == 1 and counts["fp8_producers_armed"] == 4, counts
runner = PagedRunner(model, num_blocks=16, device="cpu")
calls = []
real = fp8_triton.quantize_per_token
fp8_triton.quantize_per_token = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
prompts = [[1, 5, 9, 33, 70], [2, 200, 17]]
with torch.inference_mode():
    first = runner.prompts(prompts)  # the discovery forward: plain fused kernels, every linear quantizes
    linked = sorted(n for n, m in model.named_modules() if "_octavo_plain_forward" in vars(m))
    assert linked == ["model.layers.0.input_layernorm", "model.layers.0.mlp.act_fn",
                      "model.layers.0.post_attention_layernorm"], linked
    assert link_fp8_inputs(model) == {"fp8_producers_armed": 1}  # never twice: only the final norm is left
    calls.clear()
    second = runner.prompts(prompts)
assert len(calls) == 1, f"{len(calls)} separate quantizations; only o_proj's input comes from attention"
assert all(torch.equal(a, b) for a, b in zip(first, second))
layer = model.model.layers[0]
# a view carries no quantized copy: the linear quantizes itself, same result
calls.clear()
with torch.inference_mode():
    h = layer.post_attention_layernorm(torch.randn(3, 64).bfloat16())
    assert hasattr(h, "_octavo_fp8") and not hasattr(h[:, :], "_octavo_fp8")
    assert torch.equal(layer.mlp.gate_up_proj(h[:, :]), layer.mlp.gate_up_proj(h)) and len(calls) == 1
print("ok")
"""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="interpreter check for CPU machines; on a GPU the compiled kernels are tested")
def test_fused_fp8_producers_interpreted():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(INTERPRETED)


def test_linking_can_be_turned_off(monkeypatch):
    from torch import nn

    from octavo.plugins.quant.fp8_fused import link_fp8_inputs

    monkeypatch.setenv("OCTAVO_FP8_FUSE_INPUTS", "0")
    assert link_fp8_inputs(nn.Sequential(nn.Linear(2, 2))) == {}


# ---------------------------------------------------------------------------------------------- GPU
def gpu_kernels_check():
    """8B shapes: the quantizing kernels' bf16 outputs equal the platform's plain fused kernels bit for bit,
    and their e4m3 bytes / scales equal quantize_per_token of those outputs."""
    import torch

    from octavo.plugins.platforms.cuda_fusions import rms_norm, silu_and_mul
    from octavo.plugins.quant import fp8_fused
    from octavo.plugins.quant.fp8_fused import rms_norm_quant, silu_and_mul_quant
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (1 + 0.1 * torch.randn(4096, device="cuda", generator=gen)).bfloat16()
    small_warps = fp8_fused.SMALL_ROWS_WARPS
    for rows in (1, 7, 256):
        x = torch.randn(rows, 4096, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
        r = torch.randn(rows, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
        for res in (None, r):
            want = rms_norm(x, w, 1e-5, res)
            want_out = want if res is None else want[0]
            # the plain kernel's warps at every size: its bits exactly; then the default's more warps at <= 4 rows
            # (another fp32 summation order of the sum of squares: within one bf16 step of the plain output)
            for warps in ((None, small_warps) if rows <= 4 and small_warps else (None,)):
                try:
                    fp8_fused.SMALL_ROWS_WARPS = warps
                    out, new_res, q, s = rms_norm_quant(x, w, 1e-5, res)
                finally:
                    fp8_fused.SMALL_ROWS_WARPS = small_warps
                if warps is None:
                    assert torch.equal(out, want_out), rows
                else:
                    diff = (out.float() - want_out.float()).abs()
                    assert bool((diff <= 2.0**-7 * want_out.float().abs()).all()), (rows, warps, float(diff.max()))
                    assert float((diff > 0).float().mean()) < 0.01, (rows, warps)
                if res is not None:
                    assert torch.equal(new_res, want[1])
                rq, rs = quantize_per_token(out)  # the e4m3 copy is always made from this kernel's own output
                assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), rows
        g = torch.randn(rows, 2 * 14336, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
        out, q, s = silu_and_mul_quant(g)
        assert torch.equal(out, silu_and_mul(g)), rows
        rq, rs = quantize_per_token(out)
        assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), rows


def gpu_linked_graph_check():
    """The linked block on the GPU: same bits as unlinked, and a CUDA graph of it replays the eager result."""
    import torch

    from octavo.plugins.platforms.cuda_fusions import fuse_model
    from octavo.plugins.quant.fp8_fused import link_fp8_inputs

    scope: dict = {}
    exec(BLOCK_MODEL, scope)  # noqa: S102 - the block shared with the interpreter test
    block = scope["Block"](4096, 14336, "cuda")
    assert fuse_model(block, torch.bfloat16, torch.device("cuda"))["fp8_producers_armed"] == 2
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(16, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
    r = torch.randn(16, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
    with torch.inference_mode():
        y0, _ = block(x, r)  # discovery
        assert "_octavo_plain_forward" in vars(block.norm) and "_octavo_plain_forward" in vars(block.act)
        assert link_fp8_inputs(block) == {"fp8_producers_armed": 0}
        y1, _ = block(x, r)
        assert torch.equal(y0, y1)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, _ = block(x, r)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, block(x, r)[0])


GPU_CHECKS = {"fused_kernels": gpu_kernels_check, "fused_linked_graph": gpu_linked_graph_check}


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", sorted(GPU_CHECKS))
def test_fused_fp8_producers_on_cuda(name):
    GPU_CHECKS[name]()
