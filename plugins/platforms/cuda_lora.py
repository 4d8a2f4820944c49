"""LoRA shrink/expand on CUDA in Triton: segmented (SGMV-style) kernels over tokens sorted by adapter slot.

The CUDA platform's answer to ``Platform.make_lora_kernels`` (this module is the object it returns): the SDK's
LoRA code (``octavo.lora``) never imports it, it gets it from the worker's platform (``None`` elsewhere: the
torch ops). Moved here from ``octavo.lora.triton_ops`` in session 7 (vendor kernels live in platform plugins).

The idea is punica's SGMV (as in S-LoRA and vLLM): tokens are grouped by adapter, and each program takes a
block of up to ``BLOCK_M`` tokens that all use ONE slot, so it multiplies them by one adapter matrix with
``tl.dot`` (tensor cores) instead of a per-token gemv. Written here from that description:

- :func:`plan_blocks` (once per step, host): the sorted token rows and, per block, ``(slot, start, end)``
  into those rows; copied to the device once per step and shared by every layer.
- shrink: ``h[i] = A[slot] @ x[rows[i]]`` for the block's tokens, gathering x's rows by pointer (no gather op),
  split over K (``SPLIT_K`` programs per block add their partial sums into an fp32 ``h`` with atomics), so a
  decode batch with few blocks still fills the GPU.
- expand: ``y[rows[i]] += B[slot] @ h[i]``: the scatter back is fused into the store (each token sits in
  exactly one block, so no atomics), and ``y`` is updated in place.

The torch ops in :mod:`octavo.lora.ops` are the reference; tests run these kernels under
``TRITON_INTERPRET=1`` on CPU at tiny shapes and compiled on a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16

# Launch parameters of the SGMV kernels (session 5: tuned on an H100 by benchmarks/lora_kernel_tune.py;
# docs/performance.md "LoRA on GPU"). ``k_per_split``: K columns one shrink program sums (0: the session-4 rule
# ``split = min(8, K // 512)``); the shrink then runs ``ceil(K / k_per_split)`` programs per block, adding into
# an fp32 ``h`` with atomics. ``OCTAVO_LORA_SGMV_CONFIG`` (a JSON object of these keys) overrides them: a tuning
# knob for benchmarks; an unknown key or a bad value is an error.
# ``part_expand``: a fused projection's expand (q/k/v, gate/up: B block-diagonal) reads only the R columns of the
# part an output tile lies in, not the other parts' zeros (1/3 of q/k/v's B bytes, 1/2 of gate/up's); used when
# every part's size is a multiple of ``block_n`` (0: off).
# ``static_h``: in CUDA graphs (octavo.lora.static) the shrink sums into a persistent fp32 buffer per projection
# that the host zeroes once per step (one memset for all projections), not a fresh ``torch.zeros`` per projection
# (a memset kernel each: 128 a step on a Llama-3-8B).
# Defaults from session 5's batch 1 (H100, benchmarks/lora_ops_bench.py: batch 64, 8 slots, rank 16, 32 layers of
# 8B widths, LoRA ops of one graphed decode step): session 4's rule 1.78 ms, k_per_split=128 1.45 ms, + part_expand
# + static_h 1.23 ms (measured on non-block-diagonal B there: batch 2 rechecks them against the dense op).
DEFAULT_CONFIG = {"k_per_split": 128, "block_k": 64, "block_n": 64, "shrink_warps": 4, "expand_warps": 4,
                  "part_expand": 1, "static_h": 1}
CONFIG = dict(DEFAULT_CONFIG)


def set_config(**kw) -> None:
    """Change :data:`CONFIG` (checked: known keys, positive powers of two except ``k_per_split`` >= 0)."""
    for key, val in kw.items():
        if key not in CONFIG:
            raise ValueError(f"LoRA SGMV config: unknown key {key!r} (known: {sorted(CONFIG)})")
        if key in ("part_expand", "static_h"):
            if val not in (0, 1):
                raise ValueError(f"LoRA SGMV config: {key}={val!r} must be 0 or 1")
        elif not isinstance(val, int) or val < 0 or (key != "k_per_split" and (val <= 0 or val & (val - 1))):
            raise ValueError(f"LoRA SGMV config: {key}={val!r} must be a positive power of two"
                             + (" or 0" if key == "k_per_split" else ""))
        if key == "k_per_split" and val and val % kw.get("block_k", CONFIG["block_k"]):
            raise ValueError(f"LoRA SGMV config: k_per_split={val} must be a multiple of block_k")
        CONFIG[key] = val


def load_env_config() -> None:
    """:data:`CONFIG` = the defaults updated by ``OCTAVO_LORA_SGMV_CONFIG`` (read at import and by every LoRA
    manager that uses these kernels, so each engine of one process reads the variable as it is then)."""
    import json
    import os

    CONFIG.clear()
    CONFIG.update(DEFAULT_CONFIG)
    raw = os.environ.get("OCTAVO_LORA_SGMV_CONFIG")
    if raw:
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"OCTAVO_LORA_SGMV_CONFIG={raw!r} is not JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"OCTAVO_LORA_SGMV_CONFIG={raw!r} must be a JSON object")
        set_config(**cfg)


load_env_config()


class BlockPlan:
    """Device tensors describing this step's token blocks (see :func:`plan_blocks`)."""

    __slots__ = ("rows", "blk_slot", "blk_start", "blk_end", "num_blocks", "num_rows")

    def __init__(self, rows, blk_slot, blk_start, blk_end, num_blocks: int, num_rows: int) -> None:
        self.rows, self.blk_slot, self.blk_start, self.blk_end = rows, blk_slot, blk_start, blk_end
        self.num_blocks, self.num_rows = num_blocks, num_rows


def plan_blocks(rows: torch.Tensor, segments: list[tuple[int, int, int]], device) -> BlockPlan:
    """Blocks of <= ``BLOCK_M`` tokens of one slot each, from ``rows`` (token indices sorted by slot) and
    ``segments`` (``(slot, start, end)`` into ``rows``). One host->device copy per step."""
    slots, starts, ends = [], [], []
    for slot, b, e in segments:
        for s in range(b, e, BLOCK_M):
            slots.append(slot)
            starts.append(s)
            ends.append(min(s + BLOCK_M, e))
    # every part starts 16-element aligned: Triton specializes pointers on 16-byte alignment, so unaligned parts
    # would compile a second variant of each kernel on some steps (seen once as a 4 s first prefill on an H100)
    m, nb = rows.numel(), len(slots)
    mp, nbp = -(-m // 16) * 16, -(-nb // 16) * 16
    packed = torch.zeros(mp + 3 * nbp, dtype=torch.int32)
    packed[:m] = rows.to(torch.int32)
    for i, col in enumerate((slots, starts, ends)):
        packed[mp + i * nbp:mp + i * nbp + nb] = torch.tensor(col, dtype=torch.int32)
    packed = packed.to(device, non_blocking=True)
    return BlockPlan(packed[:m], packed[mp:mp + nb], packed[mp + nbp:mp + nbp + nb],
                     packed[mp + 2 * nbp:mp + 2 * nbp + nb], nb, m)


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, h_ptr, rows_ptr, slot_ptr, start_ptr, end_ptr, K, R,
                   stride_xm, stride_as, stride_ar, stride_hm, k_per_split,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    blk = tl.program_id(0)
    split = tl.program_id(1)
    slot = tl.load(slot_ptr + blk)
    start = tl.load(start_ptr + blk)
    end = tl.load(end_ptr + blk)
    if start >= end:  # an unused block of a fixed (CUDA-graph) grid
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    m_mask = offs_m < end
    rows = tl.load(rows_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < R
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    k_lo = split * k_per_split
    for k0 in range(k_lo, k_lo + k_per_split, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = (offs_k < K) & (offs_k < k_lo + k_per_split)
        xt = tl.load(x_ptr + rows[:, None] * stride_xm + offs_k[None, :],
                     mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        at = tl.load(a_base + offs_r[None, :] * stride_ar + offs_k[:, None],
                     mask=r_mask[None, :] & k_mask[:, None], other=0.0)  # [BLOCK_K, BLOCK_R] = A^T tile
        acc += tl.dot(xt.to(at.dtype), at, input_precision=PRECISION)
    h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_r[None, :]
    h_mask = m_mask[:, None] & r_mask[None, :]
    if SPLIT_K == 1:
        tl.store(h_ptrs, acc, mask=h_mask)
    else:
        tl.atomic_add(h_ptrs, acc, mask=h_mask)


@triton.jit
def _expand_kernel(h_ptr, b_ptr, y_ptr, rows_ptr, slot_ptr, start_ptr, end_ptr, N, R, N1, N2, RP,
                   stride_hm, stride_bs, stride_bn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr,
                   PARTS: tl.constexpr):
    blk = tl.program_id(0)
    pid_n = tl.program_id(1)
    slot = tl.load(slot_ptr + blk)
    start = tl.load(start_ptr + blk)
    end = tl.load(end_ptr + blk)
    if start >= end:  # an unused block of a fixed (CUDA-graph) grid
        return
    offs_m = start + tl.arange(0, BLOCK_M)
    m_mask = offs_m < end
    rows = tl.load(rows_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
    if PARTS:  # the tile lies in one part (parts start at 0, N1, N2; multiples of BLOCK_N): its RP columns only
        n0 = pid_n * BLOCK_N
        r_lo = (n0 >= N1).to(tl.int32) * RP + (n0 >= N2).to(tl.int32) * RP
        offs_r = r_lo + tl.arange(0, BLOCK_R)
        r_mask = offs_r < r_lo + RP
    else:
        offs_r = tl.arange(0, BLOCK_R)
        r_mask = offs_r < R
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    bt = tl.load(b_ptr + slot.to(tl.int64) * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                 mask=r_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_R, BLOCK_N] = B^T tile
    ht = tl.load(h_ptr + offs_m[:, None] * stride_hm + offs_r[None, :], mask=m_mask[:, None] & r_mask[None, :],
                 other=0.0)
    delta = tl.dot(ht.to(bt.dtype), bt, input_precision=PRECISION)
    y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :]
    y_mask = m_mask[:, None] & n_mask[None, :]
    yt = tl.load(y_ptrs, mask=y_mask, other=0.0)
    tl.store(y_ptrs, (yt.to(tl.float32) + delta).to(yt.dtype), mask=y_mask)


def lora_shrink_expand_triton(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                              plan: BlockPlan, parts: list[int] | None = None,
                              h: torch.Tensor | None = None) -> torch.Tensor:
    """``y[t] += B[slot(t)] @ A[slot(t)] @ x[t]`` for the tokens in ``plan``, in place; returns ``y``.

    Shapes as :func:`octavo.lora.ops.lora_shrink_expand`. ``parts``: a fused projection's output offsets (its
    parts' B blocks on the diagonal, each ``R / len(parts)`` wide), for ``CONFIG["part_expand"]``. ``h``: an
    all-zero fp32 ``[>= rows, >= R]`` row-major buffer for the shrink's sums (else one is allocated and zeroed). A ``y`` whose last dim is strided is copied first
    (the copy is returned). Graph-safe: no host sync, the grid is ``plan.num_blocks`` (empty blocks return).
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    if y.stride(-1) != 1:
        y = y.contiguous()
    lora_a = lora_a.contiguous()
    if lora_b.stride(2) != 1:  # B may be a strided view ([S, out, R] of a [out, S*R] store: octavo.lora.static)
        lora_b = lora_b.contiguous()
    k, r, n_out = lora_a.shape[2], lora_a.shape[1], lora_b.shape[1]
    block_r = max(16, triton.next_power_of_2(r))
    cfg = CONFIG
    block_k = cfg["block_k"] if block_r <= 64 else min(cfg["block_k"], 32)
    if cfg["k_per_split"]:
        k_per_split = max(block_k, cfg["k_per_split"])
        split_k = triton.cdiv(k, k_per_split)
    else:  # session 4's rule
        split_k = max(1, min(8, k // 512))
        k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    prec = "ieee" if lora_a.dtype == torch.float32 else None  # fp32 adapters: exact fp32 dots, not tf32
    if h is None:
        h = (torch.zeros if split_k > 1 else torch.empty)(plan.num_rows, r, dtype=torch.float32, device=x.device)
    elif h.dtype != torch.float32 or h.stride(-1) != 1 or h.shape[0] < plan.num_rows or h.shape[1] < r:
        raise ValueError(f"lora_shrink_expand_triton: h must be fp32, row-major, >= [{plan.num_rows}, {r}]")
    _shrink_kernel[(plan.num_blocks, split_k)](
        x, lora_a, h, plan.rows, plan.blk_slot, plan.blk_start, plan.blk_end, k, r,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), h.stride(0), k_per_split,
        BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_K=block_k, SPLIT_K=min(split_k, 2), PRECISION=prec,
        num_warps=cfg["shrink_warps"])
    block_n = cfg["block_n"] if block_r <= 64 else min(cfg["block_n"], 32)
    n1 = n2 = n_out
    rp = r
    if cfg["part_expand"] and parts is not None and 1 < len(parts) <= 3 and r % len(parts) == 0 \
            and all(p % block_n == 0 for p in [*parts, n_out]):
        n1, n2 = (list(parts[1:]) + [n_out])[:2]
        rp = r // len(parts)
        block_r = max(16, triton.next_power_of_2(rp))
    _expand_kernel[(plan.num_blocks, triton.cdiv(n_out, block_n))](
        h, lora_b, y, plan.rows, plan.blk_slot, plan.blk_start, plan.blk_end, n_out, r, n1, n2, rp,
        h.stride(0), lora_b.stride(0), lora_b.stride(1), y.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_R=block_r, PRECISION=prec, num_warps=cfg["expand_warps"],
        PARTS=rp != r)
    return y


@triton.jit(do_not_specialize=["M"])  # M = the batch: one compiled kernel for every captured size
def _masked_expand_kernel(h_ptr, m_ptr, b_ptr, y_ptr, M, N, SR, R, stride_hm, stride_mm, stride_bn, stride_ym,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr,
                          PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j0 in range(0, SR, BLOCK_J):
        offs_j = j0 + tl.arange(0, BLOCK_J)
        j_ok = offs_j < SR
        hm = m_ok[:, None] & j_ok[None, :]
        ht = tl.load(h_ptr + offs_m[:, None] * stride_hm + offs_j[None, :], mask=hm, other=0.0)
        mk = tl.load(m_ptr + offs_m[:, None] * stride_mm + (offs_j // R)[None, :], mask=hm, other=0.0)
        bt = tl.load(b_ptr + offs_n[None, :] * stride_bn + offs_j[:, None], mask=j_ok[:, None] & n_ok[None, :],
                     other=0.0)  # [BLOCK_J, BLOCK_N] = B^T tile
        acc += tl.dot((ht * mk).to(bt.dtype), bt, input_precision=PRECISION)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    ym = m_ok[:, None] & n_ok[None, :]
    yt = tl.load(y_ptrs, mask=ym, other=0.0)
    tl.store(y_ptrs, (yt.to(tl.float32) + acc).to(yt.dtype), mask=ym)


def masked_expand(h: torch.Tensor, mask: torch.Tensor, b_flat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y[t] += b_flat @ (h[t] * mask[t, j // R])`` in place, one kernel (the dense graph op's expand with its
    slot mask folded in: octavo.lora.static). ``h [n, S*R]``, ``mask [>= n, S]``, ``b_flat [out, S*R]``.
    Fixed tiles (64 rows), so one compiled kernel serves every captured batch size."""
    n, sr = h.shape
    r = sr // mask.shape[1]
    n_out = b_flat.shape[0]
    if y.stride(-1) != 1 or h.stride(-1) != 1 or b_flat.stride(-1) != 1:
        raise ValueError("masked_expand needs row-major h, b_flat and y")
    prec = "ieee" if b_flat.dtype == torch.float32 else None
    _masked_expand_kernel[(triton.cdiv(n, 64), triton.cdiv(n_out, 64))](
        h, mask, b_flat, y, n, n_out, sr, r, h.stride(0), mask.stride(0), b_flat.stride(0), y.stride(0),
        BLOCK_M=64, BLOCK_N=64, BLOCK_J=32, PRECISION=prec)
    return y
