"""Triton kernels behind the ``triton`` attention backend: the paged KV write and paged attention.

One attention kernel serves prefill, chunked prefill over cached prefixes and decode. A program owns one
request, one tile of its new tokens and one KV head; its rows are (token, query head of that KV head's
group) pairs, so a K/V tile loaded once serves the whole GQA group::

    grid = (num_reqs, num_q_tiles * num_splits, num_kv_heads)
    rows   m = t * GROUP_P + g   ->  token  q_tile * BLOCK_Q + t,  head  kv_head * GROUP + g
    keys   context positions [lo, hi) of this split, gathered through the block table per position

With ``num_splits > 1`` (decode of few requests over long contexts) each split writes an fp32 partial
output and its log-sum-exp; ``_merge_splits_kernel`` combines them. Scores and softmax are fp32, exp2 with
the scale folded in; P is cast to the cache dtype for the P@V product, as FlashAttention does.

FP8 cache (``KV_FP8``): the write stores ``clamp(x / scale, -FP8_MAX, FP8_MAX)`` as fp8; attention loads fp8
tiles, converts them to the query's dtype for the dots, folds ``k_scale`` into the softmax scale (the host
passes ``scale * k_scale``) and multiplies the normalized output by ``v_scale`` (octavo.nn.kv_quant's rule).

``PDL`` (programmatic dependent launch, plugins/platforms/cuda_pdl.py; the backend passes ``launch_opts()`` when
``triton.ATTN_PDL``): the kernel's first statements wait for its predecessor and let its successor launch, so
nothing is read before the wait and at most two kernels overlap; what is saved is the launch gap (~1 us) at each
of a decode layer's attention launches.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

LOG2E = 1.4426950408889634


@triton.jit
def _kv_write_kernel(
    key_ptr, value_ptr, cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    value_offset,  # elements between the key half and the value half of the cache
    num_kv_heads,
    k_scale, v_scale,  # fp8 cache: stored = clamp(x / scale); unused otherwise
    HEAD_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    KV_FP8: tl.constexpr = False, FP8_MAX: tl.constexpr = 448.0, PDL: tl.constexpr = False,
):
    """cache[{0,1}, slot] = key/value[token] for one token; slots < 0 (padding) are skipped."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < num_kv_heads) & (d[None, :] < HEAD_D)
    k = tl.load(key_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    if KV_FP8:  # saturate: a value past the fp8 range stores +-max, never inf/NaN
        k = tl.clamp(k.to(tl.float32) / k_scale, -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32) / v_scale, -FP8_MAX, FP8_MAX)
    dst = slot * num_kv_heads * HEAD_D + h[:, None] * HEAD_D + d[None, :]
    tl.store(cache_ptr + dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(cache_ptr + value_offset + dst, v.to(cache_ptr.dtype.element_ty), mask=mask)


# the block table's row stride follows the step's longest context, and a mixed step passes its prefill rows'
# tables / seq_lens / query starts as views past the decode rows (any 4-byte alignment): not specialized, so no
# step builds a variant the warm-up did not (they feed scalar loads and index arithmetic only)
@triton.jit(do_not_specialize=["stride_bt"],
            do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "stride_bt"])
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, lse_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    scale_log2,  # softmax scale * log2(e) (times k_scale for an fp8 cache)
    scale, soft_cap, window, v_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
    stride_cb, stride_cs,  # cache strides: per block, per slot in a block (the head stride is HEAD_D)
    stride_bt,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DP: tl.constexpr, PAGE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr, DOT_PREC: tl.constexpr,
    KV_FP8: tl.constexpr = False, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    req = tl.program_id(0)
    q_tile = tl.program_id(1) // NUM_SPLITS
    split = tl.program_id(1) % NUM_SPLITS
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len  # positions already cached before this step

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DP)
    tok = q_tile * BLOCK_Q + offs_m // GROUP_P
    grp = offs_m % GROUP_P
    head = kv_head * GROUP + grp
    row_ok = (tok < q_len) & (grp < GROUP)
    d_ok = offs_d < HEAD_D
    q_pos = ctx_len + tok  # context position of each row's token

    q_off = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DP]

    # keys this tile can see: causal up to its last token, and no further back than the window allows
    hi = tl.minimum(seq_len, ctx_len + (q_tile + 1) * BLOCK_Q)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(0, ctx_len + q_tile * BLOCK_Q - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    if NUM_SPLITS > 1:
        num_tiles = tl.cdiv(hi - lo, BLOCK_N)
        per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        lo = lo + split * per_split * BLOCK_N
        hi = tl.minimum(hi, lo + per_split * BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DP], dtype=tl.float32)
    bt_row = block_tables_ptr + req.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < hi
        blk = tl.load(bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
        kv_off = blk * stride_cb + (pos % PAGE) * stride_cs + kv_head * HEAD_D  # [BLOCK_N]
        kv_mask = pos_ok[None, :] & d_ok[:, None]
        k = tl.load(k_cache_ptr + kv_off[None, :] + offs_d[:, None], mask=kv_mask, other=0.0)  # [HEAD_DP, N]
        if KV_FP8:
            k = k.to(q.dtype)
        s = tl.dot(q, k, input_precision=DOT_PREC)  # fp32 [BLOCK_M, BLOCK_N]
        if USE_SOFTCAP:
            x = s * (scale / soft_cap)
            s = soft_cap * (2.0 * tl.sigmoid(2.0 * x) - 1.0) * 1.4426950408889634  # cap * tanh(x), base 2
        else:
            s = s * scale_log2
        visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible = visible & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet stay at zero
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=pos_ok[:, None] & d_ok[None, :],
                    other=0.0)  # [BLOCK_N, HEAD_DP]
        if KV_FP8:
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if KV_FP8:
        out = out * v_scale
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    o_mask = row_ok[:, None] & d_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # partials: out [T, H, S, HEAD_DP] fp32, lse [T, H, S] in base 2 (-inf for an empty split)
        tl.store(out_ptr + o_off + split * stride_os, out, mask=o_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        lse_off = (q_start + tok).to(tl.int64) * stride_lt + head * stride_lh + split
        tl.store(lse_ptr + lse_off, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    part_ptr, lse_ptr, out_ptr, num_heads, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, HEAD_D: tl.constexpr, HEAD_DP: tl.constexpr, PDL: tl.constexpr = False,
):
    """out[t, h] = sum_s 2^(lse_s - lse) * part[t, h, s] over the splits of one (token, head)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DP)
    row = t.to(tl.int64) * num_heads + h
    lse = tl.load(lse_ptr + row * NUM_SPLITS + s)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)  # 0 for empty splits
    part = tl.load(part_ptr + (row * NUM_SPLITS + s)[:, None] * HEAD_DP + d[None, :])
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_D)
