"""L2 prefetch hints for the batch-1 MoE decode kernels (Hopper ``cp.async.bulk.prefetch.L2``).

Why: a batch-1 Qwen3-30B-A3B layer has long stretches where HBM is idle: the one-launch attention (~10 us for
1.3 MB of KV), the norms and router, the w13 launch's routing prologue (no weight load can start before the
expert ids are known), and every kernel's ramp and tail. The kernel that runs in such a stretch can ask L2 for
bytes the NEXT kernels will stream (the o_proj weight during attention; the routed experts' w2 slices during
w13, right after the routing; the next layer's qkv weight during w2), so those kernels read L2 instead of HBM.
A prefetch is a hint: nothing waits for it, nothing is written, results cannot change (the GPU tests compare
outputs with and without). Each use is a switch (off unless measured faster; docs/moe.md "L2 prefetch").

Not in Triton's CPU interpreter (no inline PTX): the launchers pass ``0`` bytes there and the branch is dead.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def l2_prefetch(ptr, total, piece, j, PIECES: tl.constexpr):
    """Program share ``j`` asks L2 for bytes ``[j*PIECES*piece, (j+1)*PIECES*piece) ∩ [0, total)`` at ``ptr`` (a
    byte pointer), ``PIECES`` bulk requests of ``piece`` bytes (both multiples of 16). Shares past the end re-ask
    for the last 16 bytes (no predication in the asm)."""
    off = (j.to(tl.int64) * PIECES + tl.arange(0, PIECES)) * piece
    ok = off < total
    off = tl.where(ok, off, total - 16)
    size = tl.where(ok, tl.minimum(total - off, piece), 16).to(tl.int32)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;", "=r,l,r",
                              [ptr + off, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_split(t: torch.Tensor | None, shares: int, pieces: int, nbytes: int | None = None) -> tuple[int, int]:
    """``(total, piece)`` for :func:`l2_prefetch` over ``shares`` program shares of ``pieces`` requests each:
    ``t``'s first ``nbytes`` (all of it by default) in whole 16-byte units. ``(0, 16)`` (no prefetch) for None,
    the interpreter, a non-CUDA or non-contiguous tensor, or a start not 16-byte aligned (the bulk op needs it)."""
    if t is None or INTERPRET or not t.is_cuda or not t.is_contiguous() or t.data_ptr() % 16:
        return 0, 16
    size = t.numel() * t.element_size()
    return split_bytes(size if nbytes is None else min(int(nbytes), size), shares, pieces)


def split_bytes(nbytes: int, shares: int, pieces: int) -> tuple[int, int]:
    """``(total, piece)``: ``nbytes`` rounded down to 16-byte units, and the smallest 16-byte multiple ``piece``
    with ``shares * pieces * piece >= total`` (``(0, 16)`` below 16 bytes)."""
    total = int(nbytes) // 16 * 16
    if total < 16:
        return 0, 16
    return total, -(-total // (shares * pieces * 16)) * 16


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of ``t``'s storage (the kernels take byte pointers)."""
    return t.view(-1).view(torch.uint8)
