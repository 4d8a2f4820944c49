"""e4m3 helpers of the fp8 kernels: round-to-nearest-even onto the e4m3 grid in fp32 arithmetic (for the kernels under
the Triton interpreter: fp8_gemv.py, fp8_gemv_rows.py, fp8_fused.py, ...), the one-row GEMV's activation quantization
its integer e4m3 -> fp32 weight conversion (kept here so fp8_gemv.py holds the kernel; it re-exports them), and the
quantizing norms' per-token store (fp8_fused.py, fp8_gemv_norm.py)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_e4m3(v):
    """Round-to-nearest-even onto the e4m3 grid (|v| <= 448) in fp32 arithmetic: 3 mantissa bits, the exponent
    floored at -6 (subnormal steps of 2**-9). Used under the interpreter, whose own fp8 cast is wrong when
    rounding carries into the exponent (31.36 -> 16 instead of 32)."""
    a = tl.abs(v)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    step = ((tl.maximum(e, -6) - 3 + 127) << 23).to(tl.float32, bitcast=True)
    r = (a / step + 8388608.0) - 8388608.0  # a / step < 16: the fp32 add rounds to nearest even
    return tl.where(v < 0, -r, r) * step


@triton.jit
def _quant_e4m3(x, s_x, SOFT_FP8: tl.constexpr):
    """``x`` (fp32) divided by its scale (IEEE, as torch), clamped to +-448 and rounded onto e4m3, kept in fp32."""
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, s_x), -448.0), 448.0)
    if SOFT_FP8:
        q = _round_e4m3(q)
    else:
        q = q.to(tl.float8e4nv).to(tl.float32)
    return q


@triton.jit
def _e4m3_bits_f32(w):
    """e4m3 -> fp32 holding the value times 2**-120, by integer ops: the sign-extended byte shifted under fp32's
    exponent (bias 127 vs e4m3's 7), sign kept, the copies of the sign masked off. e4m3 subnormals land on fp32
    subnormals of the same scaled value, so the mapping is exact for every finite e4m3 (the GEMV's products with
    2**64-scaled e4m3 activations are then >= 2**-74, normal). Why: Triton converts fp8 -> fp16 -> fp32, 1.5
    conversion instructions an element, and conversions issue at a quarter of the ALU rate on sm_90: a GEMV
    streaming ~13 weight bytes per SM clock is bound by them, not by memory."""
    b = w.to(tl.int8, bitcast=True).to(tl.int32)
    return ((b << 20) & -2014314496).to(tl.float32, bitcast=True)  # -2014314496 == 0x87F00000 as int32


@triton.jit
def _quant_row_store(o, cols, mask, q_ptr, s_ptr, row, n_cols, SOFT_FP8: tl.constexpr):
    """Per-token e4m3 quantization of one row held in registers (``o`` fp32 of the rounded output)."""
    s = tl.maximum(tl.math.div_rn(tl.max(tl.where(mask, tl.abs(o), 0.0), 0), 448.0), 1e-12)
    tl.store(s_ptr + row, s)
    q = tl.minimum(tl.maximum(tl.math.div_rn(o, s), -448.0), 448.0)
    if SOFT_FP8:
        q = _round_e4m3(q)
    tl.store(q_ptr + row * n_cols + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
