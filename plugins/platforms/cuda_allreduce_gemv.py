"""A row-parallel layer's batch-1 GEMV that also sends its output to the peers: the all-reduce's push moved into
the GEMV's epilogue (tensor-parallel decode; with the all-reduce + RMSNorm fusion of cuda_allreduce_fusion.py; on
by default since session 7, ``OCTAVO_TP_GEMV_PUSH=0`` turns it off).

Why: at TP=2 a Llama layer runs ``o_proj``/``down_proj`` GEMV -> all-reduce + add + RMSNorm twice, and the fused
kernel must first wait for the whole GEMV, load its output, push it over NVLink and then wait a crossing for the
peer's copy (session 6: 7.2 us a call against 2.2 us for the norm alone; 64 calls a token). Here every GEMV
program pushes its ``BLOCK_N`` outputs as soon as it has them, in the LL words of cuda_allreduce_ll.py
(``call index << 16 | bits``: a word arrives whole, so no fence and no flag), and the consumer (the fused norm, or
the plain LL kernel when something else reads the sum first) only polls its own memory for the peer's words: the
crossing overlaps the GEMV's tail instead of following it.

Protocol (the LL protocol's, with the push done early):
- The GEMV reads the call index from the shared epoch counters (``counters[0] + 1``: the index its consumer will
  take) after its predecessor finished (stream order; with PDL after ``gdc_wait``), so every earlier call of this
  rank is complete and has advanced the counters; it does not advance them. The consumer (``PUSHED``) advances
  them as every protocol call does and skips its own push: same index, same parity.
- Double buffering holds as in the LL protocol: the words of call ``e`` are written after this rank's call ``e - 1``
  completed, which received the peer's words of ``e - 1``, which the peer wrote after its call ``e - 2`` (the last
  reader of that parity) completed.
- A pushed message is always the next protocol call's message on its rank: the all-reduce object flushes a pushed
  pending message (receive-only LL kernel) before any other call, as it does for a deferred one.
- Same sums: the words carry exactly the bf16/fp16 bits the GEMV stores locally, and the consumer sums in rank
  order in fp32, so results are bitwise the unpushed path's IF the GEMV tiles equal the plain GEMV's: the kernel
  runs with the config ``cuda_fusions.gemv``'s autotuner chose for that weight shape (never tuned itself: a tuning
  run would push words with a live call index), and the fusion's checking forward compares bitwise at start.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.platforms.cuda_allreduce_ll import (
    LL_CAP_WORDS,
    _ll_base,
    _ll_store_at,
    _ll_store_to_peers,
    ll_fits,
)
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

# an unset OCTAVO_TP_GEMV_PUSH: on since session 7 batch 1 (2x H100, 8B TP=2 bs1, same engine: graph 3.19 -> 3.06 ms,
# 3.54 -> 3.35 ms/token, TP2/TP1 0.628 -> 0.595; fused norm 7.2 -> 4.7 us with PDL off; 2-GPU test bitwise), for two
# ranks only (the measured case; OneShotAllReduce applies it): more ranks take it with an explicit 1
PUSH_DEFAULT = True


def push_setting() -> tuple[bool, bool]:
    """``(on, explicit)`` from ``OCTAVO_TP_GEMV_PUSH`` (unset: :data:`PUSH_DEFAULT`, not explicit). Explicitly on
    where the fusion it needs is off is an error; the default just stays off there."""
    return env_switch("OCTAVO_TP_GEMV_PUSH", default=PUSH_DEFAULT), bool(os.environ.get("OCTAVO_TP_GEMV_PUSH",
                                                                                        "").strip())


# an unset OCTAVO_TP_EARLY_POLL: off. Session 8 batch 2 (2x H100, 8B TP=2 bs1, same engine, alternating): the
# consumer polling the peer's words before its PDL wait made the graph SLOWER, 3.112 vs 3.061 ms (3.39-3.41 vs
# 3.30-3.37 ms/token); bitwise equal (2-GPU test passed). Kept opt-in (=1) for other cards.
EARLY_POLL_DEFAULT = False


def early_poll_setting() -> tuple[bool, bool]:
    """``(on, explicit)`` from ``OCTAVO_TP_EARLY_POLL`` (unset: :data:`EARLY_POLL_DEFAULT`, off). It applies to pushed
    messages of two ranks with PDL on; explicitly 1 where the push ends up off is an error (nothing to apply to)."""
    return (env_switch("OCTAVO_TP_EARLY_POLL", default=EARLY_POLL_DEFAULT),
            bool(os.environ.get("OCTAVO_TP_EARLY_POLL", "").strip()))


# an unset OCTAVO_TP_CROSSING_PRELOAD: on at two ranks since session 12 batch 1 (2x H100, 8B TP=2 bs1, one engine,
# re-captured alternating, same tokens): graph 3.061 / 3.065 -> 3.017 / 3.015 ms, 3.331 / 3.350 -> 3.278 / 3.277
# ms/token; the 2-GPU test bitwise (== NCCL + unfused norm). The crossing's loads that do not depend on its
# predecessor move off its critical path: the fused all-reduce + RMSNorm kernel (cuda_allreduce_fusion.py) loads its
# residual row, norm weight, call index and LL address before its PDL wait (not after polling the peer's words), the
# pushing GEMV its call index and peer address at its start (not before its push); same loads, same arithmetic, so
# the same bits (checked at start). More ranks take it with an explicit 1 (as the push).
CROSSING_PRELOAD_DEFAULT = True


def crossing_preload_setting() -> tuple[bool, bool]:
    """``(on, explicit)`` from ``OCTAVO_TP_CROSSING_PRELOAD`` (unset: :data:`CROSSING_PRELOAD_DEFAULT`); explicitly 1 where the
    fusion is off is an error (nothing to apply to)."""
    return (env_switch("OCTAVO_TP_CROSSING_PRELOAD", default=CROSSING_PRELOAD_DEFAULT),
            bool(os.environ.get("OCTAVO_TP_CROSSING_PRELOAD", "").strip()))


def crossing_preload_for_world(world: int) -> bool:
    """Whether the fusion over ``world`` ranks preloads (:func:`crossing_preload_setting`): by default at two ranks (the
    measured case), more ranks with an explicit ``OCTAVO_TP_CROSSING_PRELOAD=1``."""
    on, explicit = crossing_preload_setting()
    return on and (explicit or world == 2)


def push_for_world(world: int) -> bool:
    """Whether an all-reduce over ``world`` ranks starts with the push on: the default covers two ranks (the measured
    case), more ranks take it with an explicit ``OCTAVO_TP_GEMV_PUSH=1``."""
    on, explicit = push_setting()
    return on and (explicit or world == 2)


@triton.jit
def _gemv_push_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_wn, ll_table, counters, RANK: tl.constexpr,
                      WORLD: tl.constexpr, CAP: tl.constexpr, EVEN: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, PDL: tl.constexpr = False, PRE: tl.constexpr = False):
    """cuda_fusions._gemv_kernel without bias (same tiles, same sums), then this program's outputs pushed as LL
    words into every peer's slot [parity][RANK] for the coming call. ``PRE`` (``OCTAVO_TP_CROSSING_PRELOAD``): the
    call index (after the PDL wait) and, at two ranks, the peer's LL region address (fixed since start) are read at
    the start, not after the sums: the push at the tail no longer waits for those two loads."""
    if PRE and WORLD == 2:
        peer_ll = _ll_base(ll_table, 1 - RANK)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k0 = 0
    if PDL:  # the first weight tile loads while the producer of x finishes (weights never change)
        kk = tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(rows + kk[None, :])
        else:
            w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
        gdc_wait()
        gdc_launch_dependents()
        if PRE:
            epoch = tl.load(counters) + 1  # as below: every earlier call of this rank has finished
        if EVEN:
            x = tl.load(x_ptr + kk)
        else:
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        k0 = BLOCK_K
    elif PRE:
        epoch = tl.load(counters) + 1
    for k in range(k0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(rows + kk[None, :])
            x = tl.load(x_ptr + kk)
        else:
            w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    y = tl.sum(acc, 1).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + n, y, mask=nm)
    if not PRE:
        epoch = tl.load(counters) + 1  # the consumer's call index: every earlier call of this rank has finished
    if PRE and WORLD == 2:
        _ll_store_at(y, n, nm, peer_ll, epoch % 2, epoch, RANK, WORLD, CAP)
    else:
        _ll_store_to_peers(y, n, nm, ll_table, epoch % 2, epoch, RANK, WORLD, CAP)


def plain_gemv_config(N: int, K: int, dtype: torch.dtype, device: torch.device | None = None) -> dict | None:
    """The launch config ``cuda_fusions.gemv`` uses for a bias-free ``[N, K]`` weight of ``dtype`` (a fixed tile of
    cuda_gemv_table.py, else its autotuner's choice; the fixed interpreter tile under ``TRITON_INTERPRET=1``), or None
    while that shape is untuned."""
    from octavo.plugins.platforms import cuda_fusions
    from octavo.plugins.platforms.cuda_gemv_table import lookup

    even = K % 1024 == 0 and N % 64 == 0
    tile = lookup(N, K, device or torch.device("cuda"))  # a fixed tile (cuda_gemv_table.py): the plain GEMV's too
    if tile is not None:
        return {"EVEN": even, **tile}
    if os.environ.get("TRITON_INTERPRET") == "1":
        return {"EVEN": False, "BLOCK_N": 16, "BLOCK_K": 64}
    for key, cfg in getattr(cuda_fusions._gemv_autotuned, "cache", {}).items():
        if tuple(key[:4]) == (N, K, False, even) and str(dtype) in (str(k) for k in key[4:]):
            return {"EVEN": even, **cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    return None


def push_eligible(layer, width: int) -> bool:
    """Whether ``layer`` (a RowParallelLinear) can take the pushing GEMV: no bias, its whole input on this rank, a
    dense 16-bit row-major weight on cuda_fusions' GEMV method, an output of the norm width that fits the LL words."""
    w = getattr(layer, "weight", None)
    return (type(getattr(layer, "quant_method", None)).__name__ == "TritonGemvLinearMethod"
            and getattr(layer, "bias", None) is None and getattr(layer, "input_is_parallel", False)
            and isinstance(w, torch.Tensor) and w.dim() == 2 and w.stride(1) == 1 and w.element_size() == 2
            and w.shape[0] == width and ll_fits(w[0]))


def gemv_push(ar, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """``x [1, K] @ weight[N, K]^T`` on this rank, its words already sent to ``ar``'s peers for the next call; the
    caller makes it ``ar``'s pending pushed message. None (nothing launched) while the shape is untuned."""
    N, K = weight.shape
    cfg = plain_gemv_config(N, K, weight.dtype, weight.device)
    if cfg is None or x.dtype != weight.dtype:
        return None
    x = x.contiguous()
    y = torch.empty(1, N, dtype=x.dtype, device=x.device)
    block_n = cfg.pop("BLOCK_N")
    _gemv_push_kernel[(triton.cdiv(N, block_n),)](x, weight, y, N, K, weight.stride(0), ar.ll_table, ar.counters,
                                                  RANK=ar.rank, WORLD=ar.world, CAP=LL_CAP_WORDS, BLOCK_N=block_n,
                                                  PRE=getattr(ar, "crossing_preload", False), **cfg, **launch_opts())
    ar.num_pushed = getattr(ar, "num_pushed", 0) + 1  # launches (host side; benchmarks report it)
    return y
