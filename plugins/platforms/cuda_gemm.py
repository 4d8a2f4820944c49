"""A Triton GEMM for the projections of a decode step at tens to hundreds of rows (issue 17).

Why: at 64-256 rows cuBLAS runs the Qwen3-0.6B projections at 6-8 us whatever their size (0.22-0.54 of the byte
roofline: a 2-4 MB weight read by a few dozen CTAs, each walking the whole K) and the Llama-3-8B ones at 0.62-0.79
(docs/performance.md "where the time goes, warmed"). Here a launch picks its tile and a K split per weight shape
and row range from a measured table (:data:`TABLE`), and takes part in programmatic dependent launch
(``cuda_pdl``): cuBLAS kernels do not, so each of them pays the ~1 us launch gap before and after it.

``y[M, N] = x[M, K] @ w[N, K]^T`` (``F.linear`` without bias), fp32 accumulation, one rounding to the output
dtype. With ``split_k`` > 1 the K range is cut into equal parts, each CTA writes an fp32 partial, and a second
kernel sums the parts in a fixed order (deterministic: no atomics), then rounds once. The result differs from
cuBLAS's only by fp32 summation order (checked against float64 in tests/kernels/cuda_gemm_cases.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait


@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["M"])
def _gemm_kernel(x_ptr, w_ptr, out_ptr, part_ptr, M, N, k_per, stride_xm, stride_wn, stride_om,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                 EVEN_N: tl.constexpr, PDL: tl.constexpr = False):
    """One CTA: rows [pid_m*BM, +BM) x columns [pid_n*BN, +BN) over K range [pid_k*k_per, +k_per) (k_per a
    run-time value: one build serves every K of a launch config). The grid runs the row tiles of one column tile
    next to each other (axis 0), so they share its weight tiles in L2. The first K tile is peeled: its weight
    tile loads before ``gdc_wait`` (weights are never written by a predecessor; cuda_pdl.py), x only after."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    k0 = pid_k * k_per
    xp = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + (k0 + rk)[None, :]
    wp = w_ptr + rn.to(tl.int64)[:, None] * stride_wn + (k0 + rk)[None, :]
    if EVEN_N:
        b = tl.load(wp)
    else:
        b = tl.load(wp, mask=n_ok[:, None], other=0.0)
    if PDL:  # x is the predecessor's output: nothing of it is read before the predecessor finished
        gdc_wait()
        gdc_launch_dependents()
    a = tl.load(xp, mask=m_ok[:, None], other=0.0)
    acc = tl.dot(a, tl.trans(b), tl.zeros([BM, BN], dtype=tl.float32))
    xp += BK
    wp += BK
    for _ in range(BK, k_per, BK):  # k_per is a multiple of BK (checked by the launcher)
        a = tl.load(xp, mask=m_ok[:, None], other=0.0)
        if EVEN_N:
            b = tl.load(wp)
        else:
            b = tl.load(wp, mask=n_ok[:, None], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        xp += BK
        wp += BK
    if SPLIT_K == 1:
        op = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
        tl.store(op, acc.to(a.dtype).to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    else:  # partial [SPLIT_K, M, N] fp32, summed by _splitk_sum_kernel
        pp = part_ptr + (pid_k * M + rm).to(tl.int64)[:, None] * N + rn[None, :]
        tl.store(pp, acc, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["M"])
def _gemm_tma_kernel(x_desc, w_desc, out_ptr, part_ptr, M, N, k_per, stride_om,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
                     PDL: tl.constexpr = False):
    """``_gemm_kernel`` with the x / weight tiles loaded by TMA (host tensor descriptors; rows past M and
    columns past N read as zeros); the first weight tile loads before ``gdc_wait`` as there."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    k0 = pid_k * k_per
    b = w_desc.load([pid_n * BN, k0])
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    a = x_desc.load([pid_m * BM, k0])
    acc = tl.dot(a, b.T, tl.zeros([BM, BN], dtype=tl.float32))
    for kk in range(BK, k_per, BK):
        a = x_desc.load([pid_m * BM, k0 + kk])
        b = w_desc.load([pid_n * BN, k0 + kk])
        acc = tl.dot(a, b.T, acc)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :],
                 acc.to(a.dtype).to(out_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(part_ptr + (pid_k * M + rm).to(tl.int64)[:, None] * N + rn[None, :], acc, mask=ok)


@triton.jit(do_not_specialize=["M"], do_not_specialize_on_alignment=["M"])
def _splitk_sum_kernel(part_ptr, out_ptr, M, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                       ROUND: tl.constexpr = 0, PDL: tl.constexpr = False):
    """out[m, n] = round(sum_s part[s, m, n]), s in order (the same bits on every run); ``ROUND`` 1 / 2: rounded
    to bf16 / fp16 first (an fp32 output holding the input dtype's values)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + (s * M + m).to(tl.int64) * N + cols, mask=ok, other=0.0)
    if ROUND == 1:
        acc = acc.to(tl.bfloat16).to(tl.float32)
    elif ROUND == 2:
        acc = acc.to(tl.float16).to(tl.float32)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class GemmConfig:
    bm: int = 64
    bn: int = 64
    bk: int = 128
    split_k: int = 1
    warps: int = 4
    stages: int = 4
    tma: bool = False  # tiles through TMA (host tensor descriptors) instead of pointer loads

    def fits(self, K: int) -> bool:
        """The K range divides into ``split_k`` parts of whole ``bk`` tiles (the kernel has no K mask)."""
        return K % (self.split_k * self.bk) == 0

    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_s{self.split_k}_w{self.warps}_st{self.stages}" + "_tma" * self.tma


def gemm(x, weight, cfg: GemmConfig, pdl: dict | None = None, out=None, out_dtype=None):
    """``x [M, K] @ weight [N, K]^T`` with the launch ``cfg`` (contiguous rows of both; ``cfg.fits(K)``).
    ``pdl``: ``cuda_pdl.launch_opts()`` for both launches (None: plain launches). ``out_dtype`` float32: the
    result rounded to x's dtype, stored as float32 (``F.linear(x, w).float()`` in one pass: the LM head's
    logits without the copy kernel)."""
    import torch

    M, K = x.shape
    N = weight.shape[0]
    if weight.shape[1] != K or x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError(f"gemm: x {tuple(x.shape)} / weight {tuple(weight.shape)} must share K with unit "
                         "column strides")
    if not cfg.fits(K):
        raise ValueError(f"gemm: K={K} is not a multiple of split_k x bk ({cfg.split_k} x {cfg.bk})")
    if out is None:
        out = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    if M == 0:
        return out
    opts = pdl or {}
    part = out
    if cfg.split_k > 1:
        part = torch.empty(cfg.split_k, M, N, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, cfg.bm), triton.cdiv(N, cfg.bn), cfg.split_k)
    if cfg.tma and x.data_ptr() % 16 == 0 and x.stride(0) % 8 == 0 and weight.data_ptr() % 16 == 0 \
            and weight.stride(0) % 8 == 0:  # TMA wants 16-byte aligned bases and row strides (else: pointer loads)
        from triton.tools.tensor_descriptor import TensorDescriptor

        _gemm_tma_kernel[grid](TensorDescriptor.from_tensor(x, [cfg.bm, cfg.bk]),
                               TensorDescriptor.from_tensor(weight, [cfg.bn, cfg.bk]), out, part, M, N,
                               K // cfg.split_k, out.stride(0), BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
                               SPLIT_K=cfg.split_k, num_warps=cfg.warps, num_stages=cfg.stages, **opts)
    else:
        _gemm_kernel[grid](x, weight, out, part, M, N, K // cfg.split_k, x.stride(0), weight.stride(0),
                           out.stride(0), BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, SPLIT_K=cfg.split_k,
                           EVEN_N=N % cfg.bn == 0, num_warps=cfg.warps, num_stages=cfg.stages, **opts)
    if cfg.split_k > 1:
        block = 1024 if N >= 1024 else triton.next_power_of_2(N)
        rnd = 0 if out.dtype == x.dtype else {torch.bfloat16: 1, torch.float16: 2}.get(x.dtype, 0)
        _splitk_sum_kernel[(M, triton.cdiv(N, block))](part, out, M, N, out.stride(0), SPLIT_K=cfg.split_k,
                                                        BLOCK=block, ROUND=rnd, num_warps=4, **opts)
    return out


#: (N, K) of the weight -> [(most rows, config or None)], ascending: a launch with M rows takes the first entry
#: whose bound is >= M (None there: cuBLAS); shapes or row counts not listed stay on cuBLAS. Filled from
#: measurements on H100 (benchmarks/gemm_triton_bench.py, benchmarks/gemm_table_from_bench.py;
#: docs/performance.md); empty = cuBLAS everywhere.
#: Session 8 batch 1 (H100 80GB HBM3, benchmarks/results/gemm_triton_s8b1_h100.json: chains of launches over
#: weight copies beyond L2, PDL on, CUDA-graph medians; us Triton / cuBLAS): only the Qwen3-0.6B projections where
#: a launch beat cuBLAS by >= 4 % (the K-split ones: o_proj and down_proj have N = 1024, too few CTAs for the
#: whole K); Llama-3-8B's projections stay on cuBLAS (0.66-1.00x at 128-256 rows). Row counts between two measured
#: ones take the upper one's launch.
TABLE: dict[tuple[int, int], list[tuple[int, GemmConfig | None]]] = {
    (4096, 1024): [(32, GemmConfig(64, 64, 128, 1, 4, 4))],  # qkv: 32 rows 5.59 / 5.91; 64-256: 0.86-1.03x
    (1024, 2048): [(32, GemmConfig(64, 64, 64, 8, 4, 4)), (128, None),  # o_proj: 32 rows 5.60 / 5.87
                   (206, GemmConfig(64, 64, 128, 2, 4, 4)), (256, None)],  # 206 rows 6.91 / 7.48; 256: 0.93x
    (6144, 1024): [(64, GemmConfig(64, 64, 128, 1, 4, 4))],  # gate_up: 32 / 64 rows 6.58 / 7.29, 6.72 / 7.38
    (1024, 3072): [(64, GemmConfig(64, 64, 64, 8, 4, 4)),  # down_proj: 64 rows 6.57 / 8.18 (32: 6.38 / 8.02)
                   (128, GemmConfig(64, 64, 128, 4, 4, 4)),  # 7.04 / 7.59
                   (206, GemmConfig(64, 64, 128, 2, 4, 4)),  # 8.24 / 9.54
                   (256, GemmConfig(64, 64, 64, 4, 4, 5, True))],  # 8.34 / 8.73
}
#: LM heads (:class:`LogitsMethod`: float32 logits in one pass), same batch, vs cuBLAS + the ``.float()`` copy
LOGITS_TABLE: dict[tuple[int, int], list[tuple[int, GemmConfig | None]]] = {
    (151936, 1024): [(64, GemmConfig(64, 64, 64, 1, 4, 5, True)),  # Qwen3: 32 / 64 rows 119 / 139, 124 / 158 us
                     (256, GemmConfig(128, 256, 64, 1, 8, 3, True))],  # 128 / 206 / 256: 156 / 193, 196 / 241, 210 / 271
}
#: (N, K) -> [(most rows, library or None)], ascending as :data:`TABLE`: for a launch that table leaves to cuBLAS, the
#: BLAS library torch runs it through ("cublaslt": cuBLASLt's heuristic kernel; None or not listed: torch's default,
#: cuBLAS). Why: at 96-256 rows the two libraries pick different tiles / K splits per row count, and for some
#: shapes and counts cuBLASLt's is measurably faster (benchmarks/gemm_rows_bench.py --chain; docs/performance.md
#: "8B 512 x 1000/1000, session 9"). Bounds are graph batch sizes (multiples of 8), so an entry covers one size.
#: Session 9 batch 1 (an H200, gemm_rows_bench.py --chain, us cuBLAS / cuBLASLt): Llama-3-8B o_proj 96 rows 15.65 /
#: 12.49 and down_proj 38.05 / 33.01, the 512 x 1000/1000 run's tail wave (graph sizes 88 and 96) of that time.
BLAS_TABLE: dict[tuple[int, int], list[tuple[int, str | None]]] = {
    (4096, 4096): [(80, None), (96, "cublaslt")],  # o_proj
    (4096, 14336): [(80, None), (96, "cublaslt")],  # down_proj
}
#: fewest rows taken here (below: the batch-1 GEMV or cuBLAS; 2-16 rows were not measured)
MIN_ROWS = 17
_STATE: dict = {"on": None, "checked": {}}  # on: None = OCTAVO_TRITON_GEMM, read on first use
_INTERPRET_TABLE = False  # tests set it to route the interpreter through the table


def set_triton_gemm(on: bool) -> None:
    """Use the table's launches in forwards (and graph captures) from now on, or cuBLAS (A/B runs)."""
    _STATE["on"] = bool(on)


def active() -> bool:
    """``OCTAVO_TRITON_GEMM``: 1/unset = the table's launches, 0 = cuBLAS for every multi-row linear."""
    if _STATE["on"] is None:
        from octavo.env_flags import env_switch

        _STATE["on"] = env_switch("OCTAVO_TRITON_GEMM", True)
    return _STATE["on"]


def lookup(M: int, N: int, K: int, table: dict | None = None) -> GemmConfig | None:
    """The table's launch for ``M`` rows of an ``[N, K]`` weight, or None (cuBLAS); ``table``: :data:`TABLE`."""
    if M < MIN_ROWS or os.environ.get("TRITON_INTERPRET") == "1" and not _INTERPRET_TABLE:
        return None
    for most, cfg in (TABLE if table is None else table).get((N, K), ()):
        if M <= most:
            return cfg if cfg is not None and cfg.fits(K) else None
    return None


def blas_library(M: int, N: int, K: int) -> str | None:
    """:data:`BLAS_TABLE`'s library for ``M`` rows of an ``[N, K]`` weight ("cublaslt"), or None (cuBLAS)."""
    if M < MIN_ROWS:
        return None
    for most, lib in BLAS_TABLE.get((N, K), ()):
        if M <= most:
            return lib
    return None


def linear_cublaslt(x, weight):
    """``F.linear(x, weight)`` through cuBLASLt (torch's preferred BLAS library for this call only)."""
    import torch
    import torch.nn.functional as F

    cuda = torch.backends.cuda
    prev = cuda.preferred_blas_library()
    cuda.preferred_blas_library("cublaslt")
    try:
        return F.linear(x, weight)
    finally:
        cuda.preferred_blas_library(prev)


def first_use_ok(checked: dict, key, run, reference, what: str, holds=None, rows_ref=None) -> bool:
    """Whether the launch ``key`` may run: on its first use (outside a graph capture) ``run()`` is compared with
    ``reference()`` on the real input and kept only within two bf16 rounding steps of the output's largest value
    (``holds``: a dtype whose values the output must hold exactly); a launch that raises or disagrees is dropped
    for good with a warning. Inside a capture an unchecked launch is not used (the caller's fallback is).
    ``rows_ref(lo, hi)``: the reference of rows ``[lo, hi)``; an output of > 1,024 rows is then compared 256 rows at
    a time (no full-size copies: a prefill chunk's first use is the profile run whose peak sizes the KV cache)."""
    import torch

    ok = checked.get(key)
    if ok is not None:
        return ok
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    try:
        got = run()
        if holds is not None and not torch.equal(got, got.to(holds).to(got.dtype)):
            raise RuntimeError(f"output does not hold {holds} values")
        if rows_ref is not None and got.dim() == 2 and got.shape[0] > 1024:
            diff = top = 0.0
            for lo in range(0, got.shape[0], 256):
                want = rows_ref(lo, min(lo + 256, got.shape[0])).float()
                diff = max(diff, float((got[lo:lo + 256].float() - want).abs().max()))
                top = max(top, float(want.abs().max()))
            err = diff / max(top, 1e-30)
        else:
            got, want = got.float(), reference().float()
            err = float((got - want).abs().max()) / max(float(want.abs().max()), 1e-30)
    except Exception as e:  # noqa: BLE001 - a launch this card or Triton cannot run: the fallback
        err = repr(e)[:200]
    ok = checked[key] = isinstance(err, float) and err <= 1.6e-2
    if not ok:
        import logging

        logging.getLogger(__name__).warning("%s not used: %s off the reference", what, err)
    return ok


def linear(x, weight, out_dtype=None):
    """``F.linear(x, weight)`` through the table's launch for this shape and row count (else a cuBLASLt candidate of
    ``cuda_gemm_lt.LT_TABLE``, else cuBLASLt where :data:`BLAS_TABLE` says so), or None (the caller runs cuBLAS):
    off, not listed, strided inputs, or the launch failed its first-use check (:func:`first_use_ok`, outside a
    graph capture: the graph runner runs each size eagerly first)."""
    import torch

    if (not active() or x.dim() != 2 or x.stride(1) != 1 or weight.stride(1) != 1 or x.dtype != weight.dtype
            or x.dtype not in (torch.bfloat16, torch.float16)  # (float32 dots would run as tf32)
            or x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1"):
        return None
    N, K = weight.shape
    cfg = lookup(x.shape[0], N, K, LOGITS_TABLE if out_dtype is not None else TABLE)
    if cfg is None:
        if out_dtype is None and x.device.type == "cuda":
            import torch.nn.functional as F

            from octavo.plugins.platforms import cuda_gemm_lt as lt

            pick = lt.pick(x.shape[0], N, K)
            algo = lt.usable(x, weight, pick) if pick is not None else None
            key = (N, K, "lt", lt.config_key(pick), x.dtype) if algo is not None else None
            if algo is not None and first_use_ok(
                    _STATE["checked"], key, lambda: lt.linear(x, weight, algo), lambda: F.linear(x, weight),
                    f"cuBLASLt candidate {pick} for [{N}, {K}] weights", rows_ref=lambda a, b: F.linear(x[a:b], weight)):
                try:  # (checked once per candidate: the same kernel at another row count of its table entry)
                    return lt.linear(x, weight, algo)
                except RuntimeError as e:  # a status the check did not meet: cuBLAS from now on, said once
                    _STATE["checked"][key] = False
                    import logging

                    logging.getLogger(__name__).warning("cuBLASLt candidate %s for [%d, %d] weights not used: %s",
                                                        pick, N, K, e)
        if out_dtype is None and x.device.type == "cuda" and blas_library(x.shape[0], N, K) == "cublaslt":
            import torch.nn.functional as F

            if first_use_ok(_STATE["checked"], (N, K, "cublaslt", x.dtype), lambda: linear_cublaslt(x, weight),
                            lambda: F.linear(x, weight), f"cuBLASLt for [{N}, {K}] weights"):
                return linear_cublaslt(x, weight)
        return None
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    def run():
        return gemm(x, weight, cfg, launch_opts(), out_dtype=out_dtype)

    def reference():
        import torch.nn.functional as F

        return F.linear(x, weight)

    if not first_use_ok(_STATE["checked"], (N, K, cfg, x.dtype, out_dtype), run, reference,
                        f"Triton GEMM {cfg.name()} for [{N}, {K}] weights", x.dtype if out_dtype else None):
        return None
    return gemm(x, weight, cfg, launch_opts(), out_dtype=out_dtype)


class LogitsMethod:
    """The LM head's ``logits_method`` (``ParallelLMHead.compute_logits``) on one rank: the table's launch writes
    float32 logits holding the 16-bit values, so ``compute_logits``' ``.float()`` is a no-op instead of a copy
    kernel over ``rows x vocab``; anything the table does not cover (or a bias) runs ``F.linear`` as before."""

    def apply(self, layer, x, bias=None):
        if bias is None and x.dim() == 2:
            import torch

            y = linear(x, layer.weight, out_dtype=torch.float32)
            if y is not None:
                return y
        import torch.nn.functional as F

        return F.linear(x, layer.weight, bias)

    def process_weights_after_loading(self, layer) -> None:
        pass


def install_logits(model) -> dict[str, int]:
    """Give each single-rank, dense, bias-free ``ParallelLMHead`` of ``model`` whose weight shape
    :data:`LOGITS_TABLE` lists a :class:`LogitsMethod`; returns ``{"LMHead(gemm)": count}``."""
    from octavo.nn.embedding import ParallelLMHead

    n = 0
    for m in model.modules():
        if (isinstance(m, ParallelLMHead) and m.logits_method is None and m.tp_size == 1 and m.bias is None
                and tuple(m.weight.shape) in LOGITS_TABLE):
            m.logits_method = LogitsMethod()
            n += 1
    return {"LMHead(gemm)": n} if n else {}
