"""Batch-1 decode attention of Qwen3(-MoE) in ONE Triton launch: q/k norm + rope, the KV write, split-KV
attention and the merge of the splits.

Why: at batch 1 a Qwen3-30B-A3B layer (32 q / 4 kv heads, head 128, ~640 keys) spends ~12 us in four small
launches between the qkv GEMV and o_proj (q/k norm + rope 2.2, KV write 1.5, split-KV attention 6.9, merge 1.6;
H100 kernel table of session 6) for 1.3 MB of KV, i.e. latency, not bandwidth. Here one grid of
``kv_heads x SPLITS`` programs does all of it:

- every program normalises (``q_norm`` / ``k_norm``) and rotates its kv head's GROUP query heads and the new key
  straight from the qkv output, rounding where the eager forward rounds (norm to the dtype, times the weight to
  the dtype, rotation in fp32 to the dtype);
- program ``s`` attends to keys ``[s*C, (s+1)*C)`` with ``C = cdiv(L, SPLITS)`` read from the paged cache; the
  new token's key/value (position ``L-1``) come from registers, and the program that owns that position stores
  them into the cache (no other program reads that slot from memory, so there is no race);
- each program writes its unnormalised partial (acc, running max, sum) to a scratch buffer, then takes a ticket
  from a per-kv-head counter (``atomic_add``, acq_rel, after a CTA barrier); the program that draws the last
  ticket merges the SPLITS partials (L2 loads) into the output and resets the counter to 0, so the launch is
  graph-replayable with no host work.

The grid does not depend on the context length (a CUDA graph captured once serves every length). Used only for
one decode token of one request with a 16-bit cache on the ``triton`` backend without window / soft cap
(``moe_attention.py`` checks and installs; anything else takes the module's previous forward).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts
from octavo.plugins.platforms.moe_prefetch import as_bytes, l2_prefetch, prefetch_split


@triton.jit
def _norm_rope(x1, x2, w1, w2, cos, sin, eps, HEAD: tl.constexpr):
    """RMSNorm over a head held as two halves ``x1``/``x2`` (fp32 of the dtype), then the rotation; every
    step rounded to the dtype where the eager path rounds. Returns the rotated halves as fp32 of dtype values."""
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    ss = tl.sum(a * a, axis=-1, keep_dims=True) + tl.sum(b * b, axis=-1, keep_dims=True)
    rstd = tl.rsqrt(ss / HEAD + eps)
    a = ((a * rstd).to(x1.dtype).to(tl.float32) * w1).to(x1.dtype).to(tl.float32)
    b = ((b * rstd).to(x1.dtype).to(tl.float32) * w2).to(x1.dtype).to(tl.float32)
    r1 = (a * cos - b * sin).to(x1.dtype).to(tl.float32)
    r2 = (b * cos + a * sin).to(x1.dtype).to(tl.float32)
    return r1, r2


@triton.jit
def _load_tile(k_cache_ptr, v_cache_ptr, table_ptr, t0, end, new, h, i1, i2, d, stride_blk, stride_pos,
               PAGE: tl.constexpr, HEAD: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys ``[t0, t0 + BLOCK_N)`` of kv head ``h`` (masked at ``end`` and at the new token ``new``, which comes
    from registers): K halves ``[BLOCK_N, HEAD/2]`` x2 and V ``[BLOCK_N, HEAD]`` in the cache dtype."""
    p_idx = t0 + tl.arange(0, BLOCK_N)
    ok = p_idx < end
    blk = tl.load(table_ptr + p_idx // PAGE, mask=ok, other=0).to(tl.int64)
    base = blk * stride_blk + (p_idx % PAGE) * stride_pos + h * HEAD
    ld = (ok & (p_idx != new))[:, None]
    k1 = tl.load(k_cache_ptr + base[:, None] + i1[None, :], mask=ld, other=0.0)
    k2 = tl.load(k_cache_ptr + base[:, None] + i2[None, :], mask=ld, other=0.0)
    v = tl.load(v_cache_ptr + base[:, None] + d[None, :], mask=ld, other=0.0)
    return k1, k2, v


@triton.jit
def _attend_tile(q1, q2, k1, k2, v, kn1, kn2, vn, t0, end, new, m_i, l_i, acc, qk_scale_log2,
                 BLOCK_N: tl.constexpr, DOT16: tl.constexpr):
    """Online-softmax step over one key tile (the new token's row replaced by ``kn``/``vn``); a tile with no
    valid key leaves (m, l, acc) as they were (m stays -inf in an empty split).

    ``DOT16``: the dots take the cache dtype (q and the new K/V are values of that dtype already, so the scores
    are the same products; P is rounded to the dtype for P.V, as the backend's kernels do) with fp32 accumulation:
    no fp32 copies of the K/V tiles (half the registers). Else the tiles are converted and dotted in tf32."""
    p_idx = t0 + tl.arange(0, BLOCK_N)
    ok = p_idx < end
    is_new = (p_idx == new)[:, None]
    if DOT16:
        dt = k1.dtype
        k1 = tl.where(is_new, kn1.to(dt)[None, :], k1)
        k2 = tl.where(is_new, kn2.to(dt)[None, :], k2)
        v = tl.where(is_new, vn.to(dt)[None, :], v)
        sc = tl.dot(q1.to(dt), tl.trans(k1)) + tl.dot(q2.to(dt), tl.trans(k2))  # [G_P, BLOCK_N] fp32
    else:
        k1 = tl.where(is_new, kn1[None, :], k1.to(tl.float32))
        k2 = tl.where(is_new, kn2[None, :], k2.to(tl.float32))
        v = tl.where(is_new, vn[None, :], v.to(tl.float32))
        sc = tl.dot(q1, tl.trans(k1)) + tl.dot(q2, tl.trans(k2))  # [G_P, BLOCK_N]
    sc = tl.where(ok[None, :], sc * qk_scale_log2, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # no valid key yet: exp2(-inf - 0) = 0, no NaN
    p = tl.exp2(sc - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if DOT16:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v)
    return m_new, l_i, acc


@triton.jit
def _attn_one_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, k_cache_ptr, v_cache_ptr, table_ptr,
                     seq_len_ptr, slot_ptr, out_ptr, part_ptr, ml_ptr, count_ptr, stride_cos, stride_blk,
                     stride_pos, eps, qk_scale_log2, pf_ptr, pf_total, pf_piece,
                     NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, GROUP: tl.constexpr, G_P: tl.constexpr,
                     HEAD: tl.constexpr, NEOX: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                     SPLITS: tl.constexpr, EARLY: tl.constexpr = True, DOT16: tl.constexpr = False,
                     PDL: tl.constexpr = False, PREFETCH: tl.constexpr = 0, PF_PIECES: tl.constexpr = 16,
                     MERGE: tl.constexpr = 0):
    """Program ``(h, s)``: kv head ``h``, key split ``s`` (see the module docstring).

    With PDL the program first loads what no earlier kernel of the step writes (sequence length, position, block
    table, rope row, norm weights and, with ``EARLY``, its first key/value tile: past tokens' K/V, written by
    earlier steps), and only then waits for the qkv GEMV: the cache read overlaps that GEMV's tail.

    ``PREFETCH`` (moe_prefetch.py; 0 off): the grid asks L2 for ``pf_total`` bytes at ``pf_ptr`` (the o_proj
    weight that runs next), 1 right after the wait, 2 before it: HBM is otherwise idle during this launch.
    ``MERGE`` 1: the last program's merge unrolled (every partial's load in flight at once; same sums, same
    order) and only the GROUP real rows of each partial stored and read."""
    h = tl.program_id(0)
    s = tl.program_id(1)
    if PREFETCH == 2:
        l2_prefetch(pf_ptr, pf_total, pf_piece, h * SPLITS + s, PF_PIECES)
    HALF: tl.constexpr = HEAD // 2
    dtype = qkv_ptr.dtype.element_ty
    i = tl.arange(0, HALF)
    if NEOX:
        i1 = i
        i2 = i + HALF
    else:
        i1 = 2 * i
        i2 = 2 * i + 1
    d = tl.arange(0, HEAD)
    r = tl.arange(0, G_P)
    r_ok = r < GROUP
    L = tl.load(seq_len_ptr).to(tl.int32)
    pos = tl.load(pos_ptr).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cos + i).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_cos + i).to(tl.float32)
    qw1 = tl.load(qw_ptr + i1).to(tl.float32)[None, :]
    qw2 = tl.load(qw_ptr + i2).to(tl.float32)[None, :]
    kw1 = tl.load(kw_ptr + i1).to(tl.float32)
    kw2 = tl.load(kw_ptr + i2).to(tl.float32)
    chunk = tl.cdiv(L, SPLITS)
    start = s * chunk
    end = tl.minimum(start + chunk, L)
    new = L - 1
    if EARLY:
        k1, k2, v = _load_tile(k_cache_ptr, v_cache_ptr, table_ptr, start, end, new, h, i1, i2, d, stride_blk,
                               stride_pos, PAGE, HEAD, BLOCK_N)
    if PDL:  # the qkv output comes from the previous launch
        gdc_wait()
        gdc_launch_dependents()
    if PREFETCH == 1:
        l2_prefetch(pf_ptr, pf_total, pf_piece, h * SPLITS + s, PF_PIECES)
    # q of the GROUP query heads of kv head h: [G_P, HALF] halves, normalised and rotated
    q_rows = qkv_ptr + (h * GROUP + r)[:, None] * HEAD
    qx1 = tl.load(q_rows + i1[None, :], mask=r_ok[:, None], other=0.0)
    qx2 = tl.load(q_rows + i2[None, :], mask=r_ok[:, None], other=0.0)
    q1, q2 = _norm_rope(qx1, qx2, qw1, qw2, cos[None, :], sin[None, :], eps, HEAD)
    # the new key (normalised, rotated) and value of kv head h
    k_row = qkv_ptr + NUM_Q * HEAD + h * HEAD
    kn1, kn2 = _norm_rope(tl.load(k_row + i1), tl.load(k_row + i2), kw1, kw2, cos, sin, eps, HEAD)
    vn = tl.load(qkv_ptr + (NUM_Q + NUM_KV) * HEAD + h * HEAD + d).to(tl.float32)
    if (new >= start) & (new < end):  # this program owns the new token's slot: store its K/V
        slot = tl.load(slot_ptr)
        if slot >= 0:
            dst = (slot // PAGE) * stride_blk + (slot % PAGE) * stride_pos + h * HEAD
            tl.store(k_cache_ptr + dst + i1, kn1.to(dtype))
            tl.store(k_cache_ptr + dst + i2, kn2.to(dtype))
            tl.store(v_cache_ptr + dst + d, vn.to(dtype))
    m_i = tl.full([G_P], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([G_P], dtype=tl.float32)
    acc = tl.zeros([G_P, HEAD], dtype=tl.float32)
    t_first = start
    if EARLY:  # the tile loaded before the wait (all masked in an empty split: a no-op)
        m_i, l_i, acc = _attend_tile(q1, q2, k1, k2, v, kn1, kn2, vn, start, end, new, m_i, l_i, acc,
                                     qk_scale_log2, BLOCK_N, DOT16)
        t_first = start + BLOCK_N
    for t0 in range(t_first, end, BLOCK_N):
        k1, k2, v = _load_tile(k_cache_ptr, v_cache_ptr, table_ptr, t0, end, new, h, i1, i2, d, stride_blk,
                               stride_pos, PAGE, HEAD, BLOCK_N)
        m_i, l_i, acc = _attend_tile(q1, q2, k1, k2, v, kn1, kn2, vn, t0, end, new, m_i, l_i, acc,
                                     qk_scale_log2, BLOCK_N, DOT16)
    out_rows = out_ptr + (h * GROUP + r)[:, None] * HEAD + d[None, :]
    if SPLITS == 1:
        tl.store(out_rows, (acc / tl.where(l_i > 0, l_i, 1.0)[:, None]).to(dtype), mask=r_ok[:, None])  # L=0: 0
    else:
        row = (h * SPLITS + s) * G_P + r
        if MERGE == 1:  # only the GROUP real rows (the merge reads only those)
            tl.store(part_ptr + row[:, None] * HEAD + d[None, :], acc, mask=r_ok[:, None])
        else:
            tl.store(part_ptr + row[:, None] * HEAD + d[None, :], acc)
        tl.store(ml_ptr + row * 2, m_i)
        tl.store(ml_ptr + row * 2 + 1, l_i)
        tl.debug_barrier()  # every thread's partial stores precede the ticket (released by the atomic)
        ticket = tl.atomic_add(count_ptr + h, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLITS - 1:  # the last program of kv head h: merge all SPLITS partials
            tl.debug_barrier()  # (uniform branch) no thread loads a partial before the ticket's acquire
            tl.store(count_ptr + h, 0)  # every program has drawn its ticket: ready for the next launch
            hrow = h * SPLITS * G_P + r
            m_all = tl.full([G_P], -float("inf"), dtype=tl.float32)
            if MERGE == 1:  # unrolled: all SPLITS loads in flight at once (a runtime loop waits for each in turn)
                for j in tl.static_range(SPLITS):
                    m_all = tl.maximum(m_all, tl.load(ml_ptr + (hrow + j * G_P) * 2, cache_modifier=".cg"))
                tot = tl.zeros([G_P, HEAD], dtype=tl.float32)
                den = tl.zeros([G_P], dtype=tl.float32)
                for j in tl.static_range(SPLITS):  # the same sums in the same order as the loop below
                    rj = hrow + j * G_P
                    mj = tl.load(ml_ptr + rj * 2, cache_modifier=".cg")
                    lj = tl.load(ml_ptr + rj * 2 + 1, cache_modifier=".cg")
                    w = tl.where(mj == -float("inf"), 0.0, tl.exp2(mj - m_all))
                    den += w * lj
                    tot += w[:, None] * tl.load(part_ptr + rj[:, None] * HEAD + d[None, :], mask=r_ok[:, None],
                                                other=0.0, cache_modifier=".cg")
            else:
                for j in range(0, SPLITS):
                    m_all = tl.maximum(m_all, tl.load(ml_ptr + (hrow + j * G_P) * 2, cache_modifier=".cg"))
                tot = tl.zeros([G_P, HEAD], dtype=tl.float32)
                den = tl.zeros([G_P], dtype=tl.float32)
                for j in range(0, SPLITS):
                    rj = hrow + j * G_P
                    mj = tl.load(ml_ptr + rj * 2, cache_modifier=".cg")
                    lj = tl.load(ml_ptr + rj * 2 + 1, cache_modifier=".cg")
                    w = tl.where(mj == -float("inf"), 0.0, tl.exp2(mj - m_all))
                    den += w * lj
                    tot += w[:, None] * tl.load(part_ptr + rj[:, None] * HEAD + d[None, :], cache_modifier=".cg")
            tl.store(out_rows, (tot / tl.where(den > 0, den, 1.0)[:, None]).to(dtype), mask=r_ok[:, None])


_SCRATCH: dict = {}


def _scratch(device, num_kv: int, splits: int, g_p: int, head: int):
    """Partials, (max, sum) pairs and the per-kv-head tickets; one set per shape and device, shared by all layers
    (their launches run one after another on the stream; the counters are back at 0 after every launch)."""
    key = (str(device), num_kv, splits, g_p, head)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty(num_kv * splits * g_p, head, dtype=torch.float32, device=device),
                         torch.empty(num_kv * splits * g_p, 2, dtype=torch.float32, device=device),
                         torch.zeros(num_kv, dtype=torch.int32, device=device))
    return _SCRATCH[key]


def attention_one(qkv: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                  q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, kv_cache: torch.Tensor,
                  block_table: torch.Tensor, seq_lens: torch.Tensor, slot_mapping: torch.Tensor, *, num_heads: int,
                  num_kv_heads: int, head_size: int, scale: float, neox: bool, splits: int = 8,
                  block_n: int = 64, num_warps: int = 4, early: bool = True, dot16: bool = False,
                  prefetch: int = 0, prefetch_t: torch.Tensor | None = None, merge: int = 0) -> torch.Tensor:
    """One decode token of one request: ``qkv [1, (Hq + 2 Hkv) * D]`` (pre-norm, pre-rope) -> attention output
    ``[1, Hq * D]``; stores the new K/V into ``kv_cache [2, blocks, page, Hkv, D]`` at ``slot_mapping[0]``.

    ``block_table`` is the request's row (``[max_blocks]`` int32), ``seq_lens`` ``[1]`` (the new token included),
    ``positions [1]``; ``cos_cache``/``sin_cache`` ``[max_pos, D/2]`` (full rotary). ``prefetch`` 1/2 with
    ``prefetch_t``: the launch asks L2 for that tensor (after / before its PDL wait; a hint, same result)."""
    if prefetch not in (0, 1, 2):
        raise ValueError(f"attention_one: prefetch must be 0, 1 or 2, not {prefetch!r}")
    if merge not in (0, 1):
        raise ValueError(f"attention_one: merge must be 0 (loop) or 1 (unrolled), not {merge!r}")
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    group = num_heads // num_kv_heads
    g_p = max(16, 1 << (group - 1).bit_length())
    out = torch.empty(1, num_heads * head_size, dtype=qkv.dtype, device=qkv.device)
    part, ml, count = _scratch(qkv.device, num_kv_heads, splits, g_p, head_size)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    pf_total, pf_piece = prefetch_split(prefetch_t if prefetch else None, num_kv_heads * splits, 16)
    pf = as_bytes(prefetch_t) if pf_total else as_bytes(qkv)
    _attn_one_kernel[(num_kv_heads, splits)](
        qkv, positions, cos_cache, sin_cache, q_weight, k_weight, k_cache, v_cache, block_table, seq_lens,
        slot_mapping, out, part, ml, count, cos_cache.stride(0), k_cache.stride(0), k_cache.stride(1), eps,
        scale * 1.4426950408889634, pf, pf_total, pf_piece, PREFETCH=prefetch if pf_total else 0, MERGE=merge,
        NUM_Q=num_heads, NUM_KV=num_kv_heads, GROUP=group, G_P=g_p, HEAD=head_size, NEOX=neox,
        PAGE=kv_cache.shape[2], BLOCK_N=block_n, SPLITS=splits, EARLY=early, DOT16=dot16, num_warps=num_warps, num_stages=2,
        **launch_opts())
    return out
