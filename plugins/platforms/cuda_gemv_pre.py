"""How many K-blocks of its weight rows a batch-1 GEMV program loads before its PDL wait (``OCTAVO_GEMV_PRE_BLOCKS``).

Why: under PDL (cuda_pdl.py) a GEMV is resident while its producer still runs, but may read the producer's
output (x) only after ``griddepcontrol.wait``. Weights never change, so they may load before it. The batch-1 GEMVs
of cuda_fusions (``_gemv_kernel``: qkv, o_proj at TP=1) and cuda_allreduce_gemv (``_gemv_push_kernel``: o_proj
and down at TP=2) load one ``[BLOCK_N, BLOCK_K]`` tile before the wait. Their producers are latency-bound
(attention + split merge ~7 us a layer; at TP=2 the fused all-reduce + RMSNorm ~6.5 us, twice a layer, waiting for
the peer's words): HBM idles there. With ``PRE`` blocks held in registers across the wait, more of the weight is
in flight while the producer runs (the MoE o_proj did the same with up to 8 blocks, cuda_moe_oproj.py).

Same sums: block 0, 1, ... accumulated in the same order into the same fp32 ``[BLOCK_N, BLOCK_K]`` tile, so the
bits equal ``PRE`` 1 (the tests compare). Default 1 (the kernels as before) until a GPU A/B says otherwise.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

MAX_PRE = 4


def _from_env() -> int:
    raw = os.environ.get("OCTAVO_GEMV_PRE_BLOCKS", "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"OCTAVO_GEMV_PRE_BLOCKS={raw!r} is not an integer (1..{MAX_PRE})") from None
    if not 1 <= value <= MAX_PRE:
        raise ValueError(f"OCTAVO_GEMV_PRE_BLOCKS={value}: 1..{MAX_PRE} K-blocks before the PDL wait")
    return value


_STATE = {"pre": _from_env()}


def set_pre_blocks(n: int) -> None:
    """K-blocks loaded before the PDL wait in GEMVs launched (or graphs captured) from now on (benchmarks' A/B)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PRE:
        raise ValueError(f"pre blocks must be an int in 1..{MAX_PRE}, not {n!r}")
    _STATE["pre"] = n


def pre_blocks(K: int, block_k: int) -> int:
    """The ``PRE`` constexpr for a GEMV over ``K`` in ``block_k`` blocks: the setting, at most K's blocks."""
    return max(1, min(_STATE["pre"], triton.cdiv(K, block_k)))


@triton.jit
def _w_block(rows, nm, K, kb, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    if EVEN:
        return tl.load(rows + kk[None, :])
    return tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)


@triton.jit
def _fma(acc, w, x_ptr, K, kb, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    if EVEN:
        x = tl.load(x_ptr + kk)
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
    return acc + w.to(tl.float32) * x.to(tl.float32)[None, :]


@triton.jit
def pre_wait_blocks(acc, rows, nm, x_ptr, K, BLOCK_K: tl.constexpr, EVEN: tl.constexpr, PRE: tl.constexpr):
    """Load K-blocks 0..PRE-1 of ``rows`` (weights), wait for the producer (and let the consumer launch), then
    accumulate them in order into ``acc``. The caller's K loop continues at block ``PRE``."""
    w0 = _w_block(rows, nm, K, 0, BLOCK_K, EVEN)  # static ifs: the names stay in scope after them
    if PRE > 1:
        w1 = _w_block(rows, nm, K, 1, BLOCK_K, EVEN)
    if PRE > 2:
        w2 = _w_block(rows, nm, K, 2, BLOCK_K, EVEN)
    if PRE > 3:
        w3 = _w_block(rows, nm, K, 3, BLOCK_K, EVEN)
    gdc_wait()
    gdc_launch_dependents()
    acc = _fma(acc, w0, x_ptr, K, 0, BLOCK_K, EVEN)
    if PRE > 1:
        acc = _fma(acc, w1, x_ptr, K, 1, BLOCK_K, EVEN)
    if PRE > 2:
        acc = _fma(acc, w2, x_ptr, K, 2, BLOCK_K, EVEN)
    if PRE > 3:
        acc = _fma(acc, w3, x_ptr, K, 3, BLOCK_K, EVEN)
    return acc


@triton.jit
def _fma2(acc_g, acc_u, wg, wu, x_ptr, K, kb, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    kk = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    if EVEN:
        x = tl.load(x_ptr + kk)
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
    xf = x.to(tl.float32)[None, :]
    return acc_g + wg.to(tl.float32) * xf, acc_u + wu.to(tl.float32) * xf


@triton.jit
def pre_wait_blocks2(acc_g, acc_u, g_rows, u_rows, nm, x_ptr, K, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
                     PRE: tl.constexpr):
    """:func:`pre_wait_blocks` for the gate/up + SiLU GEMV (cuda_mlp_fusion.py): both weight rows per output."""
    g0 = _w_block(g_rows, nm, K, 0, BLOCK_K, EVEN)
    u0 = _w_block(u_rows, nm, K, 0, BLOCK_K, EVEN)
    if PRE > 1:
        g1 = _w_block(g_rows, nm, K, 1, BLOCK_K, EVEN)
        u1 = _w_block(u_rows, nm, K, 1, BLOCK_K, EVEN)
    if PRE > 2:
        g2 = _w_block(g_rows, nm, K, 2, BLOCK_K, EVEN)
        u2 = _w_block(u_rows, nm, K, 2, BLOCK_K, EVEN)
    if PRE > 3:
        g3 = _w_block(g_rows, nm, K, 3, BLOCK_K, EVEN)
        u3 = _w_block(u_rows, nm, K, 3, BLOCK_K, EVEN)
    gdc_wait()
    gdc_launch_dependents()
    acc_g, acc_u = _fma2(acc_g, acc_u, g0, u0, x_ptr, K, 0, BLOCK_K, EVEN)
    if PRE > 1:
        acc_g, acc_u = _fma2(acc_g, acc_u, g1, u1, x_ptr, K, 1, BLOCK_K, EVEN)
    if PRE > 2:
        acc_g, acc_u = _fma2(acc_g, acc_u, g2, u2, x_ptr, K, 2, BLOCK_K, EVEN)
    if PRE > 3:
        acc_g, acc_u = _fma2(acc_g, acc_u, g3, u3, x_ptr, K, 3, BLOCK_K, EVEN)
    return acc_g, acc_u
