"""Round-to-nearest-even onto the e4m3 grid in fp32 arithmetic, for the fp8 kernels under the Triton interpreter
(fp8_gemv.py, fp8_gemv_rows.py, fp8_fused.py, ...; they import it through fp8_gemv.py or from here)."""

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
