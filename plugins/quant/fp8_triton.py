"""One Triton kernel for fp8's dynamic activation quantization: per-token absmax, scale, cast to e4m3.

Why: written in torch ops, ``x.abs().amax(-1)``, the division, the clamp and the cast are ~5 elementwise
kernels per linear layer; on H100 at batch 1 they cost more than fp8 weights save (0.78x bf16 measured,
docs/performance.md). One program per token reads its row once for the absmax and once to write the
quantized row: one launch per linear. It computes what :func:`quantize_per_token_torch` computes (the
absmax is exact in any order, then the same float32 divide, clamp and cast per element): the pre-cast values
are bit-identical under the interpreter (tests/quant/test_fp8_triton.py); on GPU the cast is the hardware's
and a differently rounded divide may move an element by one e4m3 step (benchmarks/quant_gpu.py checks).

Triton is imported when the kernel is first used, never at plugin import. ``TRITON_INTERPRET=1`` runs it
on CPU tensors (the tests do).
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # float8_e4m3fn
_kernel = None


def quantize_per_token_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: ``x [m, K]`` -> (float8_e4m3fn ``[m, K]``, float32 scale ``[m, 1]``)."""
    scale = (x.abs().amax(-1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def _build():
    import triton
    import triton.language as tl

    @triton.jit
    def per_token_fp8(x_ptr, q_ptr, s_ptr, k, stride_x, stride_q, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        x_row = x_ptr + row * stride_x
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, k, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < k, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        scale = tl.maximum(tl.max(amax, axis=0) / 448.0, 1e-12)
        tl.store(s_ptr + row, scale)
        for start in range(0, k, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(x_row + cols, mask=cols < k, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(v / scale, -448.0), 448.0)
            tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=cols < k)

    return per_token_fp8


def quantize_per_token(x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused version of :func:`quantize_per_token_torch` (one Triton launch); ``x`` is 2-D.

    ``out_dtype=torch.float32`` returns the scaled, clamped values before the e4m3 cast (the tests check the
    kernel's arithmetic that way under the interpreter, whose fp8 conversion is not the hardware's).
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
        _kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return q, s
