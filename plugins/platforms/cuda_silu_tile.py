"""SiLU(gate) * up for one program's tile, as a Triton function inlined into each kernel that computes it (the
platform's ``_silu_and_mul_kernel`` in cuda_fusions.py; session 16's absmax variant, deleted in session 17, shared it),
so they all give the same bits."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_mul_tile(x_ptr, stride_x, d, BLOCK: tl.constexpr):
    """This program's tile of SiLU(gate) * up in the input dtype (the rounding steps of the eager op), with its row,
    columns and mask; inlined into every kernel that computes it, so they all give these bits."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    u = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
    return row, cols, mask, (s * u.to(tl.float32)).to(g.dtype)
