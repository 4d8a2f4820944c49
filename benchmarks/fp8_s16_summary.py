"""Summarize a session-16 benchmarks/fp8_bs1.py ``--ab s6`` record (bs1.json) by lever: fp8_s15_summary's table and
per-lever means, with the kernels the session-16 levers move as columns (the attention with its polling merge, o /
down through TMA, the SiLU kernel that hands down its absmax pieces: ``_silu_mul_amax_kernel``).

    python benchmarks/fp8_s16_summary.py /path/to/fp89/bs1.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import fp8_s15_summary as s15  # noqa: E402

s15.KERNELS = ("_rms_norm_quant_kernel", "_fp8_decode_one_kernel", "_silu_and_mul_kernel", "_silu_mul_amax_kernel",
               "o", "qkv", "down", "gate_up", "idle")

if __name__ == "__main__":
    s15.main(sys.argv[1])
