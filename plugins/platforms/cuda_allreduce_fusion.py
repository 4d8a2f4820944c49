"""The all-reduce of a row-parallel layer fused into the residual-add RMSNorm that consumes it (decode steps).

Why: a Llama decode step with tensor parallelism runs, twice per layer, ``o_proj``/``down_proj`` -> all-reduce ->
``RMSNorm(x, residual)``. At batch 1 each of those is a ~3 us kernel whose work is tiny; doing the sum, the
residual add and the norm in one kernel (vLLM and SGLang do the same with FlashInfer's fused all-reduce) saves a
launch and a round trip through memory per pair, 64 per token on Llama-3-8B.

How (on by default with the one-shot all-reduce since session 6, ``OCTAVO_TP_ALLREDUCE_FUSE_NORM=0`` turns it off;
2x H100, Llama-3-8B shape TP=2 batch 1: bitwise equal to the unfused path, graph 3.54 -> 3.42 ms with the SiLU GEMV,
docs/performance.md): inside the forward of a row-parallel layer without bias (wrapped), the one-shot all-reduce (cuda_allreduce.py) *defers* a decode-sized
message (``rows <= defer_rows``, one hidden vector per row): it remembers the tensor and returns it unreduced.
Each RMSNorm's forward is wrapped::

    norm(x, residual) with x the deferred tensor -> one kernel: push/flag/wait (the one-shot protocol, same
                                                    epochs), rank-order sum rounded to the dtype, + residual,
                                                    RMSNorm; the roundings of all-reduce then fused norm
    any other call while a tensor is deferred     -> the deferred tensor is reduced first (plain kernel), then
                                                    the norm runs as before (e.g. the first layer's norm
                                                    without a residual)

The all-reduce itself also reduces a deferred tensor before taking a new message. What no hook sees is a
deferred tensor read by something else first (a bias added after the sum, a model's own scaling): so the
fusion is installed only after one forward of the model with it equals the forward without it bit for bit on every
rank (the verdict is all-reduced, so every rank decides the same), else it stays off, logged.
"""

from __future__ import annotations

import logging
import os
import types

import torch
import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_allreduce import (
    MAX_CTAS,
    OneShotAllReduce,
    _received,
    _signal_and_wait,
    _store_to_peers,
)
from octavo.plugins.platforms.cuda_allreduce_epochs import _begin_call
from octavo.plugins.platforms.cuda_allreduce_gemv import (
    crossing_preload_for_world,
    crossing_preload_setting,
    early_poll_setting,
    gemv_push,
    plain_gemv_config,
    push_eligible,
    push_setting,
)
from octavo.plugins.platforms.cuda_allreduce_ll import (
    LL_CAP_WORDS,
    _ll_base,
    _ll_poll_at,
    _ll_receive,
    _ll_store_to_peers,
    ll_fits,
)
from octavo.plugins.platforms.cuda_fusions import norm_warps, set_small_rows_norm_warps
from octavo.plugins.platforms.cuda_pdl import launch_opts, pdl_on

logger = logging.getLogger(__name__)


@triton.jit
def _one_shot_add_rms_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps, flag_table, data_table,
                             counters, cap, ll_table, RANK: tl.constexpr, WORLD: tl.constexpr, MAXG: tl.constexpr,
                             BLOCK: tl.constexpr, PDL: tl.constexpr = False, LL: tl.constexpr = False,
                             LL_CAP: tl.constexpr = 0, PUSHED: tl.constexpr = False,
                             EARLY: tl.constexpr = False, PRE: tl.constexpr = False):
    """One CTA per row: the one-shot all-reduce of cuda_allreduce.py (same flags, epochs and buffers; or the LL
    words of cuda_allreduce_ll.py), then the residual add and RMSNorm of cuda_fusions._rms_norm_kernel with the
    same roundings. ``PUSHED`` (with LL): the GEMV that produced ``x`` sent its words (cuda_allreduce_gemv.py).
    ``EARLY`` (PUSHED, PDL, two ranks; ``OCTAVO_TP_EARLY_POLL``, cuda_allreduce_gemv.py): the peer's words are
    polled BEFORE the wait for the GEMV here (they come from the peer's GEMV, not from this rank's predecessor), so
    the crossing overlaps the local GEMV's tail and the wait's release; the call index is read from the counters
    the previous protocol call left (complete: every kernel before the predecessor has finished under PDL's rule).
    Same rank-order sum (two ranks: fp32 addition of two values commutes), so the same bits.
    ``PRE`` (``OCTAVO_TP_CROSSING_PRELOAD``): the residual row, the norm weight, the call index and (LL) this rank's
    LL region address load before the PDL wait: the weight and the address never change, the residual and the
    counters come from kernels before the predecessor (complete by PDL's rule, as for EARLY's counters; without PDL
    the predecessor is complete anyway), so the poll after the wait waits for no other load, and the residual load
    no longer follows the poll loop."""
    if PRE or EARLY:
        pre = tl.load(counters + tl.program_id(0), volatile=True) + 1  # the index _begin_call takes below
    if PRE:
        pre_cols = tl.arange(0, BLOCK)
        r = tl.load(res_ptr + tl.program_id(0) * n_cols + pre_cols, mask=pre_cols < n_cols, other=0.0)
        w = tl.load(w_ptr + pre_cols, mask=pre_cols < n_cols, other=0.0).to(tl.float32)
        if LL:
            own_ll = _ll_base(ll_table, RANK)
    if EARLY:
        peer = _ll_receive(ll_table, 1 - RANK, tl.program_id(0) * n_cols + tl.arange(0, BLOCK),
                           tl.arange(0, BLOCK) < n_cols, pre % 2, pre, x_ptr, RANK, WORLD, LL_CAP)
    row, _, epoch, parity = _begin_call(counters, MAXG, PDL)
    if PRE:  # the same index, known before the wait: the polls below need not wait for _begin_call's load
        epoch, parity = pre, pre % 2
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row * n_cols + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if LL:
        if not PUSHED:
            _ll_store_to_peers(x, offs, mask, ll_table, parity, epoch, RANK, WORLD, LL_CAP)
    else:
        _store_to_peers(x, offs, mask, x_ptr, data_table, parity, cap, RANK, WORLD)
        _signal_and_wait(flag_table, row, epoch, RANK, WORLD, MAXG)
        mine = _received(x_ptr, data_table, parity, cap, RANK, WORLD)
    elt = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(WORLD):
        if k == RANK:
            v = x
        elif EARLY:
            v = peer
        elif LL and PRE:
            v = _ll_poll_at(own_ll, k, offs, mask, parity, epoch, x_ptr, WORLD, LL_CAP)
        elif LL:
            v = _ll_receive(ll_table, k, offs, mask, parity, epoch, x_ptr, RANK, WORLD, LL_CAP)
        else:
            v = tl.load(mine + k * cap + offs, mask=mask, other=0.0, cache_modifier=".cg")
        acc += v.to(tl.float32)
    s = acc.to(elt)  # the all-reduce's output, rounded as the unfused kernel stores it
    if not PRE:
        r = tl.load(res_ptr + offs, mask=mask, other=0.0)
    h = (s.to(tl.float32) + r.to(tl.float32)).to(elt)  # torch rounds the sum to the dtype
    tl.store(res_out_ptr + offs, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(hf * hf, 0) / n_cols + eps)
    y = (hf * rstd).to(elt).to(tl.float32)
    if not PRE:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def all_reduce_add_rms_norm(ar: OneShotAllReduce, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float, pushed: bool = False):
    """``(norm(sum_ranks(x) + residual) * weight, sum_ranks(x) + residual)`` in one kernel (``x`` [rows, d]);
    ``pushed``: ``x``'s words were sent by its GEMV (cuda_allreduce_gemv.py; one 16-bit row)."""
    rows, d = x.shape
    out = torch.empty((rows, d), dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x)
    r2 = residual.reshape(rows, d).contiguous()
    block = 1 << max(0, d - 1).bit_length()
    ll = pushed or (bool(getattr(ar, "ll", False)) and ll_fits(x))
    opts = launch_opts()
    early = pushed and ar.world == 2 and opts["PDL"] and getattr(ar, "early_poll", False)  # OCTAVO_TP_EARLY_POLL
    _one_shot_add_rms_kernel[(rows,)](x, r2, weight, out, res_out, d, eps, ar.flag_table, ar.data_table,
                                      ar.counters, ar.max_bytes // x.element_size(),
                                      ar.ll_table if ll else ar.flag_table, RANK=ar.rank, WORLD=ar.world,
                                      MAXG=MAX_CTAS, BLOCK=block, LL=ll, LL_CAP=LL_CAP_WORDS if ll else 0,
                                      PUSHED=pushed, EARLY=early, PRE=getattr(ar, "crossing_preload", False),
                                      num_warps=getattr(ar, "norm_warps", 0) or norm_warps(rows, d), **opts)
    ar.num_calls += 1
    return out.view(residual.shape), res_out.view(residual.shape)


def _wrap_norm(module, ar: OneShotAllReduce) -> None:
    inner = module.forward  # the fused Triton norm if cuda_fusions installed it, else the eager one

    def forward(self, x, residual=None):
        pending = ar.pending
        if pending is not None:
            if x is pending and residual is not None and x.dim() == 2:
                pushed, ar.pending, ar.pending_pushed = ar.pending_pushed, None, False
                return all_reduce_add_rms_norm(ar, x, residual, self.weight, self.eps, pushed)
            ar.flush()
        return inner(x, residual) if residual is not None else inner(x)

    module.forward = types.MethodType(forward, module)


def _wrap_row_parallel(module, ar: OneShotAllReduce) -> None:
    """Deferral is allowed only inside this layer's own forward: the all-reduce it makes of its partial products.
    A forward hook (LoRA adds its delta there, with an all-reduce of its own) runs after, and flushes first.
    With ``ar.push`` (cuda_allreduce_gemv.py) an eligible layer's one-row input takes the GEMV that sends its
    output to the peers itself; that output is the pending message, marked pushed."""
    inner = module.forward
    eligible = push_eligible(module, ar.defer_width)

    def forward(self, *args, **kwargs):
        x = args[0] if len(args) == 1 and not kwargs else None
        if ar.push and eligible and ar.defer_rows and x is not None and x.dim() == 2 and x.shape[0] == 1:
            if ar.pending is not None:  # an older deferred message goes first (it holds the earlier call index)
                ar.flush()
            y = gemv_push(ar, x, self.weight)
            if y is not None:
                ar.pending, ar.pending_pushed = y, True
                return y
        ar.allow_defer = True
        try:
            return inner(*args, **kwargs)
        finally:
            ar.allow_defer = False

    module.forward = types.MethodType(forward, module)


def maybe_fuse_all_reduce_norm(handle, runner_cls) -> dict | None:
    """Wrap ``handle.model``'s RMSNorms and row-parallel layers and turn deferral on, if the one-shot all-reduce is
    installed, ``OCTAVO_TP_ALLREDUCE_FUSE_NORM=1`` and a checking forward agrees (to rounding) on every rank (a
    warning says so when it does not); else ``None``."""
    from octavo.nn import parallel
    from octavo.nn.layernorm import RMSNorm

    ar = parallel._ALL_REDUCE
    env = os.environ.get("OCTAVO_TP_ALLREDUCE_FUSE_NORM", "").strip()
    if env not in ("", "0", "1"):
        raise ValueError(f"OCTAVO_TP_ALLREDUCE_FUSE_NORM={env!r}: use 1 (on) or 0 (off)")
    push_on, push_explicit = push_setting()
    for name, (on, explicit) in (("OCTAVO_TP_GEMV_PUSH", (push_on, push_explicit)),
                                 ("OCTAVO_TP_EARLY_POLL", early_poll_setting()),
                                 ("OCTAVO_TP_CROSSING_PRELOAD", crossing_preload_setting())):
        if on and explicit and (env == "0" or not isinstance(ar, OneShotAllReduce)):
            raise ValueError(f"{name}=1 needs the all-reduce + RMSNorm fusion (tensor parallelism on CUDA with the "
                             "one-shot all-reduce, OCTAVO_TP_ALLREDUCE_FUSE_NORM not 0); unset one of them")
    if env == "0":  # default on since session 6 (2x H100: bitwise equal, 64 kernels fewer per token)
        return None
    if not isinstance(ar, OneShotAllReduce):
        if env == "1":
            raise ValueError("OCTAVO_TP_ALLREDUCE_FUSE_NORM=1 needs the one-shot all-reduce (OCTAVO_TP_ALLREDUCE="
                             "custom, tensor parallelism on CUDA); unset one of them")
        return None  # NCCL (or symm_mem) all-reduce: nothing to fuse into
    from octavo.plugins.quant.fp8 import _FP8Method

    norms = [m for m in handle.model.modules() if type(m) is RMSNorm]
    hidden = {m.weight.shape[0] for m in norms}
    off = ("fp8 linears take their quantized input from the norms"
           if any(isinstance(getattr(m, "quant_method", None), _FP8Method) for m in handle.model.modules())
           else f"norms of several widths {sorted(hidden)}" if len(hidden) != 1 else None)
    if off is not None:
        if ar.push and push_explicit:  # OCTAVO_TP_GEMV_PUSH=1 asked for what this model cannot have: refused
            raise ValueError(f"OCTAVO_TP_GEMV_PUSH=1 needs the all-reduce + RMSNorm fusion, off for this model: {off}")
        if crossing_preload_setting()[1] and crossing_preload_setting()[0]:
            raise ValueError(f"OCTAVO_TP_CROSSING_PRELOAD=1 needs the all-reduce + RMSNorm fusion, off for this model: {off}")
        logger.info("all-reduce + RMSNorm fusion off: %s", off)
        ar.push = False
        return None
    from octavo.nn.linear import RowParallelLinear

    rows_layers = [m for m in handle.model.modules() if isinstance(m, RowParallelLinear) and m.bias is None
                   and m.reduce_results]  # a bias is added after the sum: that layer keeps its plain all-reduce
    ar.defer_width = next(iter(hidden))  # before wrapping (the GEMV push's eligibility) and the check
    ar.crossing_preload = crossing_preload_for_world(ar.world)  # the kernels' PRE: in every checking forward below
    warps = tp_small_rows_norm_warps(ar.world)  # before the checks too: they compare the fused and plain norms
    if warps:
        set_small_rows_norm_warps(warps)
    for m in norms:
        _wrap_norm(m, ar)
    for m in rows_layers:
        _wrap_row_parallel(m, ar)
    rows = min(MAX_CTAS, ar.max_bytes // (next(iter(hidden)) * handle.dtype.itemsize), handle.max_num_seqs)
    push, ar.push = ar.push, False  # deferral is checked alone first, then with the pushing GEMV (its own verdict)
    ar.defer_rows = rows if _agreed(ar, _check_forward(handle, ar, rows, runner_cls), handle.device) else 0
    if warps and not ar.defer_rows:  # no fusion: the plain norms keep the rule (16 warps was measured with it)
        set_small_rows_norm_warps(0)
    (logger.info if ar.defer_rows else logger.warning)("all-reduce + RMSNorm fusion %s (%d row-parallel layers, %d norms wrapped, decode batches up to "
                "%d rows)", "on" if ar.defer_rows else "OFF: the checking forward disagreed", len(rows_layers),
                len(norms), rows)
    eligible = [m for m in rows_layers if push_eligible(m, ar.defer_width)]
    if push and ar.defer_rows and not eligible:  # e.g. fp32 weights: nothing to push (the default stays quiet)
        if push_explicit:
            raise ValueError("OCTAVO_TP_GEMV_PUSH=1: no row-parallel layer of this model can push (it needs dense "
                             "16-bit weights on the Triton GEMV, no bias); unset it")
        logger.info("row-parallel GEMV push off: no eligible layer (16-bit dense GEMV weights, no bias)")
    elif push and ar.defer_rows:  # OCTAVO_TP_GEMV_PUSH (cuda_allreduce_gemv.py; default on)
        ar.early_poll = early_poll_setting()[0]  # checked with the push (same forward, bitwise)
        ar.push, before = True, getattr(ar, "num_pushed", 0)
        same = _check_forward(handle, ar, rows, runner_cls)
        ran = getattr(ar, "num_pushed", 0) > before  # the check must have taken the pushing GEMV (tuned shapes)
        # every eligible layer's shape tuned on this rank (it was in the check): all ranks then always push the
        # same layers (a rank pushing while its peer runs the flag protocol would wait forever)
        ready = all(plain_gemv_config(*m.weight.shape, m.weight.dtype, m.weight.device) is not None for m in eligible)
        ar.push = _agreed(ar, same and ran and ready, handle.device)
        ar.defer_rows = rows
        (logger.info if ar.push else logger.warning)(
            "row-parallel GEMV push (OCTAVO_TP_GEMV_PUSH): %s", "on" if ar.push else
            "OFF: the checking forward " + ("disagreed" if ran else "never took it (no tuned GEMV shape)"))
    elif push:  # the fusion's own check disagreed (warned above): nothing to push into
        logger.warning("row-parallel GEMV push off: the all-reduce + RMSNorm fusion it needs is off")
    early, early_explicit = early_poll_setting()
    if early and early_explicit and not (ar.push and ar.world == 2 and pdl_on()):
        raise ValueError("OCTAVO_TP_EARLY_POLL=1 needs the row-parallel GEMV push at two ranks with PDL on (it polls "
                         "pushed words before the PDL wait); unset it")
    return {"row_parallel": len(rows_layers), "norms": len(norms), "rows": ar.defer_rows, "push": ar.push,
            "early_poll": bool(ar.push and getattr(ar, "early_poll", False)),
            "crossing_preload": bool(ar.defer_rows and ar.crossing_preload),
            "small_rows_norm_warps": norm_warps(1, next(iter(hidden)))}


# the <= 4-row RMSNorms (plain and fused: the same layout, so still bitwise) of a two-rank model with the fusion, unless
# OCTAVO_NORM_SMALL_ROWS_WARPS is set: 16 warps instead of 4 since session 12 batch 1 (2x H100, 8B TP=2 bs1, one engine,
# alternating, same tokens): graph 3.061 / 3.065 -> 3.029 / 3.031 ms alone, 3.017 / 3.015 -> 2.980 / 2.981 with the
# preload (8 warps: 2.981); the 2-GPU test and the start check bitwise with it. TP=1 keeps the rule (not measured).
TP2_SMALL_ROWS_NORM_WARPS = 16


def tp_small_rows_norm_warps(world: int) -> int:
    """The small-rows RMSNorm warps the fusion sets for ``world`` ranks (cuda_fusions.set_small_rows_norm_warps), 0 =
    leave the rule or what ``OCTAVO_NORM_SMALL_ROWS_WARPS`` chose (any value there, 0 included, wins)."""
    return TP2_SMALL_ROWS_NORM_WARPS if world == 2 and not os.environ.get("OCTAVO_NORM_SMALL_ROWS_WARPS", "").strip() \
        else 0


def _agreed(ar: OneShotAllReduce, ok: bool, device) -> bool:
    """Every rank's verdict (the minimum), so every rank decides the same."""
    flag = torch.tensor([1 if ok else 0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN, group=ar.group)
    return flag.item() == 1


@torch.inference_mode()
def _check_forward(handle, ar: OneShotAllReduce, rows: int, runner_cls) -> bool:
    """One single-row decode forward (null-block slot) without, then with deferral. One row: several rows would
    all write their K/V to slot 0 of the null block and read one another's (session 5, batch 2: a 1.15 relative
    difference between two identical forwards of 4 rows, which kept the fusion off)."""
    size = 1  # runner_cls: cuda_graphs' CUDAGraphRunner, passed in by its caller (importing it here is a cycle)
    tmp = runner_cls(handle.model, handle.attn_backend, handle.device, handle.block_size,
                          handle.max_model_len, [size])  # only its static inputs and layout; nothing captured
    tmp.input_ids[:size].copy_(torch.arange(1, size + 1, device=handle.device) * 7)
    tmp.positions[:size].zero_()
    from octavo.model import ForwardContext

    layout = tmp._layout(size)
    ctx = ForwardContext(attn_metadata=handle.attn_backend.build_metadata(layout, handle.device),
                         query_start_loc=layout.query_start_loc)
    ids, pos = tmp.input_ids[:size], tmp.positions[:size]
    try:
        ar.defer_rows = 0
        want = handle.model(ids, pos, ctx).clone()
        ar.defer_rows = rows
        got = handle.model(ids, pos, ctx).clone()
        ar.flush()
        torch.cuda.synchronize(handle.device)
        # Bitwise: the fused kernel rounds where the all-reduce + cuda_fusions' norm round and reduces its sum of
        # squares over the same layout (2x H100, session 6: bitwise equal). A deferred sum read before it was
        # reduced (what this check is for) is off by the other ranks' share: tens of percent.
        err = ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()
        same = torch.equal(got, want)
        logger.info("all-reduce + RMSNorm fusion check: %s (relative difference %.2e)",
                    "bitwise equal" if same else "NOT bitwise equal", err)
        return same
    except Exception as e:  # noqa: BLE001 - the fusion stays off
        logger.warning("all-reduce + RMSNorm fusion check failed: %s: %s", type(e).__name__, e)
        ar.pending = None
        return False
    finally:
        ar.defer_rows = 0
