"""The one-row fp8 GEMV's L2 prefetch of the next linear's weight (fp8_prefetch.py's chain, off by default): the
bulk-prefetch helper its kernel calls from the grid's last programs, and the host-side split of the bytes.
Kept apart from fp8_gemv.py (the kernel the engine runs) so each file holds one job.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# the next weight's prefetch: split over the grid's last PF_PROGS programs, PF_PIECES bulk requests each
PF_PROGS = tl.constexpr(128)
PF_PIECES = tl.constexpr(128)


@triton.jit
def _prefetch_l2_slice(pf_ptr, total, piece, PROGS: tl.constexpr, PIECES: tl.constexpr):
    """Ask L2 for this program's share of ``total`` bytes at ``pf_ptr`` (``cp.async.bulk.prefetch.L2``, sm_90+;
    a hint: nothing waits for it and nothing is written). ``piece`` and ``total`` are multiples of 16 bytes."""
    j = tl.program_id(0) - tl.maximum(tl.num_programs(0) - PROGS, 0)
    if j >= 0:
        off = (j.to(tl.int64) * PIECES + tl.arange(0, PIECES)) * piece
        ok = off < total
        off = tl.where(ok, off, total - 16)  # past the end: re-ask for the last 16 bytes (no predication in asm)
        size = tl.where(ok, tl.minimum(total - off, piece), 16).to(tl.int32)
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                                  [pf_ptr + off, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_next(pf_ptr, total, piece):
    """``_prefetch_l2_slice`` over the grid's last ``PF_PROGS`` programs, ``PF_PIECES`` requests each."""
    _prefetch_l2_slice(pf_ptr, total, piece, PF_PROGS, PF_PIECES)


@triton.jit
def _prefetch_rows_once(w_ptr, row0, stride_wn, nbytes, ROWS: tl.constexpr):
    """Ask L2 for the first ``nbytes`` of rows ``row0 .. row0 + ROWS`` of ``w_ptr``: one bulk request a row, from
    thread 0 only. Why not one [ROWS] tensor of addresses: its elements sit in several threads each (16 rows on 256
    threads: 16 copies), and every copy issues its request (session 16's H100 run: the rows asked 16 times over, the
    GEMVs +0.5-0.8 ms a forward)."""
    for i in tl.static_range(ROWS):
        tl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0;\n"
            " @p cp.async.bulk.prefetch.L2.global [$1], $2; }\n mov.u32 $0, 0;", "=r,l,r",
            [w_ptr + (row0 + i).to(tl.int64) * stride_wn, nbytes], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_args(t: torch.Tensor, nbytes: int) -> tuple[torch.Tensor, int, int]:
    """``(tensor, total, piece)`` for the kernel's L2 prefetch of ``t``'s first ``nbytes`` (whole 16-byte units;
    ``t`` contiguous and 16-byte aligned, as the bulk prefetch requires; else ``total`` 0 = no prefetch)."""
    total = min(int(nbytes), t.numel() * t.element_size()) // 16 * 16
    if total < 16 or not t.is_contiguous() or t.data_ptr() % 16:
        return t, 0, 16
    piece = -(-total // (PF_PROGS.value * PF_PIECES.value * 16)) * 16
    return t, total, piece
