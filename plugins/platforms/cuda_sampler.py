"""One-pass Triton sampling (temperature, greedy, and min-p / top-k / top-p as one logit threshold per row): the
CUDA platform's answer to ``Platform.make_fused_sampler`` (:func:`sample_rows`; the core's ``Sampler`` calls it
through the platform, never by import, and keeps the torch path for everything else).

Why: at temperature 0.6 the torch path (``core/sampler.py``) makes ~11 passes over a rows x vocab fp32 tensor
(divide, softmax, exponential noise, divide, argmax, ...): ~0.35 ms per decode step at batch ~140 on the
Qwen3 vocabulary (151,936), about 4 % of the nano-vllm step. Here each logits element is read once.

Sampling uses the Gumbel-max trick, the same identity as the torch path's ``argmax(p / q)``, q ~ Exp(1):
``argmax(x / T - log(-log(u)))`` with u ~ U(0, 1) is a draw from ``softmax(x / T)``. The uniforms come from
Philox (``tl.randint4x``) keyed per row and counted by column, so a row's noise depends only on its key and
the column, never on the batch, the grid or the chunking. ``u = (top 23 bits + 0.5) / 2**23`` is exact in
fp32 and never 0 or 1, so the noise is finite (truncated at -2.81 and +16.6: a tail mass of ~6e-8 per element).
The kernel scores in base 2, ``x * log2(e) / T - log2(-log2(u))`` = ``log2(e) * (x / T + g) + const`` for the
natural Gumbel ``g`` (same argmax; :func:`gumbel_noise` exports ``g``): one multiply-add per element instead of
a division, and the outer logarithm is the GPU's one-instruction ``lg2.approx`` (absolute error <= 2**-22 on
noise of order 1), while the inner one stays libdevice's accurate ``log2``, whose relative accuracy near u = 1
is what the largest noise values (the likely winners) depend on. Session 9 (docs/performance.md): the kernel
was bound by Philox and two accurate logarithms per element.

Two launches: stage 1, grid (rows, chunks), keeps the best (score, column) of each chunk; stage 2 picks the
best chunk of each row. Ties go to the lowest column, as ``torch.argmax`` does, so greedy rows (temperature
0) give exactly ``logits.argmax(-1)`` (NaN logits excepted: torch returns the NaN's column, this skips it).

Keys: an unseeded row's key is ``base + row * K`` with ``base`` drawn per call from torch's default CPU
generator (``torch.manual_seed`` makes a run repeatable); a seeded row's key (``seeded_key``) mixes the
request's seed with the number of draws it made before, so ``seed=`` is reproducible and independent of
the rest of the batch.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

_ROW_MUL = 6364136223846793005  # odd 63-bit multiplier spreading rows over Philox keys
_MASK64 = (1 << 64) - 1
SUB = 1024  # columns per Philox call lane; a call covers 4 * SUB columns (fixed: the noise depends on it)
MAX_CHUNKS = 64  # stage 2 reads at most this many partial results per row (one compiled variant)


@triton.jit
def _gumbel2(r, FAST: tl.constexpr):
    """Base-2 Gumbel noise ``-log2(-log2(u))`` = ``(g - ln ln 2) / ln 2`` for the natural Gumbel ``g``, from 32
    random bits: u = (top 23 bits + 0.5) / 2**23 is exact in fp32 and in (0, 1). ``FAST``: the outer log2 is
    ``lg2.approx`` (not in the interpreter)."""
    u = ((r >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07
    # accurate: near u = 1 its relative error is the largest noise values' error. -log2(u) >= 8.6e-8 exactly;
    # the floor 2**-25 keeps the outer log finite whatever the rounding
    e = tl.maximum(-tl.log2(u), 2.9802322387695312e-08)
    if FAST:
        return -libdevice.fast_log2f(e)
    else:
        return -tl.log2(e)


@triton.jit
def _fold(ptr, cols, hi, r, scale, thr, best, best_idx, RANDOM: tl.constexpr, FAST: tl.constexpr):
    """Fold one block of columns into the per-lane running (best score, its column): elementwise only; a
    lane sees its columns in increasing order and keeps the first of equal scores. Random rows draw only
    among logits >= ``thr`` (min-p / top-k / top-p, as a logit threshold; -inf: no filter) and score
    ``x * scale + noise``, ``scale = log2(e) / T``."""
    m = cols < hi
    x = tl.load(ptr + cols, mask=m, other=float("-inf")).to(tl.float32)
    if RANDOM:
        x = tl.where(m & (x >= thr), x * scale + _gumbel2(r, FAST), float("-inf"))
    take = x > best
    return tl.where(take, x, best), tl.where(take, cols, best_idx)


@triton.jit(do_not_specialize=["base", "chunk", "n_chunks"])
def _sample_partial_kernel(logits_ptr, stride, temp_ptr, keys_ptr, thr_ptr, base, n_cols, chunk, n_chunks,
                           part_val_ptr, part_idx_ptr, HAS_KEYS: tl.constexpr, HAS_THR: tl.constexpr,
                           SUB: tl.constexpr, FAST: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    row64 = row.to(tl.int64)
    ptr = logits_ptr + row64 * stride
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n_cols)
    i = tl.arange(0, SUB)
    best = tl.full([SUB], float("-inf"), tl.float32)
    best_idx = lo + i
    temp = tl.load(temp_ptr + row).to(tl.float32)
    if temp > 0:
        if HAS_KEYS:
            key = tl.load(keys_ptr + row)
        else:
            key = base + row64 * 6364136223846793005
        if HAS_THR:
            thr = tl.load(thr_ptr + row).to(tl.float32)
        else:
            thr = float("-inf")
        scale = 1.4426950408889634 / temp  # log2(e) / T: base-2 scores, same argmax
        for start in range(lo, hi, 4 * SUB):
            r0, r1, r2, r3 = tl.randint4x(key, start // 4 + i)
            best, best_idx = _fold(ptr, start + i, hi, r0, scale, thr, best, best_idx, True, FAST)
            best, best_idx = _fold(ptr, start + SUB + i, hi, r1, scale, thr, best, best_idx, True, FAST)
            best, best_idx = _fold(ptr, start + 2 * SUB + i, hi, r2, scale, thr, best, best_idx, True, FAST)
            best, best_idx = _fold(ptr, start + 3 * SUB + i, hi, r3, scale, thr, best, best_idx, True, FAST)
    else:
        for start in range(lo, hi, 4 * SUB):
            best, best_idx = _fold(ptr, start + i, hi, i, temp, temp, best, best_idx, False, FAST)
            best, best_idx = _fold(ptr, start + SUB + i, hi, i, temp, temp, best, best_idx, False, FAST)
            best, best_idx = _fold(ptr, start + 2 * SUB + i, hi, i, temp, temp, best, best_idx, False, FAST)
            best, best_idx = _fold(ptr, start + 3 * SUB + i, hi, i, temp, temp, best, best_idx, False, FAST)
    v = tl.max(best, 0)
    first = tl.min(tl.where(best == v, best_idx, 2147483647), 0)  # ties: the lowest column
    tl.store(part_val_ptr + row64 * n_chunks + c, v)
    tl.store(part_idx_ptr + row64 * n_chunks + c, first)


@triton.jit(do_not_specialize=["n_chunks"])
def _sample_final_kernel(part_val_ptr, part_idx_ptr, out_ptr, n_chunks, MAX_CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, MAX_CHUNKS)
    v = tl.load(part_val_ptr + row * n_chunks + k, mask=k < n_chunks, other=float("-inf"))
    a = tl.argmax(v, 0)  # ties: the first chunk (lowest columns)
    tl.store(out_ptr + row, tl.load(part_idx_ptr + row * n_chunks + a).to(tl.int64))


@triton.jit
def _gumbel(r, FAST: tl.constexpr):
    """The kernel's noise in natural units: ``g = ln 2 * g2 - ln ln 2`` for its base-2 noise ``g2``."""
    return _gumbel2(r, FAST) * 0.6931471805599453 + 0.36651292058166435


@triton.jit
def _noise_kernel(keys_ptr, out_ptr, n_cols, SUB: tl.constexpr, FAST: tl.constexpr):
    """The Gumbel noise the sampling kernel adds to each column of a row, in natural units (for tests and
    checks): the kernel's base-2 score is ``log2(e) * (x / T + g) + const``."""
    row = tl.program_id(0).to(tl.int64)
    key = tl.load(keys_ptr + row)
    i = tl.arange(0, SUB)
    base = out_ptr + row * n_cols
    for start in range(0, n_cols, 4 * SUB):
        r0, r1, r2, r3 = tl.randint4x(key, start // 4 + i)
        tl.store(base + start + i, _gumbel(r0, FAST), mask=start + i < n_cols)
        tl.store(base + start + SUB + i, _gumbel(r1, FAST), mask=start + SUB + i < n_cols)
        tl.store(base + start + 2 * SUB + i, _gumbel(r2, FAST), mask=start + 2 * SUB + i < n_cols)
        tl.store(base + start + 3 * SUB + i, _gumbel(r3, FAST), mask=start + 3 * SUB + i < n_cols)


#: the noise's outer logarithm as ``lg2.approx`` (True) or libdevice's accurate log2; benchmarks/nano_head_bench.py
#: flips it to time both. Never under Triton's interpreter (no PTX there).
FAST_LOG2 = True


def _fast() -> bool:
    return FAST_LOG2 and os.environ.get("TRITON_INTERPRET") != "1"


def gumbel_noise(keys: torch.Tensor, n_cols: int) -> torch.Tensor:
    """[R, n_cols] fp32: the noise :func:`fused_sample` adds to rows with these Philox ``keys`` ([R] int64)."""
    out = torch.empty((keys.shape[0], n_cols), dtype=torch.float32, device=keys.device)
    _noise_kernel[(keys.shape[0],)](keys, out, n_cols, SUB=SUB, FAST=_fast())
    return out


def seeded_key(seed: int, draw: int) -> int:
    """The Philox key of a seeded request's ``draw``-th sampling step (splitmix64 of both, 63 bits)."""
    z = (seed * 0x9E3779B97F4A7C15 + draw * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def unseeded_base() -> int:
    """A per-call key base from torch's default CPU generator, always >= 2**32 so Triton types it int64."""
    return int(torch.randint(1 << 32, 1 << 62, (1,)).item())


def row_keys(base: int, num_rows: int, seeded: dict[int, int]) -> torch.Tensor:
    """Every row's key on the host: ``base + row * K`` (wrapping like the kernel's int64) or a seeded key."""
    keys = []
    for row in range(num_rows):
        k = seeded.get(row)
        if k is None:
            k = (base + row * _ROW_MUL) & _MASK64
            k = k - (1 << 64) if k >= 1 << 63 else k
        keys.append(k)
    return torch.tensor(keys, dtype=torch.int64)


def num_chunks(rows: int, n_cols: int, target_programs: int = 1056) -> tuple[int, int]:
    """(chunks per row, columns per chunk): enough programs to fill the GPU at small batches."""
    blocks = triton.cdiv(n_cols, 4 * SUB)
    want = max(1, min(MAX_CHUNKS, blocks, triton.cdiv(target_programs, rows)))
    per = triton.cdiv(blocks, want)
    return triton.cdiv(blocks, per), per * 4 * SUB


def fused_sample(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor | None,
                 base: int | None = None, thresholds: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``logits`` ([R, V], fp32/bf16/fp16, unit column stride): the argmax for rows with
    ``temperature <= 0``, a draw from ``softmax(logits / temperature)`` otherwise, restricted to the logits
    ``>= thresholds[row]`` when given ([R] fp32). ``keys`` ([R] int64 on the device) overrides the per-row
    Philox keys; without it they derive from ``base`` (drawn when None)."""
    R, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(R, dtype=torch.int64, device=logits.device)
    if R == 0:
        return out
    n_chunks, chunk = num_chunks(R, V)
    part_val = torch.empty((R, n_chunks), dtype=torch.float32, device=logits.device)
    part_idx = torch.empty((R, n_chunks), dtype=torch.int32, device=logits.device)
    if base is None:
        base = unseeded_base()
    has_keys = keys is not None
    _sample_partial_kernel[(R, n_chunks)](
        logits, logits.stride(0), temperature, keys if has_keys else temperature,
        thresholds if thresholds is not None else temperature, base, V, chunk, n_chunks,
        part_val, part_idx, HAS_KEYS=has_keys, HAS_THR=thresholds is not None, SUB=SUB, FAST=_fast(), num_warps=4)
    _sample_final_kernel[(R,)](part_val, part_idx, out, n_chunks, MAX_CHUNKS=MAX_CHUNKS, num_warps=1)
    return out


def draw_index(gen: torch.Generator) -> int:
    """A seeded request's fused draw number, advancing its generator (the key then changes every step): a CUDA
    generator counts in its Philox offset (+4 per draw, as torch's own draws; no device work, and a CUDA
    generator cannot be weak-referenced to count elsewhere); a CPU generator (tests) draws one number."""
    if gen.device.type == "cuda":
        offset = gen.get_offset()
        gen.set_offset(offset + 4)
        return offset // 4
    return int(torch.randint(0, 1 << 62, (1,), generator=gen).item())


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, generators: dict[int, torch.Generator],
                thresholds: torch.Tensor | None = None) -> torch.Tensor:
    """``Platform.make_fused_sampler``'s contract: one token per row (see :func:`fused_sample`); the rows in
    ``generators`` (seeded requests) draw from keys of their own seed and draw count, advancing the generator,
    the others from a key base drawn from torch's default CPU generator."""
    base, keys = unseeded_base(), None
    if generators:
        seeded = {row: seeded_key(gen.initial_seed(), draw_index(gen)) for row, gen in generators.items()}
        keys = row_keys(base, logits.shape[0], seeded).to(logits.device, non_blocking=True)
    return fused_sample(logits, temperature, keys, base, thresholds)
