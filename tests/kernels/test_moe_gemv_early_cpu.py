"""The batch-1 GEMV that loads its first K-blocks before the PDL wait (plugins/platforms/cuda_moe_oproj.py; the MoE
attention's ``o_early`` and ``q_early``), on the CPU:

- under the interpreter: ``cuda_fusions._gemv_kernel``'s bits for the same BLOCK_K (PRE 1 / 3 / 8, more blocks than
  K has, ragged N and K), within fp16 rounding of a float64 product;
- compiled for sm_90 by Triton's own compiler (no GPU): the weight loads of the first PRE blocks sit before
  ``griddepcontrol.wait`` and the activation loads after it;
- bad settings are refused with an error naming them.
The GPU side (bit-equal eager and in a graph at Qwen3-30B-A3B's o_proj and qkv) is test_moe_gemv_early_gpu.py.
"""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("triton")

_INTERP = r"""
import torch
from octavo.plugins.platforms.cuda_fusions import _gemv_kernel
from octavo.plugins.platforms.cuda_moe_oproj import gemv_early
g = torch.Generator().manual_seed(9)
for n, k, bn, bk in ((40, 96, 8, 32), (64, 256, 16, 32), (24, 40, 8, 16)):
    w = (torch.randn(n, k, generator=g) * k ** -0.5).half()
    x = torch.randn(1, k, generator=g).half()
    want = torch.empty(1, n, dtype=torch.float16)
    _gemv_kernel[(-(-n // bn),)](x, w, None, want, n, k, w.stride(0), HAS_BIAS=False, EVEN=False, BLOCK_N=bn,
                                 BLOCK_K=bk, PDL=False)
    for pre in (1, 3, 8):
        assert torch.equal(gemv_early(x, w, pre, bn, bk), want), (n, k, pre)
    ref = x.double() @ w.double().t()
    assert float((want.double() - ref).abs().max() / ref.abs().max()) < 2e-3
print("ok")
"""


def test_early_gemv_gives_the_gemv_bits_in_the_interpreter():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(_INTERP)


@pytest.mark.parametrize("pre", [1, 4])
def test_sm90_build_loads_weights_before_the_wait_and_x_after(pre):
    import triton
    from triton.backends.compiler import GPUTarget

    from octavo.plugins.platforms.cuda_moe_oproj import _gemv_early_kernel

    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "N": "i32", "K": "i32", "stride_wn": "i32"}
    c = dict(BLOCK_N=8, BLOCK_K=512, PRE=pre, EVEN=True, PDL=True)
    src = triton.compiler.ASTSource(fn=_gemv_early_kernel, signature={**sig, **{k: "constexpr" for k in c}},
                                    constexprs=c)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    assert wait > 0
    before, after = ptx[:wait], ptx[wait:]
    loads = r"ld\.global[.\w]*"
    # [8, 512] bf16 per block over 128 threads: 8 x 16-byte loads a thread per block
    assert len(re.findall(loads, before)) >= 8 * pre
    assert len(re.findall(loads, after)) >= 1  # x (and the blocks past PRE) after the wait


def test_bad_settings_are_refused():
    from octavo.plugins.platforms.cuda_moe_oproj import gemv_early

    x = torch.zeros(1, 64)
    for bad in (0, 9, True, 1.5):
        with pytest.raises(ValueError, match="pre"):
            gemv_early(x, torch.zeros(8, 64), bad)
