"""The batch-1 input norm + qkv GEMV launch (plugins/platforms/moe_norm_qkv.py) under Triton's CPU interpreter:
the normalised row and the new residual bit-equal to the fused RMSNorm kernel's (cuda_fusions, also interpreted),
the qkv row against a float64 product of that normalised row (ragged H and N, fp16: the interpreter rounds bf16
toward zero) and bit-equal to cuda_fusions' GEMV of that row at the same BLOCK_K with 1, 2 or 4 K-blocks loaded
before the wait, and refusals. The model-level A/B (same engine, H100) is benchmarks/moe_profile.py."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

_CASES = r"""
import torch
from octavo.plugins.platforms.cuda_fusions import rms_norm
from octavo.plugins.platforms.moe_norm_qkv import norm_qkv
g = torch.Generator().manual_seed(4)
for h, n, bn, bk in ((96, 40, 16, 32), (64, 24, 8, 64), (128, 16, 16, 512)):
    x, res = (torch.randn(1, h, generator=g) * 2).half(), torch.randn(1, h, generator=g).half()
    nw = (1 + 0.2 * torch.randn(h, generator=g)).half()
    w = (torch.randn(n, h, generator=g) * h ** -0.5).half()
    out, res_out, y = norm_qkv(x, res, nw, 1e-6, w, bn, bk)
    want_out, want_res = rms_norm(x, nw, 1e-6, res)
    assert torch.equal(out, want_out) and torch.equal(res_out, want_res), h
    want = out.double() @ w.double().t()
    err = float((y.double() - want).abs().max() / want.abs().max())
    assert err < 2e-3, (h, err)
    # the GEMV's sums: cuda_fusions._gemv_kernel's bits on the normalised row for the same BLOCK_K, whatever PRE
    from octavo.plugins.platforms.cuda_fusions import _gemv_kernel
    bk = min(bk, h)
    gemv = torch.empty(1, n, dtype=torch.float16)
    _gemv_kernel[(-(-n // bn),)](out, w, None, gemv, n, h, w.stride(0), HAS_BIAS=False, EVEN=False, BLOCK_N=bn,
                                 BLOCK_K=bk, PDL=False)
    for pre in (1, 2, 4):
        assert torch.equal(norm_qkv(x, res, nw, 1e-6, w, bn, bk, pre)[2], gemv), (h, pre)
print("ok")
"""


def test_norm_qkv_matches_the_fused_norm_and_a_float64_product():
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(_CASES)


def test_bad_settings_and_the_switch(monkeypatch):
    import torch

    from octavo.plugins.platforms import moe_norm_qkv
    from octavo.plugins.platforms.moe_norm_qkv import install_norm_qkv, set_norm_qkv

    assert moe_norm_qkv.DEFAULT_ON  # on by default since session 11 (H100 and H200 A/Bs, same bits)
    assert moe_norm_qkv.DEFAULTS == {"block_n": 16, "block_k": None, "pre": 2}  # block_k None: the engine GEMV's
    monkeypatch.setenv("OCTAVO_MOE_NORM_QKV", "0")
    assert install_norm_qkv(torch.nn.Linear(2, 2)) == []  # off by the switch
    monkeypatch.delenv("OCTAVO_MOE_NORM_QKV")
    with pytest.raises(ValueError, match="block_m"):
        set_norm_qkv([], block_m=4)
    from octavo.plugins.platforms.moe_norm_qkv import norm_qkv

    x = torch.zeros(1, 8)
    with pytest.raises(ValueError, match="pre"):
        norm_qkv(x, x, torch.ones(8), 1e-6, torch.zeros(4, 8), pre=5)
