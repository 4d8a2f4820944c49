"""The one-launch batch-1 fp8 attention's merge of its key splits WITHOUT the ticket atomic (session 16, engineer fp816;
``_fp8_kv_decode_bs1.SPIN_MODE``, ``OCTAVO_FP8_DECODE_ONE_SPIN``, opt-in until measured on a GPU).

Why: with the ticket (``SPIN`` 0), the split that finishes last merges, after three dependent memory trips: its
partial stores must be acknowledged (the ``MEMBAR.ALL.GPU`` of the acq_rel atomic), the atomic itself, then the
partials' loads (sm_90 SASS). Here the partials carry their own "not written yet" mark: every word of the scratch
holds a sentinel (a NaN whose payload no arithmetic produces: GPUs return the canonical NaN) until its writer stores
the value, and the reader polls the words themselves with L1-bypassing loads until none is a sentinel (a 32-bit store
is seen whole or not at all), merges, and writes the sentinels back. No fence, no atomic: the reader sees each
partial one store-to-L2 after it was written.

Layout (float32): for kv head ``h``, output slice ``c`` (``W = HEAD / SPLITS`` columns) and writer split ``s`` a chunk
of ``G_P * (W + 2)`` words: the ``G_P x W`` partial accumulator, then the ``G_P`` running maxima and ``G_P`` sums (a
copy in every slice's chunk, so each slice's reader owns, and resets, everything it reads).
- ``SPIN`` 1: split ``SPLITS - 1`` reads all slices (one poll of every partial) and merges the whole head;
- ``SPIN`` 2: every split merges its own slice of ``W`` columns (16 small polls in parallel instead of one large).
The merge is the ticket merge's arithmetic on the same values, in the same order (max, then ``den += w * l``,
``tot += w * acc`` for j = 0..SPLITS-1): the same bits.

Only a grid whose programs are all resident at once may poll (a reader waits for the other splits): the host takes it
when ``kv_heads x SPLITS`` <= the SM count (the 8B shape: 128 <= 132; mode 2's every program waits, mode 1's readers
are the last programs dispatched). A bounded poll (``MAX_TRIES``) turns a lost write into a NaN output, never a hang.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: the "not written yet" mark: a quiet NaN with a payload (0x7FBADBAD); arithmetic on a GPU returns 0x7FFFFFFF, and
#: a bf16 -> fp32 widening leaves the low 16 bits 0
SENTINEL = 0x7FBADBAD
SENT = tl.constexpr(SENTINEL)
MAX_TRIES = tl.constexpr(1 << 16)


@triton.jit
def _is_sent(x):
    return (x.to(tl.int32, bitcast=True) == SENT).to(tl.int32)


@triton.jit
def spin_store(part_ptr, h, s, r, r_ok, d, acc, m_i, l_i, SPLITS: tl.constexpr, G_P: tl.constexpr,
               HEAD: tl.constexpr):
    """Split ``s``'s partial (``acc [G_P, HEAD]``, ``m_i`` / ``l_i [G_P]``) into its chunk of every slice."""
    W: tl.constexpr = HEAD // SPLITS
    CH: tl.constexpr = G_P * (W + 2)
    col = ((h * SPLITS + d // W) * SPLITS + s) * CH + d % W
    tl.store(part_ptr + col[None, :] + r[:, None] * W, acc, mask=r_ok[:, None])
    ml = ((h * SPLITS + tl.arange(0, SPLITS)) * SPLITS + s) * CH + G_P * W
    zero = tl.zeros([G_P, SPLITS], dtype=tl.float32)
    tl.store(part_ptr + ml[None, :] + r[:, None], m_i[:, None] + zero, mask=r_ok[:, None])
    tl.store(part_ptr + ml[None, :] + G_P + r[:, None], l_i[:, None] + zero, mask=r_ok[:, None])


@triton.jit
def spin_merge(part_ptr, out_ptr, h, c_lo, r, r_ok, stride_oh, out_scale, GROUP: tl.constexpr, SPLITS: tl.constexpr,
               G_P: tl.constexpr, HEAD: tl.constexpr, NCH: tl.constexpr):
    """Wait for the ``SPLITS`` partials of slices ``[c_lo, c_lo + NCH)`` of kv head ``h``, merge them into ``out`` (the
    ticket merge's expressions), and put the sentinels back."""
    W: tl.constexpr = HEAD // SPLITS
    CH: tl.constexpr = G_P * (W + 2)
    SW: tl.constexpr = NCH * W
    dd = c_lo * W + tl.arange(0, SW)
    col = (h * SPLITS + dd // W) * SPLITS * CH + dd % W  # + j * CH: split j's chunk
    mrow = (h * SPLITS + c_lo) * SPLITS * CH + G_P * W + r
    msk = r_ok[:, None]
    tot = tl.zeros([G_P, SW], dtype=tl.float32)
    den = tl.zeros([G_P], dtype=tl.float32)
    bad = tl.full((), 1, tl.int32)
    tries = tl.full((), 0, tl.int32)
    while (bad > 0) & (tries < MAX_TRIES):
        nb = tl.zeros([G_P, SW], dtype=tl.int32)
        m_all = tl.full([G_P], -float("inf"), dtype=tl.float32)
        for j in tl.static_range(SPLITS):
            mj = tl.load(part_ptr + mrow + j * CH, mask=r_ok, other=0.0, cache_modifier=".cg")
            nb += _is_sent(mj)[:, None]
            m_all = tl.maximum(m_all, mj)
        tot = tl.zeros([G_P, SW], dtype=tl.float32)
        den = tl.zeros([G_P], dtype=tl.float32)
        for j in tl.static_range(SPLITS):
            mj = tl.load(part_ptr + mrow + j * CH, mask=r_ok, other=0.0, cache_modifier=".cg")
            lj = tl.load(part_ptr + mrow + G_P + j * CH, mask=r_ok, other=0.0, cache_modifier=".cg")
            pj = tl.load(part_ptr + col[None, :] + j * CH + r[:, None] * W, mask=msk, other=0.0, cache_modifier=".cg")
            nb += _is_sent(pj) + (_is_sent(mj) + _is_sent(lj))[:, None]
            w = tl.where(mj == -float("inf"), 0.0, tl.exp2(mj - m_all))
            den += w * lj
            tot += w[:, None] * pj
        bad = tl.sum(tl.sum(nb, axis=1), axis=0)
        tries += 1
    out = tot / tl.where(den > 0, den, 1.0)[:, None] * out_scale
    out = tl.where(bad > 0, float("nan"), out)  # a partial never came: visible, not silent
    tl.store(out_ptr + (h * GROUP + r)[:, None] * stride_oh + dd[None, :], out.to(out_ptr.dtype.element_ty), mask=msk)
    sent = tl.full([G_P, SW], SENT, tl.int32).to(tl.float32, bitcast=True)
    ml = (h * SPLITS + c_lo + tl.arange(0, NCH)) * SPLITS * CH + G_P * W  # every copy of (max, sum) in these slices
    sent_ml = tl.full([G_P, NCH], SENT, tl.int32).to(tl.float32, bitcast=True)
    for j in tl.static_range(SPLITS):
        tl.store(part_ptr + col[None, :] + j * CH + r[:, None] * W, sent, mask=msk)
        tl.store(part_ptr + ml[None, :] + j * CH + r[:, None], sent_ml, mask=msk)
        tl.store(part_ptr + ml[None, :] + j * CH + G_P + r[:, None], sent_ml, mask=msk)


def chunk_words(splits: int, g_p: int, head: int) -> int:
    """Words of one (kv head, slice, split) chunk."""
    return g_p * (head // splits + 2)
