"""Low-latency ("LL") variant of the one-shot all-reduce for small 16-bit messages (opt-in:
``OCTAVO_TP_ALLREDUCE_LL=1``): the data carries its own flag.

Why: the flag protocol of cuda_allreduce.py pushes the message, then raises a flag with a release store at
system scope, which first waits until every pushed byte is visible on the peer (an NVLink round trip), and the
peer then sees the flag one crossing later. At batch 1 (8 KiB) that round trip is most of the kernel. Here every
16-bit element travels in one aligned 8-byte word ``call index << 16 | bits`` (NCCL's LL protocol does the
same with 4+4 bytes): a word is visible whole or not at all, so the receiver polls the words themselves
(volatile loads) until each carries this call's index. No fence, no flag, one crossing. It costs 4x the bytes
on the wire, irrelevant at these sizes, so it serves messages up to ``LL_MAX_BYTES`` of data.

The words live in their own region after the data buffers (``ll[2][W][LL_MAX_BYTES * 4]`` per rank, zeroed at
start: call indices start at 1), so a word is only ever compared with words of earlier calls of this protocol;
48 bits of call index never wrap. Double buffering by parity with the same argument as the flag protocol: a
rank writes parity ``e % 2`` of call ``e`` only after it received the peer's words of call ``e - 1``, which the
peer writes only after its call ``e - 2`` (the last reader of that parity) finished. Epoch counters are shared
with the flag protocol, so LL and flag calls mix in any order. The sum is the same rank-order fp32 sum, so the
result is bitwise the flag protocol's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_allreduce_epochs import BLOCK, MAX_CTAS, _begin_call

LL_MAX_BYTES = 64 * 1024  # of 16-bit data per message: 8 rows of an 8B hidden vector; 4x that in words
LL_REGION_BYTES_PER_SLOT = 4 * LL_MAX_BYTES  # one int64 word per 16-bit element
LL_CAP_WORDS = LL_REGION_BYTES_PER_SLOT // 8


@triton.jit
def _ll_base(ll_table, r):
    """Rank ``r``'s LL region (an int64 pointer; ``ll_table`` never changes after start, so callers may load it early)."""
    return tl.load(ll_table + r).to(tl.pointer_type(tl.int64))


@triton.jit
def _ll_store_at(vals, offs, mask, base, parity, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, CAP: tl.constexpr):
    """Push 16-bit ``vals`` at ``offs`` as tagged words into slot [parity][RANK] of the region at ``base``."""
    words = (epoch.to(tl.int64) << 16) | (vals.to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF)
    tl.store(base + (parity * WORLD + RANK) * CAP + offs, words, mask=mask)


@triton.jit
def _ll_store_to_peers(vals, offs, mask, ll_table, parity, epoch, RANK: tl.constexpr, WORLD: tl.constexpr,
                       CAP: tl.constexpr):
    """Push 16-bit ``vals`` at ``offs`` as tagged words into slot [parity][RANK] of every peer's LL region (the words
    are :func:`_ll_store_at`'s; kept in this order, the default kernels' instructions stay those of session 11)."""
    words = (epoch.to(tl.int64) << 16) | (vals.to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF)
    for k in tl.static_range(WORLD):
        if k != RANK:
            dst = tl.load(ll_table + k).to(tl.pointer_type(tl.int64)) + (parity * WORLD + RANK) * CAP
            tl.store(dst + offs, words, mask=mask)


@triton.jit
def _ll_poll_at(base, k, offs, mask, parity, epoch, like_ptr, WORLD: tl.constexpr, CAP: tl.constexpr):
    """Peer ``k``'s 16-bit values at ``offs`` of this call: poll the words of slot [parity][k] of the region at
    ``base`` (this rank's) until every one carries ``epoch``."""
    src = base + (parity * WORLD + k) * CAP + offs
    want = epoch.to(tl.int64)
    w = tl.load(src, mask=mask, other=0, volatile=True)
    while tl.min((((w >> 16) == want) | (mask == 0)).to(tl.int32), 0) == 0:  # masked lanes count as arrived
        w = tl.load(src, mask=mask, other=0, volatile=True)
    return (w & 0xFFFF).to(tl.int16).to(like_ptr.dtype.element_ty, bitcast=True)


@triton.jit
def _ll_receive(ll_table, k, offs, mask, parity, epoch, like_ptr, RANK: tl.constexpr, WORLD: tl.constexpr,
                CAP: tl.constexpr):
    """Peer ``k``'s 16-bit values at ``offs`` of this call, polled in this rank's LL region."""
    return _ll_poll_at(_ll_base(ll_table, RANK), k, offs, mask, parity, epoch, like_ptr, WORLD, CAP)


@triton.jit
def _one_shot_ll_kernel(x_ptr, n, ll_table, counters, RANK: tl.constexpr, WORLD: tl.constexpr, MAXG: tl.constexpr,
                        BLOCK: tl.constexpr, CAP: tl.constexpr, PDL: tl.constexpr = False,
                        PUSHED: tl.constexpr = False):
    """In-place rank-order sum of a 16-bit ``x`` (``n`` <= CAP elements) over LL words. ``PUSHED``: this rank's
    words were already sent by the GEMV that produced ``x`` (cuda_allreduce_gemv.py): receive only."""
    pid, grid, epoch, parity = _begin_call(counters, MAXG, PDL)
    offs0 = tl.arange(0, BLOCK)
    if not PUSHED:
        for start in range(pid * BLOCK, n, grid * BLOCK):
            offs = start + offs0
            m = offs < n
            _ll_store_to_peers(tl.load(x_ptr + offs, mask=m), offs, m, ll_table, parity, epoch, RANK, WORLD, CAP)
    for start in range(pid * BLOCK, n, grid * BLOCK):
        offs = start + offs0
        m = offs < n
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k in tl.static_range(WORLD):
            if k == RANK:
                v = tl.load(x_ptr + offs, mask=m, other=0.0)
            else:
                v = _ll_receive(ll_table, k, offs, m, parity, epoch, x_ptr, RANK, WORLD, CAP)
            acc += v.to(tl.float32)
        tl.store(x_ptr + offs, acc.to(x_ptr.dtype.element_ty), mask=m)


def ll_fits(x) -> bool:
    """Whether ``x`` (contiguous float) takes the LL path: 16-bit and at most LL_MAX_BYTES."""
    return x.element_size() == 2 and x.numel() * 2 <= LL_MAX_BYTES


def ll_reduce(ar, x, pushed: bool = False):
    """``x`` summed over ``ar``'s ranks in place with the LL kernel (caller checked :func:`ll_fits`); ``pushed``:
    its words were sent by cuda_allreduce_gemv.py's GEMV (receive only)."""
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    n = x.numel()
    _one_shot_ll_kernel[(min(MAX_CTAS, triton.cdiv(n, BLOCK)),)](
        x, n, ar.ll_table, ar.counters, RANK=ar.rank, WORLD=ar.world, MAXG=MAX_CTAS, BLOCK=BLOCK, CAP=LL_CAP_WORDS,
        PUSHED=pushed, num_warps=4, **launch_opts())
    ar.num_calls += 1
    return x
