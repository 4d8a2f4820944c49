"""Batch-1 MoE layers: the post-attention RMSNorm (with its residual add) and the router GEMV in ONE launch.

Why: at batch 1 each MoE decoder layer runs, after attention, an RMSNorm kernel, then the router GEMV (a
``[H] x [E, H]`` product: 0.5 MB for Qwen3-30B-A3B, far below a launch's cost), then the two expert launches
(``moe_decode_kernels``). Here the router rows are split over ``cdiv(E, ROWS)`` programs, and each program
recomputes the RMSNorm of the one token itself: it reads the 2 x H input values (a few KB, from L2), so no
program waits for another. With PDL on, the router rows load before the producer of the row has finished. Program 0 also writes the normalised row and the new residual, exactly as the fused
RMSNorm kernel of ``cuda_fusions`` computes them (same full-row sum of squares, same roundings), and every
program forms its chunk of the normalised row with the same arithmetic, so the router sees the values the
experts get.

Installed by :func:`install_norm_router` on decoder layers whose forward is Llama's (norm, then ``mlp``), whose
``mlp`` is a Qwen3-MoE / Mixtral sparse block (``experts(x, gate(x))``) with the batch-1 expert path on, whose
norm runs ``cuda_fusions``' kernel and whose router is a plain unquantized linear without bias, at tensor
parallel size 1. The norm's forward, for one token with a residual, runs this kernel and hands the logits to
the block's forward, which uses them only for that very tensor (identity check), else computes the router as
usual. Checked once per shape against the unfused pair. On by default since session 8 (``OCTAVO_MOE_NORM_ROUTER=0``
off): the H100 A/B of session 8 batch 1 had Qwen3-30B-A3B's batch-1 forward 2.5% faster with it (2.952 vs 3.029 ms,
same engine, same output bits); session 6 had measured it 1% slower (3.199 vs 3.167 ms) on that session's kernels.
"""

from __future__ import annotations

import logging
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.platforms.cuda_moe_route import _route_values
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

logger = logging.getLogger(__name__)

SPARSE_BLOCKS = ("Qwen3MoeSparseBlock", "MixtralSparseMoeBlock")  # forward = experts(x, gate(x)), nothing more
DEFAULT_ON = True  # session 8 batch 1 (H100): Qwen3-30B-A3B forward 2.952 vs 3.029 ms apart (docs/moe.md)
ROUTE_ONCE_DEFAULT = False  # session 11: the top-k in the last program (OCTAVO_MOE_ROUTE_ONCE=1), A/B pending


@triton.jit
def _norm_router_kernel(x_ptr, res_ptr, w_ptr, gate_ptr, out_ptr, res_out_ptr, logits_ptr, H, E, eps, stride_g,
                        weights_ptr, ids_ptr, count_ptr,
                        BLOCK_H: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False, TOPK: tl.constexpr = 0,
                        K_P: tl.constexpr = 1, E_P: tl.constexpr = 1, RENORMALIZE: tl.constexpr = False):
    """All loads (the row, the residual, the norm weight, this program's ``ROWS`` router rows) are issued at once:
    a loop over H chunks re-reading the row (session 6 batch 1) cost 6.5 us a layer, serialised on latency.

    ``TOPK`` > 0 (route once, opt-in): every program takes a ticket after its logits are stored, and the one that
    draws the last runs the routing of ``cuda_moe_route`` on all ``E`` logits (``.cg`` loads: written by the other
    programs) and writes the top-k weights and ids for the expert launches, so the 384 w13 programs load one id
    instead of each running softmax + k rounds of max (the pattern of the one-launch attention's merge)."""
    if PDL:  # cuda_pdl.py: the router rows do not depend on the producer; x and the residual do
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        g = tl.load(gate_ptr + rows.to(tl.int64)[:, None] * stride_g + cols[None, :],
                    mask=(rows < E)[:, None] & mask[None, :], other=0.0)
        gdc_wait()
        gdc_launch_dependents()
    else:
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_H)
        mask = cols < H
        g = tl.load(gate_ptr + rows.to(tl.int64)[:, None] * stride_g + cols[None, :],
                    mask=(rows < E)[:, None] & mask[None, :], other=0.0)
    dtype = x_ptr.dtype.element_ty
    out_dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    r = tl.load(res_ptr + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the fused RMSNorm's steps, bit for bit
    sf = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(sf * sf, 0) / H + eps)
    y = ((sf * rstd).to(dtype).to(tl.float32) * w).to(out_dtype)
    if pid == 0:
        tl.store(res_out_ptr + cols, s, mask=mask)
        tl.store(out_ptr + cols, y, mask=mask)
    logits = tl.sum(g.to(tl.float32) * y.to(tl.float32)[None, :], axis=1)
    tl.store(logits_ptr + rows, logits.to(logits_ptr.dtype.element_ty), mask=rows < E)
    if TOPK > 0:
        tl.debug_barrier()  # every thread's logits stores precede the ticket (released by the atomic)
        ticket = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(0) - 1:  # the last program: all E logits are in memory
            tl.debug_barrier()  # (uniform branch) no thread loads a logit before the ticket's acquire
            tl.store(count_ptr, 0)  # every program has drawn its ticket: ready for the next launch
            experts = tl.arange(0, E_P)
            lg = tl.load(logits_ptr + experts, mask=experts < E, other=-float("inf"), cache_modifier=".cg")
            top_w, top_i = _route_values(lg.to(tl.float32), E, TOPK, K_P, E_P, RENORMALIZE)
            lanes = tl.arange(0, K_P)
            tl.store(weights_ptr + lanes, top_w, mask=lanes < TOPK)
            tl.store(ids_ptr + lanes, top_i.to(tl.int64), mask=lanes < TOPK)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


_COUNTERS: dict = {}  # one ticket counter per device, shared by every layer's launch (each resets it to 0)


def _counter(dev: torch.device) -> torch.Tensor:
    key = (dev.type, dev.index)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=dev)
    return _COUNTERS[key]


def norm_router(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor,
                rows: int | None = None, topk: tuple[int, bool] | None = None):
    """One token: ``(out, new_residual, logits)`` = RMSNorm(x + residual) * weight, x + residual, out @ gateᵀ.

    ``x``, ``residual`` ``[1, H]``; ``gate`` ``[E, H]`` row-major; logits in ``gate``'s dtype (as the linear).
    ``topk = (k, renormalize)``: also the routing, ``(out, new_residual, logits, weights [1, k] float32, ids [1, k]
    int64)``, the bits of ``moe_decode_kernels``' in-kernel routing of these logits."""
    h = x.shape[-1]
    e = gate.shape[0]
    x, residual = x.reshape(1, h).contiguous(), residual.reshape(1, h).contiguous()
    out = torch.empty(1, h, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x)
    logits = torch.empty(1, e, dtype=gate.dtype, device=x.device)
    rows = rows or max(1, min(4, 4096 // _p2(h)))  # a [rows, H] router tile of <= 4096 values: 64 programs at E=128
    k = topk[0] if topk else 0
    weights = torch.empty(1, max(k, 1), dtype=torch.float32, device=x.device)
    ids = torch.empty(1, max(k, 1), dtype=torch.int64, device=x.device)
    _norm_router_kernel[(triton.cdiv(e, rows),)](x, residual, weight, gate, out, res_out, logits, h, e, eps,
                                                  gate.stride(0), weights, ids, _counter(x.device),
                                                  BLOCK_H=_p2(h), ROWS=rows,
                                                  num_warps=8 if h > 4096 else 4,  # as the fused RMSNorm: same sums
                                                  TOPK=k, K_P=_p2(max(k, 1)), E_P=_p2(e),
                                                  RENORMALIZE=bool(topk and topk[1]), **launch_opts())
    if topk:
        return out, res_out, logits, weights, ids
    return out, res_out, logits


def _norm_forward(self, x, residual=None):
    """The norm's forward: one token with a residual -> the fused kernel, logits handed to the block."""
    block = self._moe_block
    gate = block.gate
    if (residual is not None and x.dim() == 2 and x.shape[0] == 1 and x.dtype == gate.weight.dtype
            and not gate._forward_hooks and not gate._forward_pre_hooks):  # a hooked router (LoRA) is called
        if block._moe_route_once:
            experts = block.experts
            out, res_out, logits, w, ids = norm_router(x, residual, self.weight, self.eps, gate.weight,
                                                       topk=(experts.top_k, experts.renormalize))
            block._moe_pre = (out, logits, (w, ids))
        else:
            out, res_out, logits = norm_router(x, residual, self.weight, self.eps, gate.weight)
            block._moe_pre = (out, logits, None)
        return out, res_out
    block._moe_pre = None
    return self._moe_norm_forward(x, residual)


def _block_forward(self, x):
    """The sparse block's forward: the router logits the norm computed for exactly this tensor, else the gate."""
    pre, self._moe_pre = self._moe_pre, None
    if pre is not None and pre[0] is x:
        if pre[2] is not None:  # route once: the experts' batch-1 path takes these ids for exactly these logits
            object.__setattr__(self.experts, "_moe_routed", (pre[1], *pre[2]))
        return self.experts(x, pre[1])
    return type(self).forward(self, x)


def _pairs(model):
    """(decoder layer, norm, block) triples this fusion may take (see the module docstring)."""
    from octavo.nn.linear import UnquantizedLinearMethod
    from octavo.plugins.models.llama import LlamaDecoderLayer
    from octavo.plugins.platforms.cuda_fusions import _fused_rms_forward

    for layer in model.modules():
        if type(layer).forward is not LlamaDecoderLayer.forward:
            continue
        norm, block = getattr(layer, "post_attention_layernorm", None), getattr(layer, "mlp", None)
        if type(block).__name__ not in SPARSE_BLOCKS or "forward" not in vars(block.experts):
            continue  # not a sparse block, or its experts lack the batch-1 path (the logits would go unused)
        gate = block.gate
        weight = getattr(gate, "weight", None)
        if (getattr(norm.forward, "__func__", None) is not _fused_rms_forward or block.experts.tp_size != 1
                or getattr(gate, "bias", None) is not None
                or not isinstance(getattr(gate, "quant_method", None), UnquantizedLinearMethod)
                or not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_contiguous()
                or "forward" in vars(block) or "forward" in vars(gate)):
            continue
        yield layer, norm, block


@torch.inference_mode()
def _agrees(norm, block) -> str | None:
    """The fused launch against the norm's and the router's own forwards on random inputs."""
    gen = torch.Generator(device=norm.weight.device).manual_seed(2)
    dt, h = block.gate.weight.dtype, norm.weight.shape[0]
    for _ in range(2):
        x, res = (torch.randn(1, h, generator=gen, device=norm.weight.device).to(dt) for _ in range(2))
        want_out, want_res = norm.forward(x, res)
        want_logits = block.gate(want_out)
        try:
            out, res_out, logits = norm_router(x, res, norm.weight, norm.eps, block.gate.weight)
        except Exception as e:  # noqa: BLE001 - cannot compile here: keep them apart
            return f"{type(e).__name__}: {e}"
        if not (torch.equal(out, want_out) and torch.equal(res_out, want_res)):
            return "the normalised row or the residual differs from the fused RMSNorm's"
        tol = 2e-2 if dt == torch.bfloat16 else 2e-3  # the router GEMV's sum order differs: an ulp or so
        if (logits.float() - want_logits.float()).abs().max() > tol * (want_logits.float().abs().max() + 1e-6):
            return "router logits differ from the router GEMV's"
    return None


@torch.inference_mode()
def _route_agrees(norm, block) -> str | None:
    """Route once: the launch's ids and weights against the experts' own routing of the same logits."""
    gen = torch.Generator(device=norm.weight.device).manual_seed(3)
    experts, dt, h = block.experts, block.gate.weight.dtype, norm.weight.shape[0]
    for _ in range(3):
        x, res = (torch.randn(1, h, generator=gen, device=norm.weight.device).to(dt) for _ in range(2))
        try:
            _, _, logits, w, ids = norm_router(x, res, norm.weight, norm.eps, block.gate.weight,
                                               topk=(experts.top_k, experts.renormalize))
        except Exception as e:  # noqa: BLE001 - cannot compile here: route in the w13 launch
            return f"{type(e).__name__}: {e}"
        want_w, want_ids = type(experts).select_experts(experts, logits.float())
        if not torch.equal(ids, want_ids) or (w - want_w).abs().max().item() > 1e-5:
            return "top-k ids or weights differ from the experts' routing"
    return None


def route_once_ok(block) -> bool:
    """The block's experts take precomputed ids at batch 1: the two-launch path with its in-kernel routing."""
    experts = block.experts
    cfg = experts.__dict__.get("_moe_decode_cfg") or {}
    return (experts.__dict__.get("_moe_decode") is not None and not experts.expert_parallel
            and cfg.get("w13", {}).get("ROUTE", "in") == "in" and not cfg.get("w13", {}).get("ALL_SLOTS"))


def set_norm_router(norm, block, on: bool, route_once: bool | None = None) -> None:
    """Turn the fusion of one installed (norm, block) pair on or off (benchmarks' A/B); ``route_once`` also moves the
    top-k into its last program (``None`` keeps the current choice; refused where the experts cannot take ids)."""
    if route_once is not None:
        if route_once and not route_once_ok(block):
            raise ValueError(f"OCTAVO_MOE_ROUTE_ONCE: {block.experts.prefix} has no batch-1 path that takes ids")
        block._moe_route_once = bool(route_once)
    if on:
        norm.forward = types.MethodType(_norm_forward, norm)
        block.forward = types.MethodType(_block_forward, block)
    else:
        norm.forward = norm._moe_norm_forward
        block.__dict__.pop("forward", None)
        block._moe_pre = None


def install_norm_router(model: torch.nn.Module) -> list:
    """Fuse every eligible (post-attention norm, router) pair; returns the ``(norm, block)`` pairs fused."""
    if not env_switch("OCTAVO_MOE_NORM_ROUTER", default=DEFAULT_ON):
        return []
    route_once = env_switch("OCTAVO_MOE_ROUTE_ONCE", default=ROUTE_ONCE_DEFAULT)
    done, verified, routed = [], {}, {}
    for _, norm, block in _pairs(model):
        key = (tuple(block.gate.weight.shape), block.gate.weight.dtype, norm.weight.dtype, float(norm.eps))
        if key not in verified:
            verified[key] = _agrees(norm, block)
            if verified[key]:
                logger.warning("MoE norm + router fusion not used for %s: %s", block.experts.prefix, verified[key])
        if verified[key]:
            continue
        object.__setattr__(norm, "_moe_block", block)  # a plain reference: not a submodule of the norm
        norm._moe_norm_forward, block._moe_pre, block._moe_route_once = norm.forward, None, False
        if route_once:
            why = None if route_once_ok(block) else "no batch-1 expert path that takes ids"
            if why is None:
                rkey = (key, block.experts.top_k, block.experts.renormalize)
                if rkey not in routed:
                    routed[rkey] = _route_agrees(norm, block)
                why = routed[rkey]
            if why:
                logger.warning("OCTAVO_MOE_ROUTE_ONCE: not used for %s: %s", block.experts.prefix, why)
            block._moe_route_once = why is None
        set_norm_router(norm, block, True)
        done.append((norm, block))
    if done:
        logger.info("MoE post-attention norm + router GEMV in one launch on %d layers", len(done))
    return done
