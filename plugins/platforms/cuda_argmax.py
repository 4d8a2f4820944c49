"""``torch.argmax(x, dim=-1)`` of a few long rows in two small launches (the greedy head graph, cuda_graph_head.py).

Why: torch reduces each logits row (128,256 columns on the Llama-3 vocabulary) in one thread block: 0.028 ms per
batch-1 token on an H100 (docs/performance.md, "Async scheduling on by default"), for a read of 0.5 MB. Here stage
1 splits each row into chunks over the whole GPU, stage 2 picks the best chunk of each row.

Same answer as torch.argmax, bit for bit (argmax is exact, so only the rules matter): the first index of the
largest value; a NaN counts as larger than everything (the first NaN wins, as in torch); -0.0 equals 0.0; a row of
-inf gives 0. Each lane keeps the first of equal values among its columns (visited in increasing order), and every
merge takes the lowest index among equal candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
MAX_CHUNKS = 64
_NONE = tl.constexpr(2147483647)  # "no column yet": any real column wins against it (a constexpr: jit globals must be)


@triton.jit
def _pick(vals, idx):
    """(value, index) of the winner among lanes: a NaN lane first, else the largest value; the lowest index
    among equal candidates."""
    nan = vals != vals
    any_nan = tl.max(nan.to(tl.int32), 0) > 0
    top = tl.max(tl.where(nan, float("-inf"), vals), 0)
    cand = tl.where(any_nan, nan, vals == top)
    first = tl.min(tl.where(cand, idx, _NONE), 0)
    return tl.where(any_nan, float("nan"), top), first


@triton.jit(do_not_specialize=["n_cols", "chunk", "n_chunks"])
def _argmax_partial_kernel(x_ptr, stride, n_cols, chunk, n_chunks, val_ptr, idx_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n_cols)
    i = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], _NONE, tl.int32)
    for start in range(lo, hi, BLOCK):
        cols = start + i
        m = cols < hi
        x = tl.load(x_ptr + row * stride + cols, mask=m, other=float("-inf")).to(tl.float32)
        # strictly greater (first of equal stays), a NaN over a number, and any column over "none yet"
        take = m & ((x > best) | ((x != x) & (best == best)) | (best_idx == _NONE))
        best = tl.where(take, x, best)
        best_idx = tl.where(take, cols, best_idx)
    v, first = _pick(best, best_idx)
    tl.store(val_ptr + row * n_chunks + c, v)
    tl.store(idx_ptr + row * n_chunks + c, first)


@triton.jit(do_not_specialize=["n_chunks"])
def _argmax_final_kernel(val_ptr, idx_ptr, out_ptr, n_chunks, MAX_CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, MAX_CHUNKS)
    m = k < n_chunks
    v = tl.load(val_ptr + row * n_chunks + k, mask=m, other=float("-inf"))
    idx = tl.load(idx_ptr + row * n_chunks + k, mask=m, other=_NONE)
    _, first = _pick(v, idx)
    tl.store(out_ptr + row, first.to(tl.int64))


def argmax_rows(x: torch.Tensor, target_programs: int = 264, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x.argmax(dim=-1)`` for a 2-D ``x`` (unit column stride; fp32 / bf16 / fp16) as int64 ``[rows]`` (into ``out``,
    a contiguous int64 ``[rows]``, when given: the one-graph step writes its id buffer directly)."""
    rows, n_cols = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    blocks = triton.cdiv(n_cols, BLOCK)
    want = max(1, min(MAX_CHUNKS, blocks, triton.cdiv(target_programs, rows)))
    per = triton.cdiv(blocks, want)
    n_chunks, chunk = triton.cdiv(blocks, per), per * BLOCK
    vals = torch.empty((rows, n_chunks), dtype=torch.float32, device=x.device)
    idx = torch.empty((rows, n_chunks), dtype=torch.int32, device=x.device)
    _argmax_partial_kernel[(rows, n_chunks)](x, x.stride(0), n_cols, chunk, n_chunks, vals, idx, BLOCK=BLOCK,
                                             num_warps=4)
    _argmax_final_kernel[(rows,)](vals, idx, out, n_chunks, MAX_CHUNKS=MAX_CHUNKS, num_warps=1)
    return out


# The eager sampler's all-greedy argmax (``Platform.make_greedy_argmax``, session 16): torch.argmax reduces each row in
# one block (28 us for one 128,256-column row on an H100, the largest piece of a batch-1 step outside the graph
# after the LM head); the two launches above take the row over the whole GPU. Rows above SMALL_ROWS keep torch's
# kernel (its one block a row is then many blocks; not measured against these). OCTAVO_CUDA_GREEDY_ARGMAX=1/0.
GREEDY_DEFAULT_ON = False  # opt-in until the H100 A/B (benchmarks/head16_ab.py) shows a gain with equal tokens
SMALL_ROWS = 16


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` (int64 ``[rows]``): :func:`argmax_rows` for 1..:data:`SMALL_ROWS` rows."""
    if logits.dim() == 2 and 0 < logits.shape[0] <= SMALL_ROWS and logits.is_cuda:
        return argmax_rows(logits)
    return logits.argmax(dim=-1)


def make_greedy_argmax():
    """:func:`greedy_argmax` when ``OCTAVO_CUDA_GREEDY_ARGMAX`` (default :data:`GREEDY_DEFAULT_ON`) is on, else None."""
    from octavo.env_flags import env_switch

    return greedy_argmax if env_switch("OCTAVO_CUDA_GREEDY_ARGMAX", GREEDY_DEFAULT_ON) else None
