"""An experimental decode kernel for an fp8 KV cache (issue 9: the 512-row fp8 step is two-thirds attention, and
the fp8 cache streamed at 2.45 TB/s vs the bf16 cache's 2.95 in ``_triton_decode.py``'s kernel on H100).

Why a second fp8 kernel: per KV byte an fp8 cache needs twice the conversion and MMA work of a bf16 one, and
Triton's pipelined loads (``num_stages`` >= 2) stage the fp8 tiles through shared memory, then convert them
element by element in the dot-operand layout. Two levers are tried here, both selectable per launch so one
microbench (benchmarks/fp8_attn7.py) compares them with the table's launch of ``_triton_decode``:

- ``PREFETCH``: register double buffering (launched with ``num_stages=1``): the next tile's K/V loads are issued
  before the current tile's dots, so they are in flight during the math, without the shared-memory staging;
- ``DEQ`` (``DEQ_V`` for V if >= 0): how e4m3 becomes fp16: 0 = Triton's conversion (``cvt.rn.f16x2.e4m3x2``),
  which Triton moves after the tile's staging in shared memory, so the dots read single bytes there (sm_90 SASS of
  the table's fp8 launch: 5.4 instructions per cache byte in the key loop, the bf16 cache 1.5 per byte); 3 = the
  same conversion as impure inline PTX, which stays after the global load: the tile is staged as fp16 and read with
  ``ldmatrix`` (2.4 instructions per byte at 128 keys / 4 warps / 1 stage, Triton 3.6); 1 = the bit trick (the
  e4m3 byte placed in an fp16's high bits, sign kept: the value times 2**-8, exact, subnormals included),
  done by ``prmt``/``lop3`` in inline PTX on 4 bytes at once (GPU only); 2 = the same trick in plain Triton
  integer ops (runs under ``TRITON_INTERPRET=1``: the CPU test checks the arithmetic). The 2**8 is folded into
  the softmax scale and the output scale, so the dots see the scaled values only.

One program owns one (request, KV head); the grid runs the KV heads of a request next to each other and, with
``order``, the requests longest first (as the table's launch). e4m3 caches only (``DEQ`` 1/2 are e4m3 bit layouts);
no split-KV, no K/V write. The ``triton`` backend runs an e4m3 cache's decode rows here for the shapes in ``TABLE``
(``fp8_launch``; ``OCTAVO_FP8_KV_DECODE`` overrides it), else ``_triton_decode``'s launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

F16_MAX = tl.constexpr(65504.0)
#: DEQ 1 / 2 give the e4m3 value times 2**-8; the kernel multiplies the scores and the output back by this
DEQ_SHIFT_SCALE = 256.0


@triton.jit
def _e4m3_to_f16_asm(x):
    """e4m3 bytes -> fp16 holding value * 2**-8 (sign | exponent+mantissa bits moved under fp16's bias 15)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 a<2>, b<2>;
        prmt.b32 a0, 0, $2, 0x5140;
        prmt.b32 a1, 0, $2, 0x7362;
        lop3.b32 b0, a0, 0x7fff7fff, 0, 0xc0;
        lop3.b32 b1, a1, 0x7fff7fff, 0, 0xc0;
        shr.b32  b0, b0, 1;
        shr.b32  b1, b1, 1;
        lop3.b32 $0, b0, 0x80008000, a0, 0xf8;
        lop3.b32 $1, b1, 0x80008000, a1, 0xf8;
        }
        """,
        constraints="=r,=r,r",
        args=[x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _e4m3_to_f16_int(x):
    """The same as ``_e4m3_to_f16_asm`` in portable integer ops (interpreter and any GPU)."""
    b = x.to(tl.uint8, bitcast=True).to(tl.uint16)
    h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
    return h.to(tl.float16, bitcast=True)


@triton.jit
def _e4m3_to_f16_cvt_pinned(x):
    """Triton's own conversion (``cvt.rn.f16x2.e4m3x2``, exact), as inline PTX marked impure so the compiler keeps
    it where it is written: right after the global load, before the tile is staged in shared memory, so the dot
    reads 16-bit operands with ``ldmatrix`` instead of single bytes (the V operand of P @ V needs key pairs that
    are 1 KiB apart in the cache)."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }
        """,
        constraints="=r,=r,r",
        args=[x.to(tl.uint8, bitcast=True)],
        dtype=tl.float16,
        is_pure=False,
        pack=4,
    )


@triton.jit
def _deq(x, DEQ: tl.constexpr):
    if DEQ == 1:
        return _e4m3_to_f16_asm(x)
    elif DEQ == 2:
        return _e4m3_to_f16_int(x)
    elif DEQ == 3:
        return _e4m3_to_f16_cvt_pinned(x)
    else:
        return x.to(tl.float16)


# the block table's row stride follows the step's longest context in eager (mixed) steps: not specialized, so the
# timed run builds no variant the warm-up missed (session 8 batch 1: 'D' at capture, '' in a warm-up step)
@triton.jit(do_not_specialize=["stride_bt"], do_not_specialize_on_alignment=["stride_bt"])
def _fp8_kv_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, order_ptr,
    scale_log2, out_scale, num_kv_heads,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_bt,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_D: tl.constexpr, PAGE: tl.constexpr,
    DEQ: tl.constexpr, PREFETCH: tl.constexpr, ORDERED: tl.constexpr, DEQ_V: tl.constexpr = -1,
):
    pid = tl.program_id(0)
    req = pid // num_kv_heads
    kv_head = pid % num_kv_heads
    if ORDERED:
        req = tl.load(order_ptr + req)
    q_start = tl.load(query_start_loc_ptr + req)
    if tl.load(query_start_loc_ptr + req + 1) == q_start:
        return
    seq_len = tl.load(seq_lens_ptr + req)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_D)
    offs_n = tl.arange(0, BLOCK_N)
    row_ok = offs_m < GROUP
    head = kv_head * GROUP + offs_m
    q_off = q_start.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0)
    q = tl.clamp(q.to(tl.float32), -F16_MAX, F16_MAX).to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], dtype=tl.float32)
    bt_row = block_tables_ptr + req.to(tl.int64) * stride_bt
    head_off = kv_head * HEAD_D
    if PREFETCH:
        pos = offs_n
        pos_ok = pos < seq_len
        blk = tl.load(bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
        kv_off = blk * stride_cb + (pos % PAGE) * stride_cs + head_off
        k_nx = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=pos_ok[:, None], other=0.0)
        v_nx = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=pos_ok[:, None], other=0.0)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + offs_n
        pos_ok = pos < seq_len
        if PREFETCH:  # this tile was loaded last iteration; issue the next one's loads before the math
            k = k_nx
            v = v_nx
            npos = pos + BLOCK_N
            n_ok = npos < seq_len
            nblk = tl.load(bt_row + npos // PAGE, mask=n_ok, other=0).to(tl.int64)
            n_off = nblk * stride_cb + (npos % PAGE) * stride_cs + head_off
            k_nx = tl.load(k_cache_ptr + n_off[:, None] + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            v_nx = tl.load(v_cache_ptr + n_off[:, None] + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        else:
            blk = tl.load(bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
            kv_off = blk * stride_cb + (pos % PAGE) * stride_cs + head_off
            k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=pos_ok[:, None], other=0.0)
            v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=pos_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(_deq(k, DEQ))) * scale_log2
        s = tl.where(pos_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), _deq(v, DEQ if DEQ_V < 0 else DEQ_V))
        m_i = m_new

    out = acc / l_i[:, None] * out_scale
    o_off = q_start.to(tl.int64) * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def fp8_kv_decode(query, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, *, num_reqs: int,
                  num_kv_heads: int, scale: float, v_scale: float, block_size: int, block_n: int = 128,
                  num_warps: int = 4, deq: int = 0, prefetch: bool = True, order=None,
                  maxnreg: int | None = None, num_stages: int | None = None, deq_v: int | None = None) -> None:
    """``out[t] = softmax(q[t] K^T * scale) V * v_scale`` over each request's context, one token per request, on an
    e4m3 cache ``[num_blocks, block_size, num_kv_heads, head_size]`` (``scale`` includes ``k_scale``).
    ``prefetch`` launches with ``num_stages=1`` (the kernel double-buffers in registers), else ``num_stages``
    (default 2: Triton's pipeliner stages the tiles through shared memory; 1: plain loads)."""
    import torch

    from octavo.plugins.attention._triton_kernels import LOG2E

    if k_cache.dtype != torch.float8_e4m3fn or v_cache.dtype != torch.float8_e4m3fn:
        raise ValueError(f"fp8_kv_decode: e4m3 caches only, got {k_cache.dtype} / {v_cache.dtype}")
    num_heads, head_size = query.shape[1], query.shape[2]
    if head_size & (head_size - 1) or head_size < 16:
        raise ValueError(f"fp8_kv_decode: head size {head_size} is not a power of two >= 16")
    dv = deq if deq_v is None else deq_v
    if deq not in (0, 1, 2, 3) or dv not in (0, 1, 2, 3) or (deq in (1, 2)) != (dv in (1, 2)):
        raise ValueError(f"fp8_kv_decode: deq={deq}, deq_v={deq_v}: 0 Triton's conversion, 1 PTX bit trick, "
                         "2 integer bit trick, 3 Triton's conversion pinned before shared memory (K and V must "
                         "agree on the 2**-8 scaling of 1 / 2)")
    group = num_heads // num_kv_heads
    shift = DEQ_SHIFT_SCALE if deq in (1, 2) else 1.0
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    _fp8_kv_decode_kernel[(num_reqs * num_kv_heads,)](
        query, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc,
        seq_lens if order is None else order, scale * LOG2E * shift, v_scale * shift, num_kv_heads,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        block_tables.stride(0),
        GROUP=group, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, HEAD_D=head_size,
        PAGE=block_size, DEQ=deq, DEQ_V=dv, PREFETCH=prefetch, ORDERED=order is not None,
        num_warps=num_warps, num_stages=1 if prefetch else (num_stages or 2), **extra,
    )


# (GQA group, head size) -> fp8_kv_decode launch for an e4m3 cache's decode rows, measured on H100
# (docs/performance.md "FP8 session 7"); shapes not listed keep _triton_decode's table launch
TABLE: dict[tuple[int, int], dict] = {
    # Llama-3-8B (32 / 8 heads, 128), e4m3 cache, 420 requests x U[1000, 2000] keys (session 7 batch 1, H100, read
    # roof 3.02 TB/s): table launch 2.45 TB/s, this 2.56 (maxnreg none 2.49, 64 keys 2.31, 8 warps 2.06, 2 stages
    # 2.08, Triton's conversion 2.12; the bf16 cache 2.99)
    (4, 128): dict(block_n=128, num_warps=4, num_stages=1, deq=3, maxnreg=128),
}

_KEYS = {"block_n": (16, 32, 64, 128, 256), "warps": (2, 4, 8), "stages": (1, 2, 3), "deq": (0, 1, 3),
         "maxnreg": (0, 64, 80, 96, 104, 112, 128, 160)}
_OPTIONAL = {"maxnreg": 0}


def _from_env(raw: str) -> dict:
    got: dict[str, int] = {}
    for part in raw.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in _KEYS or not value.strip().isdigit() or int(value) not in _KEYS[name] or name in got:
            raise ValueError(f"OCTAVO_FP8_KV_DECODE={raw!r}: 0 (off), or each of "
                             + ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in _KEYS.items())
                             + " once (maxnreg may be left out: 0, no cap)")
        got[name] = int(value)
    got = {**_OPTIONAL, **got}
    if set(got) != set(_KEYS):
        raise ValueError(f"OCTAVO_FP8_KV_DECODE={raw!r}: missing {sorted(set(_KEYS) - set(got))}")
    return {"block_n": got["block_n"], "num_warps": got["warps"], "num_stages": got["stages"], "deq": got["deq"],
            "maxnreg": got["maxnreg"] or None, "prefetch": False}


def fp8_launch(cache_dtype, group: int, head_size: int) -> dict | None:
    """The ``fp8_kv_decode`` keyword arguments for this layer's decode rows, or None (the table kernel of
    ``_triton_decode``). ``OCTAVO_FP8_KV_DECODE``: ``0`` = never; unset = ``TABLE``; else a launch for every e4m3
    shape with a power-of-two head size, e.g. ``block_n=128,warps=4,stages=1,deq=3`` (refused if malformed)."""
    import os

    import torch

    raw = os.environ.get("OCTAVO_FP8_KV_DECODE", "").strip()
    if raw == "0":
        return None
    launch = _from_env(raw) if raw else None
    if cache_dtype != torch.float8_e4m3fn or head_size & (head_size - 1) or head_size < 16:
        return None
    if launch is not None:
        return launch
    hit = TABLE.get((group, head_size))
    return None if hit is None else dict(hit, prefetch=False)
