"""A decode-only paged-attention kernel for large batches (one query token per request), fp8 or 16-bit cache.

Why a second kernel: at decode of hundreds of requests over long contexts the step is bound by reading the KV
cache, and the general kernel (``_triton_kernels._paged_attention_kernel``, prefill + chunked prefill + decode)
launches its grid request-fastest, so the programs resident at one time read the same KV head of many
requests: 128-256 scattered bytes out of every block row. Here one program still owns one (request, KV head),
but the flat grid runs the KV heads of a request next to each other (``HEADS_FASTEST``), so together they
stream each cache block's contiguous rows. An fp8 cache (e4m3 or e5m2) converts exactly to fp16, so with
``DOT_F16`` the dots run in fp16 (Q clamped to fp16's range, P in fp16: more mantissa than bf16) instead of
converting the tiles to bf16. Scales as in the general kernel: ``k_scale`` folded into the softmax scale,
the normalized output times ``v_scale``.

Used by the ``triton`` backend only for decode-only steps without split-KV, sliding window or soft cap
(``plugins/attention/triton.py``); everything else keeps the general kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

F16_MAX = tl.constexpr(65504.0)  # a constexpr: jit code may read only constexpr globals


# num_reqs and the block table's row stride change from step to step (a mixed step's decode rows; the table is as
# wide as the step's longest context): specialized, each value class (== 1, multiple of 16, other) was a separate
# build, and a warm-up could miss one (session 7: 0.67 s inside a timed run). They only feed index arithmetic.
@triton.jit(do_not_specialize=["num_reqs", "stride_bt"], do_not_specialize_on_alignment=["num_reqs", "stride_bt"])
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    order_ptr,  # int32 [num_reqs]: the request each slot runs (ORDERED), longest context first
    part_ptr, lse_ptr,  # CHUNK > 0: fp32 partials [T, H, MAX_SPLITS, HEAD_DP] and base-2 LSEs [T, H, MAX_SPLITS]
    new_k_ptr, new_v_ptr, slot_ptr,  # WRITE_KV: this step's K/V [T, KV heads, HEAD_D] and their cache slots
    stride_nkt, stride_nkh, stride_nvt, stride_nvh, k_scale_w, v_scale_w,
    scale_log2,  # softmax scale * log2(e) (times k_scale for an fp8 cache)
    v_scale, num_reqs, num_kv_heads,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs,  # cache strides: per block, per slot in a block (the head stride is HEAD_D)
    stride_bt,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_D: tl.constexpr, HEAD_DP: tl.constexpr, PAGE: tl.constexpr,
    KV_FP8: tl.constexpr, DOT_F16: tl.constexpr, HEADS_FASTEST: tl.constexpr, DOT_PREC: tl.constexpr,
    PACK: tl.constexpr = 1, ORDERED: tl.constexpr = False, CHUNK: tl.constexpr = 0, MAX_SPLITS: tl.constexpr = 1,
    WRITE_KV: tl.constexpr = False, FP8_MAX: tl.constexpr = 448.0, PDL: tl.constexpr = False,
):
    if PDL:  # plugins/platforms/cuda_pdl.py: nothing is read before the predecessor finished
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    progs_per_req = num_kv_heads // PACK
    split = 0
    if CHUNK > 0:  # split-major grid: every request's first CHUNK keys, then the second chunks of longer ones...
        split = pid // (num_reqs * progs_per_req)
        pid = pid % (num_reqs * progs_per_req)
    if HEADS_FASTEST:
        req = pid // progs_per_req
        kv_head = (pid % progs_per_req) * PACK  # the first of this program's PACK adjacent KV heads
    else:
        req = pid % num_reqs
        kv_head = (pid // num_reqs) * PACK
    if ORDERED:  # programs start in grid order: the longest contexts first leave no long stragglers at the end
        req = tl.load(order_ptr + req)
    q_start = tl.load(query_start_loc_ptr + req)
    if tl.load(query_start_loc_ptr + req + 1) == q_start:
        return
    seq_len = tl.load(seq_lens_ptr + req)  # the query is the last position: it sees all seq_len keys
    lo = 0
    hi = seq_len
    if CHUNK > 0:
        lo = split * CHUNK
        if lo >= seq_len:
            return
        hi = tl.minimum(seq_len, lo + CHUNK)

    if WRITE_KV:  # the step's K/V of this request's heads, stored as _kv_write_kernel stores them, by the program
        if hi == seq_len:  # that reads that position (the last chunk's): no separate write launch
            slot = tl.load(slot_ptr + q_start).to(tl.int64)
            if slot >= 0:
                wd = tl.arange(0, PACK * HEAD_DP)
                wh = kv_head + wd // HEAD_DP
                w_in = wd % HEAD_DP
                w_ok = w_in < HEAD_D
                kn = tl.load(new_k_ptr + q_start.to(tl.int64) * stride_nkt + wh * stride_nkh + w_in, mask=w_ok)
                vn = tl.load(new_v_ptr + q_start.to(tl.int64) * stride_nvt + wh * stride_nvh + w_in, mask=w_ok)
                if KV_FP8:  # saturate: a value past the fp8 range stores +-max, never inf/NaN
                    kn = tl.clamp(kn.to(tl.float32) / k_scale_w, -FP8_MAX, FP8_MAX)
                    vn = tl.clamp(vn.to(tl.float32) / v_scale_w, -FP8_MAX, FP8_MAX)
                dst = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_cs + wh * HEAD_D + w_in
                tl.store(k_cache_ptr + dst, kn.to(k_cache_ptr.dtype.element_ty), mask=w_ok)
                tl.store(v_cache_ptr + dst, vn.to(v_cache_ptr.dtype.element_ty), mask=w_ok)
        tl.debug_barrier()  # the block's threads see those stores before the key loop loads them

    # rows: the query heads of this program's PACK groups (padded to tl.dot's 16); columns: PACK heads' dims
    # side by side, as the cache stores adjacent KV heads. Row r belongs to KV head r // GROUP and sees only
    # its own head's columns (zeros elsewhere), so one dot over PACK * HEAD_DP columns gives every row's scores.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, PACK * HEAD_DP)
    offs_n = tl.arange(0, BLOCK_N)
    head = kv_head * GROUP + offs_m
    row_ok = offs_m < GROUP * PACK
    d_in = offs_d % HEAD_DP  # PACK > 1 only when HEAD_DP == HEAD_D (contiguous heads)
    d_ok = d_in < HEAD_D
    own = (offs_d // HEAD_DP)[None, :] == (offs_m // GROUP)[:, None]  # [BLOCK_M, PACK * HEAD_DP]
    q_off = q_start.to(tl.int64) * stride_qt + head[:, None] * stride_qh + d_in[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :] & own, other=0.0)  # [BLOCK_M, PACK*HEAD_DP]
    if DOT_F16:
        q = tl.clamp(q.to(tl.float32), -F16_MAX, F16_MAX).to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, PACK * HEAD_DP], dtype=tl.float32)
    bt_row = block_tables_ptr + req.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):  # every tile holds at least one visible key (its first)
        pos = start + offs_n
        pos_ok = pos < hi
        blk = tl.load(bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
        kv_off = blk * stride_cb + (pos % PAGE) * stride_cs + kv_head * HEAD_D  # [BLOCK_N]
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:
            k = k.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale_log2  # fp32 [BLOCK_M, BLOCK_N], base 2
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)  # [N, D]
        if KV_FP8:
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    out = acc / l_i[:, None]
    if KV_FP8:
        out = out * v_scale
    o_mask = row_ok[:, None] & d_ok[None, :] & own
    o_off = q_start.to(tl.int64) * stride_ot + head[:, None] * stride_oh + d_in[None, :]
    if CHUNK > 0:
        if seq_len > CHUNK:  # one of several chunks: a partial for _merge_chunks_kernel
            row = q_start.to(tl.int64) * (num_kv_heads * GROUP) + head  # PACK == 1 here
            tl.store(part_ptr + (row * MAX_SPLITS + split)[:, None] * HEAD_DP + d_in[None, :], out, mask=o_mask)
            tl.store(lse_ptr + row * MAX_SPLITS + split, m_i + tl.log2(l_i), mask=row_ok)
        else:
            tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _merge_chunks_kernel(
    part_ptr, lse_ptr, out_ptr, seq_lens_ptr, query_start_loc_ptr, num_heads, stride_ot, stride_oh,
    CHUNK: tl.constexpr, MAX_SPLITS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DP: tl.constexpr,
):
    """out[t, h] = the chunks' partials weighted by 2^(lse_s - lse), for requests longer than one chunk."""
    req = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.load(query_start_loc_ptr + req)
    seq_len = tl.load(seq_lens_ptr + req)
    if (seq_len <= CHUNK) | (tl.load(query_start_loc_ptr + req + 1) == t):
        return
    s = tl.arange(0, MAX_SPLITS)
    ok = s < tl.cdiv(seq_len, CHUNK)
    d = tl.arange(0, HEAD_DP)
    row = t.to(tl.int64) * num_heads + h
    lse = tl.load(lse_ptr + row * MAX_SPLITS + s, mask=ok, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))  # 0 for the chunks past the context
    part = tl.load(part_ptr + (row * MAX_SPLITS + s)[:, None] * HEAD_DP + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_D)


def paged_decode(query, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, *, num_reqs: int,
                 num_kv_heads: int, scale: float, v_scale: float, block_size: int, block_n: int = 64,
                 num_warps: int = 4, num_stages: int = 2, dot_f16: bool | None = None,
                 heads_fastest: bool = True, maxnreg: int | str | None = "auto", pack: int | str = "auto",
                 order=None, chunk: int = 0, max_seq_len: int | None = None, scratch=None,
                 new_kv=None, pdl: dict | None = None) -> None:
    """``out[t] = softmax(q[t] K^T * scale) V`` over each request's whole context, one token per request.

    ``k_cache``/``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_size]`` views (fp8 or the query's
    dtype); ``scale`` already includes ``k_scale`` for an fp8 cache. ``dot_f16`` defaults to on for an fp8
    cache and off otherwise (a 16-bit cache keeps the query's dtype). ``pack``: KV heads per program (1, 2 or 4;
    > 1 reads ``pack`` adjacent heads' contiguous bytes per key and needs a power-of-two head size). ``order``:
    an int32 permutation of ``range(num_reqs)`` on the device (``longest_first``): programs run its requests in
    that order; any permutation gives the same result, only the schedule changes. ``chunk`` (a multiple of
    ``block_n``): split each context into chunks of that many keys, one program each, merged by a second kernel
    (requests of one chunk write their output directly); needs ``max_seq_len`` (an upper bound of the contexts:
    it sizes the grid) and takes ``scratch`` = (partials, LSEs) from ``chunk_scratch`` or allocates them.
    ``new_kv`` = (key, value, slot_mapping, k_scale, v_scale): write this step's K/V (one token per request,
    ``[T, KV heads, head]``) into the cache inside this launch, as ``_kv_write_kernel`` would (slots < 0
    skipped); the backend then skips its write launch. ``pdl``: ``cuda_pdl.launch_opts()`` for the attention launch
    (programmatic dependent launch; None: a plain launch)."""
    import torch

    from octavo.plugins.attention._triton_kernels import LOG2E

    num_heads, head_size = query.shape[1], query.shape[2]
    group = num_heads // num_kv_heads
    fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if dot_f16 is None:
        dot_f16 = fp8 and query.dtype != torch.float32
    if dot_f16 and not fp8:
        raise ValueError("dot_f16 is for fp8 caches (they convert exactly to fp16); a bf16 cache may not fit fp16")
    head_dp = max(16, triton.next_power_of_2(head_size))
    if pack == "auto":
        pack = default_pack(num_kv_heads, head_size, fp8)
    if pack != 1 and (pack not in (2, 4) or num_kv_heads % pack or head_dp != head_size):
        raise ValueError(f"paged_decode: pack={pack} needs 2 or 4 dividing the {num_kv_heads} KV heads and a "
                         f"power-of-two head size (got {head_size})")
    if maxnreg == "auto":
        maxnreg = 128 if fp8 and head_dp <= 128 and num_warps == 4 and pack == 1 else None
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}  # a register cap buys resident programs (spills)
    if order is not None and (order.dtype != torch.int32 or order.numel() < num_reqs):
        raise ValueError(f"paged_decode: order must be int32 with >= {num_reqs} entries, got {order.dtype} "
                         f"[{order.numel()}]")
    max_splits = 1
    if chunk:
        if pack != 1 or chunk % block_n or max_seq_len is None:
            raise ValueError(f"paged_decode: chunk={chunk} needs pack 1, a multiple of block_n ({block_n}) and "
                             f"max_seq_len (got pack {pack}, max_seq_len {max_seq_len})")
        max_splits = triton.next_power_of_2(triton.cdiv(max(1, max_seq_len), chunk))
        if max_splits == 1:
            chunk = 0
        elif scratch is None:
            scratch = chunk_scratch(query.shape[0], num_heads, max_splits, head_dp, query.device)
    part, lse = scratch if chunk else (out, out)
    if new_kv is not None:
        nk, nv, slots, ks_w, vs_w = new_kv
        if nk.stride(-1) != 1 or nv.stride(-1) != 1:
            nk, nv = nk.contiguous(), nv.contiguous()
        wargs = (nk, nv, slots, nk.stride(0), nk.stride(1), nv.stride(0), nv.stride(1), ks_w, vs_w)
    else:
        wargs = (out, out, seq_lens, 0, 0, 0, 0, 1.0, 1.0)
    from octavo.nn.kv_quant import FP8_MAX
    _paged_decode_kernel[(max_splits * num_reqs * num_kv_heads // pack,)](
        query, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
        seq_lens if order is None else order, part, lse, *wargs,
        scale * LOG2E, v_scale if fp8 else 1.0, num_reqs, num_kv_heads,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        GROUP=group, BLOCK_M=max(16, triton.next_power_of_2(group * pack)), BLOCK_N=block_n, PACK=pack,
        HEAD_D=head_size, HEAD_DP=head_dp, PAGE=block_size, KV_FP8=fp8, DOT_F16=dot_f16,
        HEADS_FASTEST=heads_fastest, ORDERED=order is not None, CHUNK=chunk, MAX_SPLITS=max_splits,
        WRITE_KV=new_kv is not None, FP8_MAX=FP8_MAX.get(k_cache.dtype, 448.0),
        DOT_PREC="ieee" if query.dtype == torch.float32 else "tf32", num_warps=num_warps, num_stages=num_stages, **extra,
        **(pdl or {}),
    )
    if chunk:
        _merge_chunks_kernel[(num_reqs, num_heads)](
            part, lse, out, seq_lens, query_start_loc, num_heads, out.stride(0), out.stride(1),
            CHUNK=chunk, MAX_SPLITS=max_splits, HEAD_D=head_size, HEAD_DP=head_dp)


def chunk_scratch(num_tokens: int, num_heads: int, max_splits: int, head_dp: int, device):
    """(partials fp32 [T, H, S, HEAD_DP], LSEs fp32 [T, H, S]) for ``paged_decode(chunk=...)``."""
    import torch

    return (torch.empty(num_tokens, num_heads, max_splits, head_dp, dtype=torch.float32, device=device),
            torch.empty(num_tokens, num_heads, max_splits, dtype=torch.float32, device=device))


def chunk_splits(max_seq_len: int, chunk: int) -> int:
    """The grid's chunks per request for a context bound (a power of two; 1 = no split)."""
    return triton.next_power_of_2(triton.cdiv(max(1, max_seq_len), chunk)) if chunk else 1


@triton.jit
def _longest_first_kernel(seq_lens_ptr, order_ptr, n, BLOCK: tl.constexpr):
    """order[rank] = i, where rank counts the requests with a longer context (ties: the lower index first)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    i_ok = i < n
    s_i = tl.load(seq_lens_ptr + i, mask=i_ok, other=0)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        j = start + tl.arange(0, BLOCK)
        s_j = tl.load(seq_lens_ptr + j, mask=j < n, other=0)
        before = (s_j[None, :] > s_i[:, None]) | ((s_j[None, :] == s_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((before & (j < n)[None, :]).to(tl.int32), 1)
    tl.store(order_ptr + rank, i, mask=i_ok)


def longest_first(seq_lens, n: int, out=None):
    """The first ``n`` requests' indices, longest context first (int32, on the device, no host sync, so a CUDA
    graph captures it): ``paged_decode(order=...)`` then starts the longest programs first and the last wave
    holds only short ones (the list-scheduling tail). O(n^2) compares in one small launch (n <= a few thousand)."""
    import torch

    if out is None:
        out = torch.empty(n, dtype=torch.int32, device=seq_lens.device)
    if n:
        block = 64 if n <= 64 else 128
        _longest_first_kernel[(triton.cdiv(n, block),)](seq_lens, out, n, BLOCK=block, num_warps=4)
    return out


def decode_kernel_enabled() -> bool | None:
    """``OCTAVO_TRITON_DECODE_KERNEL``: 1 = the ``triton`` backend runs decode rows here for every cache dtype, 0 =
    never, unset = for fp8 caches only (None; measured 1.34x the general kernel there on H100, equal on bf16)."""
    import os

    from octavo.env_flags import env_switch

    if not os.environ.get("OCTAVO_TRITON_DECODE_KERNEL", "").strip():
        return None
    return env_switch("OCTAVO_TRITON_DECODE_KERNEL")


# KV heads per program by default, per cache kind (docs/performance.md "FP8 at big batch"): measured on H100
_DEFAULT_PACK = {"fp8": 1, "16bit": 1}


def default_pack(num_kv_heads: int, head_size: int, fp8: bool) -> int:
    """``OCTAVO_TRITON_DECODE_PACK`` (1, 2 or 4) if set, else the measured default for this cache kind; 1 where
    the heads cannot be packed (a head size that is not a power of two, a KV-head count it does not divide)."""
    import os

    raw = os.environ.get("OCTAVO_TRITON_DECODE_PACK", "").strip()
    if raw:
        if raw not in ("1", "2", "4"):
            raise ValueError(f"OCTAVO_TRITON_DECODE_PACK={raw!r}: 1, 2 or 4 (KV heads per program)")
        want = int(raw)
    else:
        want = _DEFAULT_PACK["fp8" if fp8 else "16bit"]
    if want > 1 and (num_kv_heads % want or head_size & (head_size - 1) or head_size < 16):
        if raw and (num_kv_heads, head_size) not in _WARNED:
            _WARNED.add((num_kv_heads, head_size))
            import logging

            logging.getLogger(__name__).warning(
                "OCTAVO_TRITON_DECODE_PACK=%s does not fit %d KV heads of size %d: one head per program",
                raw, num_kv_heads, head_size)
        return 1
    return want


_WARNED: set = set()
