"""One Triton kernel for fp8's dynamic activation quantization: per-token absmax, scale, cast to e4m3.

Why: written in torch ops, ``x.abs().amax(-1)``, the division, the clamp and the cast are ~5 elementwise
kernels per linear layer; on H100 at batch 1 they cost more than fp8 weights save (0.78x bf16 measured,
docs/performance.md). One program per token reads its row once for the absmax and once to write the
quantized row: one launch per linear. It computes what :func:`quantize_per_token_torch` computes (the
absmax is exact in any order, then the same IEEE float32 divide (``div_rn``), clamp and round-to-nearest-even
cast per element): bit-identical under the interpreter (tests/quant/test_fp8_triton.py); on the GPU the
cast is the hardware's RNE and the GPU test compares the bytes.

Triton is imported when the kernel is first used, never at plugin import. ``TRITON_INTERPRET=1`` runs it
on CPU tensors (the tests do).
"""

from __future__ import annotations

import os

import torch

FP8_MAX = 448.0  # float8_e4m3fn
_kernel = None
_round_e4m3 = None  # set by _build (fp8_gemv imports Triton at module level; this module does not)


def quantize_per_token_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: ``x [m, K]`` -> (float8_e4m3fn ``[m, K]``, float32 scale ``[m, 1]``)."""
    scale = (x.abs().amax(-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _build():
    global _round_e4m3  # a module global: Triton (and its interpreter) resolve called jit functions there
    import triton
    import triton.language as tl

    from octavo.plugins.quant.fp8_gemv import _round_e4m3

    @triton.jit
    def per_token_fp8(x_ptr, q_ptr, s_ptr, k, stride_x, stride_q, SOFT_FP8: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        x_row = x_ptr + row * stride_x
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, k, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < k, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), 448.0), 1e-12)  # IEEE, as torch
        tl.store(s_ptr + row, scale)
        for start in range(0, k, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < k, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -448.0), 448.0)  # IEEE division, as torch
            if SOFT_FP8:
                q = _round_e4m3(q)
            tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=cols < k)

    return per_token_fp8


def quantize_per_token(x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused version of :func:`quantize_per_token_torch` (one Triton launch); ``x`` is 2-D.

    ``out_dtype=torch.float32`` returns the values unpacked. Under the interpreter (``TRITON_INTERPRET=1``)
    the e4m3 rounding is done in fp32 arithmetic (``fp8_gemv._round_e4m3``): the interpreter's own fp8
    conversion is wrong when rounding carries into the exponent; on a GPU it is the hardware's cast.
    """
    global _kernel
    if _kernel is None:
        _kernel = _build()
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    q = torch.empty((m, k), dtype=out_dtype, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block = min(4096, 1 << (k - 1).bit_length())
        _kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), SOFT_FP8=os.environ.get("TRITON_INTERPRET") == "1",
                      BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return q, s
