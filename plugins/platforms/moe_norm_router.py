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
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

logger = logging.getLogger(__name__)

SPARSE_BLOCKS = ("Qwen3MoeSparseBlock", "MixtralSparseMoeBlock")  # forward = experts(x, gate(x)), nothing more
DEFAULT_ON = True  # session 8 batch 1 (H100): Qwen3-30B-A3B forward 2.952 vs 3.029 ms apart (docs/moe.md)


@triton.jit
def _norm_router_kernel(x_ptr, res_ptr, w_ptr, gate_ptr, out_ptr, res_out_ptr, logits_ptr, H, E, eps, stride_g,
                        BLOCK_H: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False):
    """All loads (the row, the residual, the norm weight, this program's ``ROWS`` router rows) are issued at once:
    a loop over H chunks re-reading the row (session 6 batch 1) cost 6.5 us a layer, serialised on latency."""
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


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def norm_router(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gate: torch.Tensor,
                rows: int | None = None):
    """One token: ``(out, new_residual, logits)`` = RMSNorm(x + residual) * weight, x + residual, out @ gateᵀ.

    ``x``, ``residual`` ``[1, H]``; ``gate`` ``[E, H]`` row-major; logits in ``gate``'s dtype (as the linear)."""
    h = x.shape[-1]
    e = gate.shape[0]
    x, residual = x.reshape(1, h).contiguous(), residual.reshape(1, h).contiguous()
    out = torch.empty(1, h, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x)
    logits = torch.empty(1, e, dtype=gate.dtype, device=x.device)
    rows = rows or max(1, min(4, 4096 // _p2(h)))  # a [rows, H] router tile of <= 4096 values: 64 programs at E=128
    _norm_router_kernel[(triton.cdiv(e, rows),)](x, residual, weight, gate, out, res_out, logits, h, e, eps,
                                                  gate.stride(0), BLOCK_H=_p2(h), ROWS=rows,
                                                  num_warps=8 if h > 4096 else 4,  # as the fused RMSNorm: same sums
                                                  **launch_opts())
    return out, res_out, logits


def _norm_forward(self, x, residual=None):
    """The norm's forward: one token with a residual -> the fused kernel, logits handed to the block."""
    block = self._moe_block
    gate = block.gate
    if (residual is not None and x.dim() == 2 and x.shape[0] == 1 and x.dtype == gate.weight.dtype
            and not gate._forward_hooks and not gate._forward_pre_hooks):  # a hooked router (LoRA) is called
        out, res_out, logits = norm_router(x, residual, self.weight, self.eps, gate.weight)
        block._moe_pre = (out, logits)
        return out, res_out
    block._moe_pre = None
    return self._moe_norm_forward(x, residual)


def _block_forward(self, x):
    """The sparse block's forward: the router logits the norm computed for exactly this tensor, else the gate."""
    pre, self._moe_pre = self._moe_pre, None
    if pre is not None and pre[0] is x:
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


def set_norm_router(norm, block, on: bool) -> None:
    """Turn the fusion of one installed (norm, block) pair on or off (benchmarks' A/B)."""
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
    done, verified = [], {}
    for _, norm, block in _pairs(model):
        key = (tuple(block.gate.weight.shape), block.gate.weight.dtype, norm.weight.dtype, float(norm.eps))
        if key not in verified:
            verified[key] = _agrees(norm, block)
            if verified[key]:
                logger.warning("MoE norm + router fusion not used for %s: %s", block.experts.prefix, verified[key])
        if verified[key]:
            continue
        object.__setattr__(norm, "_moe_block", block)  # a plain reference: not a submodule of the norm
        norm._moe_norm_forward, block._moe_pre = norm.forward, None
        set_norm_router(norm, block, True)
        done.append((norm, block))
    if done:
        logger.info("MoE post-attention norm + router GEMV in one launch on %d layers", len(done))
    return done
