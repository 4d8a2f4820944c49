"""Batch-1 decode on an e4m3 KV cache in ONE launch: the new token's K/V write, split-KV attention and the merge of
the splits (issue 9, the fp8 batch-1 key: 0.80 of the roofline, ~18 us per layer outside the GEMVs).

Why: at one decode token of one request the ``triton`` backend runs three launches per layer on an fp8 cache (KV
write 2.7 us, split-KV partials 6.0, merge 7.1 in session 7's H100 kernel table, PDL waits included) for ~1.5 MB of
KV: latency, not bandwidth. Here one grid of ``kv_heads x SPLITS`` programs does all of it (the pattern of
``plugins/platforms/moe_decode_attention.py``, without its q/k norm and rope: Llama's rope ran before):

- every program quantizes its kv head's new key/value exactly as ``_kv_write_kernel`` does (``clamp(x / scale,
  -448, 448)`` in fp32, round to e4m3); the program whose split holds the new position stores them into the cache,
  and every tile takes the new row from registers (the slot is never read from memory, so there is no race);
- program ``s`` attends to keys ``[s*C, (s+1)*C)``, ``C = cdiv(L, SPLITS)``; e4m3 tiles become fp16 right after the
  load (``_fp8_kv_decode``'s pinned conversion, exact), fp16 dots with fp32 accumulation, ``k_scale`` folded into
  the softmax scale and ``v_scale`` into the output, as the fp8 decode kernel;
- each program stores its unnormalised partial (acc, running max, sum), then draws a ticket from a per-kv-head
  counter (``atomic_add``, acq_rel, after a CTA barrier); the last one merges the SPLITS partials and resets the
  counter to 0, so the launch replays in a CUDA graph with no host work. The grid does not depend on the context.

``one_launch`` says whether a call runs here: e4m3 cache, one token of one request, no window / soft cap, a
(GQA group, head size) in ``TABLE`` (``OCTAVO_FP8_DECODE_ONE``: 0 never, 1 every power-of-two head size, unset the
table). The ``triton`` backend asks it before its own KV write.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.attention._fp8_kv_decode import _deq
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

F16_MAX = tl.constexpr(65504.0)


@triton.jit
def _tile(k_cache_ptr, v_cache_ptr, table_ptr, t0, end, new, h, d, stride_blk, stride_pos,
          PAGE: tl.constexpr, HEAD: tl.constexpr, BLOCK_N: tl.constexpr):
    """e4m3 K and V of keys ``[t0, t0 + BLOCK_N)`` of kv head ``h``, masked at ``end`` and at the new token."""
    p_idx = t0 + tl.arange(0, BLOCK_N)
    ld = ((p_idx < end) & (p_idx != new))[:, None]
    blk = tl.load(table_ptr + p_idx // PAGE, mask=p_idx < end, other=0).to(tl.int64)
    base = blk * stride_blk + (p_idx % PAGE) * stride_pos + h * HEAD
    k = tl.load(k_cache_ptr + base[:, None] + d[None, :], mask=ld, other=0.0)
    v = tl.load(v_cache_ptr + base[:, None] + d[None, :], mask=ld, other=0.0)
    return k, v


@triton.jit
def _attend(q, k, v, kn, vn, t0, end, new, m_i, l_i, acc, scale_log2, DEQ: tl.constexpr,
            BLOCK_N: tl.constexpr):
    """Online-softmax step over one key tile, the new token's row taken from ``kn`` / ``vn`` (fp16)."""
    p_idx = t0 + tl.arange(0, BLOCK_N)
    is_new = (p_idx == new)[:, None]
    k16 = tl.where(is_new, kn[None, :], _deq(k, DEQ))
    v16 = tl.where(is_new, vn[None, :], _deq(v, DEQ))
    sc = tl.dot(q, tl.trans(k16)) * scale_log2
    sc = tl.where((p_idx < end)[None, :], sc, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)  # no valid key yet: exp2(-inf - 0) = 0, no NaN
    p = tl.exp2(sc - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v16)
    return m_new, l_i, acc


@triton.jit
def _rot(x, xp, c, s, lo, dtype):
    """Neox rotary of a row held with its partner columns (``xp[j] = x[(j + HEAD/2) % HEAD]``), rounded to ``dtype``:
    the FMAs of cuda_fusions._rope_kernel's sm_90 code, written out (o1 = fma(cos, a, -(sin * b)), o2 = fma(sin, a,
    cos * b)) so both kernels round alike."""
    return tl.where(lo, tl.fma(x, c, -(xp * s)), tl.fma(xp, s, x * c)).to(dtype)


@triton.jit
def _fp8_decode_one_kernel(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, table_ptr, seq_len_ptr, slot_ptr, out_ptr,
    part_ptr, ml_ptr, count_ptr,
    stride_qh, stride_kh, stride_vh, stride_oh, stride_blk, stride_pos,
    scale_log2, out_scale, k_scale, v_scale,
    GROUP: tl.constexpr, G_P: tl.constexpr, HEAD: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr, DEQ: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr = False,
    EARLY_IO: tl.constexpr = False, pos_ptr=None, cos_ptr=None, sin_ptr=None, stride_cos=0, ROPE: tl.constexpr = False,
):
    """Program ``(h, s)``: kv head ``h``, key split ``s`` (module docstring). With PDL it first loads what no earlier
    kernel of the step writes (length, block table, with ``EARLY`` its first K/V tile of past tokens), then waits.
    ``EARLY_IO`` (session 15, ``EARLY_IO_ON``; the same bits): the slot (host input, as the length) is read before the
    wait too, and q and the new k / v are all asked for right after it, before any of them is used (sm_90 SASS without
    it: q's load, a barrier, then k / v, then the slot: three round trips after the wait). ``ROPE`` (session 15, neox,
    full rotary): q / k arrive unrotated (the qkv GEMV's output) and are rotated here as the rotary kernel does, its
    position and cos / sin read before the wait: the rotary launch goes, and this kernel launches as the GEMV's
    dependent (its early loads overlap the GEMV)."""
    h = tl.program_id(0)
    s = tl.program_id(1)
    d = tl.arange(0, HEAD)
    r = tl.arange(0, G_P)
    r_ok = r < GROUP
    L = tl.load(seq_len_ptr).to(tl.int32)
    chunk = tl.cdiv(L, SPLITS)
    start = s * chunk
    end = tl.minimum(start + chunk, L)
    new = L - 1
    if EARLY:
        k, v = _tile(k_cache_ptr, v_cache_ptr, table_ptr, start, end, new, h, d, stride_blk, stride_pos,
                     PAGE, HEAD, BLOCK_N)
    if EARLY_IO:
        slot_early = tl.load(slot_ptr).to(tl.int64)
    if ROPE:
        dp = (d + HEAD // 2) % HEAD  # each column's rotary partner
        pos = tl.load(pos_ptr).to(tl.int64)
        c_r = tl.load(cos_ptr + pos * stride_cos + d % (HEAD // 2))
        s_r = tl.load(sin_ptr + pos * stride_cos + d % (HEAD // 2))
    if PDL:  # q / k / v come from the previous launch (rotary; with ROPE the qkv GEMV)
        gdc_wait()
        gdc_launch_dependents()
    if EARLY_IO:  # k / v first: Triton stores q to shared memory (its dot layout) right after q's load, and the
        k_in = tl.load(k_ptr + h * stride_kh + d)  # barrier there keeps later loads behind q's round trip
        v_in = tl.load(v_ptr + h * stride_vh + d)
        if ROPE:
            k_in = _rot(k_in.to(tl.float32), tl.load(k_ptr + h * stride_kh + dp).to(tl.float32), c_r, s_r,
                        d < HEAD // 2, k_in.dtype)
    q_rows = q_ptr + (h * GROUP + r)[:, None] * stride_qh
    q = tl.load(q_rows + d[None, :], mask=r_ok[:, None], other=0.0)
    if ROPE:
        q = _rot(q.to(tl.float32), tl.load(q_rows + dp[None, :], mask=r_ok[:, None], other=0.0).to(tl.float32),
                 c_r[None, :], s_r[None, :], (d < HEAD // 2)[None, :], q.dtype)
    if not EARLY_IO:
        k_in = tl.load(k_ptr + h * stride_kh + d)
        v_in = tl.load(v_ptr + h * stride_vh + d)
        if ROPE:
            k_in = _rot(k_in.to(tl.float32), tl.load(k_ptr + h * stride_kh + dp).to(tl.float32), c_r, s_r,
                        d < HEAD // 2, k_in.dtype)
    q = tl.clamp(q.to(tl.float32), -F16_MAX, F16_MAX).to(tl.float16)
    # the new token's K/V as the KV-write kernel stores them (saturating, never inf/NaN)
    kq = tl.clamp(k_in.to(tl.float32) / k_scale, -448.0, 448.0)
    vq = tl.clamp(v_in.to(tl.float32) / v_scale, -448.0, 448.0)
    kq = kq.to(k_cache_ptr.dtype.element_ty)
    vq = vq.to(v_cache_ptr.dtype.element_ty)
    if (new >= start) & (new < end):  # this program owns the new token's slot
        if EARLY_IO:
            slot = slot_early
        else:
            slot = tl.load(slot_ptr).to(tl.int64)
        if slot >= 0:
            dst = (slot // PAGE) * stride_blk + (slot % PAGE) * stride_pos + h * HEAD + d
            tl.store(k_cache_ptr + dst, kq)
            tl.store(v_cache_ptr + dst, vq)
    kn = kq.to(tl.float16)  # e4m3 -> fp16 is exact
    vn = vq.to(tl.float16)
    m_i = tl.full([G_P], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([G_P], dtype=tl.float32)
    acc = tl.zeros([G_P, HEAD], dtype=tl.float32)
    t_first = start
    if EARLY:  # the tile loaded before the wait (all masked in an empty split: a no-op)
        m_i, l_i, acc = _attend(q, k, v, kn, vn, start, end, new, m_i, l_i, acc, scale_log2, DEQ, BLOCK_N)
        t_first = start + BLOCK_N
    for t0 in range(t_first, end, BLOCK_N):
        k, v = _tile(k_cache_ptr, v_cache_ptr, table_ptr, t0, end, new, h, d, stride_blk, stride_pos,
                     PAGE, HEAD, BLOCK_N)
        m_i, l_i, acc = _attend(q, k, v, kn, vn, t0, end, new, m_i, l_i, acc, scale_log2, DEQ, BLOCK_N)
    out_rows = out_ptr + (h * GROUP + r)[:, None] * stride_oh + d[None, :]
    if SPLITS == 1:
        tl.store(out_rows, (acc / tl.where(l_i > 0, l_i, 1.0)[:, None] * out_scale).to(out_ptr.dtype.element_ty),
                 mask=r_ok[:, None])
    else:
        row = (h * SPLITS + s) * G_P + r
        tl.store(part_ptr + row[:, None] * HEAD + d[None, :], acc, mask=r_ok[:, None])
        tl.store(ml_ptr + row * 2, m_i)
        tl.store(ml_ptr + row * 2 + 1, l_i)
        tl.debug_barrier()  # every thread's partial stores precede the ticket (released by the atomic)
        ticket = tl.atomic_add(count_ptr + h, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLITS - 1:  # the last program of kv head h: merge all SPLITS partials
            tl.debug_barrier()  # (uniform branch) no thread loads a partial before the ticket's acquire
            tl.store(count_ptr + h, 0)  # every program has drawn its ticket: ready for the next launch
            hrow = h * SPLITS * G_P + r
            m_all = tl.full([G_P], -float("inf"), dtype=tl.float32)
            for j in tl.static_range(SPLITS):
                m_all = tl.maximum(m_all, tl.load(ml_ptr + (hrow + j * G_P) * 2, cache_modifier=".cg"))
            tot = tl.zeros([G_P, HEAD], dtype=tl.float32)
            den = tl.zeros([G_P], dtype=tl.float32)
            for j in tl.static_range(SPLITS):
                rj = hrow + j * G_P
                mj = tl.load(ml_ptr + rj * 2, cache_modifier=".cg")
                lj = tl.load(ml_ptr + rj * 2 + 1, cache_modifier=".cg")
                w = tl.where(mj == -float("inf"), 0.0, tl.exp2(mj - m_all))
                den += w * lj
                tot += w[:, None] * tl.load(part_ptr + rj[:, None] * HEAD + d[None, :], mask=r_ok[:, None],
                                            other=0.0, cache_modifier=".cg")
            out = tot / tl.where(den > 0, den, 1.0)[:, None] * out_scale
            tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=r_ok[:, None])


_SCRATCH: dict = {}


def _scratch(device, num_kv: int, splits: int, g_p: int, head: int):
    """Partials, (max, sum) pairs and the per-kv-head tickets; one set per shape and device, shared by all layers
    (their launches run one after another on the stream; the counters are back at 0 after every launch)."""
    import torch

    key = (str(device), num_kv, splits, g_p, head)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty(num_kv * splits * g_p, head, dtype=torch.float32, device=device),
                         torch.empty(num_kv * splits * g_p, 2, dtype=torch.float32, device=device),
                         torch.zeros(num_kv, dtype=torch.int32, device=device))
    return _SCRATCH[key]


def fp8_decode_one(query, key, value, k_cache, v_cache, block_table, seq_lens, slot_mapping, out, *, scale: float,
                   k_scale: float, v_scale: float, splits: int = 16, block_n: int = 64, num_warps: int = 4,
                   deq: int = 3, early: bool = True, pdl: dict | None = None, early_io: bool | None = None,
                   rope: tuple | None = None) -> None:
    """One decode token of one request: ``query [1, H, D]``, ``key``/``value [1, KVH, D]`` (after rotary) ->
    ``out [1, H, D]``; stores the new K/V (e4m3, ``/ k_scale`` / ``/ v_scale``) at ``slot_mapping[0]`` of the caches
    ``[blocks, page, KVH, D]``. ``block_table`` is the request's row, ``seq_lens [1]`` counts the new token.
    ``scale`` is the softmax scale times ``k_scale``. ``deq``: ``_fp8_kv_decode._deq``'s exact conversions, 0 (Triton's)
    or 3 (the same pinned before shared memory; GPU only). ``early_io``: the kernel's ``EARLY_IO`` (None: ``EARLY_IO_ON``).
    ``rope``: ``(positions [1], cos, sin [max_pos, head / 2])``: ``query`` / ``key`` are not rotated yet (neox, full)."""
    if splits < 1 or splits & (splits - 1) or splits > 64:
        raise ValueError(f"fp8_decode_one: splits must be a power of two in 1..64, not {splits}")
    if deq not in (0, 3):
        raise ValueError(f"fp8_decode_one: deq must be 0 or 3 (the exact e4m3 -> fp16 conversions), not {deq}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    num_heads, head = query.shape[1], query.shape[2]
    num_kv = key.shape[1]
    group = num_heads // num_kv
    g_p = max(16, triton.next_power_of_2(group))
    part, ml, count = _scratch(query.device, num_kv, splits, g_p, head)
    from octavo.plugins.attention._triton_kernels import LOG2E

    if rope is not None:
        pos, cos, sin = rope
        if cos.shape[-1] * 2 != head or cos.stride(-1) != 1 or sin.stride() != cos.stride() or pos.numel() != 1:
            raise ValueError(f"fp8_decode_one: rope needs neox cos / sin tables [positions, {head // 2}] and one "
                             f"position, got {tuple(cos.shape)} / {tuple(sin.shape)}, {pos.numel()} positions")
    r_args = dict(pos_ptr=rope[0], cos_ptr=rope[1], sin_ptr=rope[2], stride_cos=rope[1].stride(0), ROPE=True) \
        if rope is not None else {}
    _fp8_decode_one_kernel[(num_kv, splits)](
        query, key, value, k_cache, v_cache, block_table, seq_lens, slot_mapping, out, part, ml, count,
        query.stride(1), key.stride(1), value.stride(1), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        scale * LOG2E, v_scale, k_scale, v_scale, **r_args,
        GROUP=group, G_P=g_p, HEAD=head, PAGE=k_cache.shape[1], BLOCK_N=block_n, SPLITS=splits, DEQ=deq,
        EARLY=early, EARLY_IO=EARLY_IO_ON if early_io is None else bool(early_io), num_warps=num_warps, num_stages=1,
        **(pdl or {}))


# session 15 (engineer fp815): the slot read before the PDL wait, q and the new k / v in one round trip after it
# (the kernel's EARLY_IO; the same bits). ``OCTAVO_FP8_DECODE_ONE_EARLY_IO``: on since session 15's H100 A/Bs (the
# attention's critical path -3 to -5 us in 5 measures, with the rotary inside -6 us of the forward; tokens equal)
EARLY_IO_ON = env_switch("OCTAVO_FP8_DECODE_ONE_EARLY_IO", default=True)


# (GQA group, head size) -> fp8_decode_one launch, measured on H100; other shapes keep the backend's launches
TABLE: dict[tuple[int, int], dict] = {
    # Llama-3-8B (32 / 8 heads, 128), session 8 batch 2, H100, 8B fp8 bs1 in one engine: defaults 3.711 / again 3.801
    # ms/token (graph 3.263 / 3.353), this 3.603 (graph 3.158) = 0.841 of the roofline; 8 warps 3.644, 8 splits 3.756
    (4, 128): dict(splits=16, block_n=64, num_warps=4, deq=3),
}
DEFAULT_LAUNCH = dict(splits=16, block_n=64, num_warps=4, deq=3)


def one_launch(cache_dtype, group: int, head_size: int, num_tokens: int, num_reqs: int, window, soft_cap):
    """The ``fp8_decode_one`` keyword arguments for this call, or None (the backend's own launches)."""
    import os

    import torch

    raw = os.environ.get("OCTAVO_FP8_DECODE_ONE", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"OCTAVO_FP8_DECODE_ONE={raw!r}: 0 (never), 1 (every e4m3 cache with a power-of-two head "
                         "size), or unset (the measured TABLE)")
    if (raw == "0" or cache_dtype != torch.float8_e4m3fn or num_tokens != 1 or num_reqs != 1 or window or soft_cap
            or head_size & (head_size - 1) or head_size < 16):
        return None
    if raw == "1":
        return dict(TABLE.get((group, head_size), DEFAULT_LAUNCH))
    hit = TABLE.get((group, head_size))
    return None if hit is None else dict(hit)
