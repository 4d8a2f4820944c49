"""Batch-1 Qwen3-MoE layers: the input RMSNorm (with its residual add) and the qkv GEMV in ONE launch.

Why: at batch 1 every decoder layer starts with an RMSNorm kernel of one program (wait for the previous layer's
expert output, read 2 x H values, one reduction, two stores: ~2 us of pure latency while HBM idles) before the
qkv GEMV can use its row. Here the qkv GEMV's programs (``BLOCK_N`` weight rows each) recompute that norm
themselves: with PDL each loads its first weight tile, waits for the producer, reads the row and the residual
(a few KB from L2), forms the sum of squares exactly as the fused RMSNorm kernel of ``cuda_fusions`` does (same
block, same warps, same roundings: bit-equal, checked at install), and streams its rows. Program 0 also writes
the normalised row and the new residual, so every other consumer sees what the unfused pair gives.

Wiring (as ``moe_norm_router.py`` does for the post-attention pair): the layer's ``input_layernorm`` forward, for
one token with a residual, runs the kernel and hands ``(normalised row, qkv)`` to its attention module; the
attention's batch-1 forward (``moe_attention._forward``) uses that qkv only for that very tensor (identity
check), else it calls ``qkv_proj`` as before. Installed on decoder layers with Llama's forward whose attention
has the one-launch batch-1 forward, whose norm runs ``cuda_fusions``' kernel, and whose ``qkv_proj`` is a plain
unquantized bias-free linear, at tensor parallel size 1. On by default since session 11 (``OCTAVO_MOE_NORM_QKV=0``
off) with 16 rows a program, the engine GEMV's BLOCK_K (the same sums: the forward's output bits did not change) and 2
K-blocks before the wait: same-engine A/B, Qwen3-30B-A3B batch-1 forward 2.741 -> 2.711 ms on an H100 (session 11)
and 2.296 -> 2.268 ms on an H200 (session 10); GPU test test_moe_norm_qkv_gpu.py (bit-equal to the engine GEMV).
"""

from __future__ import annotations

import logging
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.platforms.cuda_moe_oproj import _w_block
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

logger = logging.getLogger(__name__)

DEFAULTS = {"block_n": 16, "block_k": None,  # block_k None: the engine GEMV's (the same sums); 218 registers
            "pre": 2}  # K-blocks loaded before the PDL wait (1..4)
DEFAULT_ON = True  # session 11 (H100) and session 10 (H200) A/Bs: faster, same bits (module docstring)


@triton.jit
def _row_chunk(x_ptr, res_ptr, nw_ptr, c, H, rstd, dtype: tl.constexpr, out_dtype: tl.constexpr):
    """Columns ``c`` of the normalised row (fp32 of ``out_dtype`` values), element for element as the full row."""
    cm = c < H
    sc = (tl.load(x_ptr + c, mask=cm, other=0.0).to(tl.float32)
          + tl.load(res_ptr + c, mask=cm, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    nw = tl.load(nw_ptr + c, mask=cm, other=0.0).to(tl.float32)
    return ((sc * rstd).to(dtype).to(tl.float32) * nw).to(out_dtype).to(tl.float32)


@triton.jit
def _norm_gemv_kernel(x_ptr, res_ptr, nw_ptr, w_ptr, y_ptr, out_ptr, res_out_ptr, N, H, eps, stride_wn,
                      BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRE: tl.constexpr = 1,
                      PDL: tl.constexpr = False):
    """``y[n] = W[n] . rmsnorm(x + res) * nw`` for this program's ``BLOCK_N`` rows; program 0 writes the normed
    row and ``x + res``. The row's chunks are re-formed per K-block with the full-row ``rstd`` (same bits). The
    first ``PRE`` (1..4) K-blocks of W load before the wait (while the previous layer's w2 launch still runs)."""
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    kk = tl.arange(0, BLOCK_K)
    w0 = _w_block(rows, nm, H, 0, BLOCK_K, False)  # weights: before the wait (static ifs: the names stay in scope)
    if PRE > 1:
        w1 = _w_block(rows, nm, H, 1, BLOCK_K, False)
    if PRE > 2:
        w2 = _w_block(rows, nm, H, 2, BLOCK_K, False)
    if PRE > 3:
        w3 = _w_block(rows, nm, H, 3, BLOCK_K, False)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    dtype = x_ptr.dtype.element_ty
    out_dtype = out_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + cols, mask=mask, other=0.0)
    r = tl.load(res_ptr + cols, mask=mask, other=0.0)
    s = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)  # the fused RMSNorm's steps, bit for bit
    sf = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(sf * sf, 0) / H + eps)
    if pid == 0:
        nw = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_out_ptr + cols, s, mask=mask)
        tl.store(out_ptr + cols, ((sf * rstd).to(dtype).to(tl.float32) * nw).to(out_dtype), mask=mask)
    acc = w0.to(tl.float32) * _row_chunk(x_ptr, res_ptr, nw_ptr, kk, H, rstd, dtype, out_dtype)[None, :]
    if PRE > 1:
        acc += w1.to(tl.float32) * _row_chunk(x_ptr, res_ptr, nw_ptr, BLOCK_K + kk, H, rstd, dtype, out_dtype)[None, :]
    if PRE > 2:
        acc += w2.to(tl.float32) * _row_chunk(x_ptr, res_ptr, nw_ptr, 2 * BLOCK_K + kk, H, rstd, dtype,
                                              out_dtype)[None, :]
    if PRE > 3:
        acc += w3.to(tl.float32) * _row_chunk(x_ptr, res_ptr, nw_ptr, 3 * BLOCK_K + kk, H, rstd, dtype,
                                              out_dtype)[None, :]
    for k in range(PRE * BLOCK_K, H, BLOCK_K):
        c = k + kk
        w = tl.load(rows + c[None, :], mask=nm[:, None] & (c < H)[None, :], other=0.0)
        acc += w.to(tl.float32) * _row_chunk(x_ptr, res_ptr, nw_ptr, c, H, rstd, dtype, out_dtype)[None, :]
    tl.store(y_ptr + n, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=nm)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def norm_qkv(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
             block_n: int = 32, block_k: int | None = 256, pre: int = 1):
    """One token: ``(out, new_residual, y)`` = RMSNorm(x + residual) * norm_weight, x + residual, out @ weightᵀ.

    ``x``, ``residual`` ``[1, H]``; ``weight`` ``[N, H]`` row-major; ``y`` in ``weight``'s dtype (as the linear)."""
    h = x.shape[-1]
    n = weight.shape[0]
    if isinstance(pre, bool) or not isinstance(pre, int) or not 1 <= pre <= 4:
        raise ValueError(f"norm_qkv: pre must be an int in 1..4, not {pre!r}")
    if block_k is None:  # the engine GEMV's K-block (cuda_fusions.gemv): its row sums in its order
        from octavo.plugins.platforms.cuda_allreduce_gemv import plain_gemv_config

        engine = plain_gemv_config(n, h, weight.dtype, weight.device)
        if engine is None:
            raise ValueError(f"norm_qkv: block_k None, but the engine GEMV has not tuned {(n, h)} yet")
        block_k = engine["BLOCK_K"]
    block_k = min(block_k, _p2(h))
    pre = min(pre, triton.cdiv(h, block_k))
    x, residual = x.reshape(1, h).contiguous(), residual.reshape(1, h).contiguous()
    out = torch.empty(1, h, dtype=torch.promote_types(norm_weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x)
    y = torch.empty(1, n, dtype=weight.dtype, device=x.device)
    _norm_gemv_kernel[(triton.cdiv(n, block_n),)](x, residual, norm_weight, weight, y, out, res_out, n, h, eps,
                                                  weight.stride(0), BLOCK_H=_p2(h), BLOCK_N=block_n,
                                                  BLOCK_K=block_k, PRE=pre,
                                                  num_warps=8 if h > 4096 else 4,  # as the fused RMSNorm: same sums
                                                  **launch_opts())
    return out, res_out, y


def _norm_forward(self, x, residual=None):
    """The input norm's forward: one token with a residual -> the fused kernel, qkv handed to the attention."""
    attn = self._moe_attn
    qkv = attn.qkv_proj
    if (attn._norm_qkv["on"] and residual is not None and x.dim() == 2 and x.shape[0] == 1
            and x.dtype == qkv.weight.dtype and not qkv._forward_hooks and not qkv._forward_pre_hooks):
        cfg = attn._norm_qkv
        out, res_out, qkv = norm_qkv(x, residual, self.weight, self.eps, attn.qkv_proj.weight, cfg["block_n"],
                                     cfg["block_k"], cfg["pre"])
        attn._qkv_pre = (out, qkv)
        return out, res_out
    attn._qkv_pre = None
    return self._moe_norm_forward(x, residual)


def take_qkv(attn, hidden_states: torch.Tensor):
    """The qkv the input norm computed for exactly this tensor (then forgotten), else None."""
    pre = attn.__dict__.get("_qkv_pre")
    attn._qkv_pre = None
    return pre[1] if pre is not None and pre[0] is hidden_states else None


def _pairs(model):
    """(norm, attention) pairs this fusion may take (see the module docstring)."""
    from octavo.nn.linear import UnquantizedLinearMethod
    from octavo.plugins.models.llama import LlamaDecoderLayer
    from octavo.plugins.platforms.cuda_fusions import _fused_rms_forward

    for layer in model.modules():
        if type(layer).forward is not LlamaDecoderLayer.forward:
            continue
        norm, attn = getattr(layer, "input_layernorm", None), getattr(layer, "self_attn", None)
        qkv = getattr(attn, "qkv_proj", None)
        weight = getattr(qkv, "weight", None)
        if ("_attn_one" not in vars(attn) or getattr(norm.forward, "__func__", None) is not _fused_rms_forward
                or getattr(qkv, "bias", None) is not None or getattr(qkv, "tp_size", 1) != 1
                or not isinstance(getattr(qkv, "quant_method", None), UnquantizedLinearMethod)
                or not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_contiguous()
                or "forward" in vars(qkv)):
            continue
        yield norm, attn


@torch.inference_mode()
def _agrees(norm, attn) -> str | None:
    """The fused launch against the norm's and qkv_proj's own forwards on random inputs."""
    gen = torch.Generator(device=norm.weight.device).manual_seed(3)
    dt, h = attn.qkv_proj.weight.dtype, norm.weight.shape[0]
    for _ in range(2):
        x, res = (torch.randn(1, h, generator=gen, device=norm.weight.device).to(dt) for _ in range(2))
        want_out, want_res = norm.forward(x, res)
        want = attn.qkv_proj(want_out)
        try:
            out, res_out, got = norm_qkv(x, res, norm.weight, norm.eps, attn.qkv_proj.weight,
                                         **{f"block_{k}": v for k, v in (("n", attn._norm_qkv["block_n"]),
                                                                         ("k", attn._norm_qkv["block_k"]))})
        except Exception as e:  # noqa: BLE001 - cannot compile here: keep them apart
            return f"{type(e).__name__}: {e}"
        if not (torch.equal(out, want_out) and torch.equal(res_out, want_res)):
            return "the normalised row or the residual differs from the fused RMSNorm's"
        tol = 2e-2 if dt == torch.bfloat16 else 2e-3  # the GEMV's sum order differs: an ulp or so
        if (got.float() - want.float()).abs().max() > tol * (want.float().abs().max() + 1e-6):
            return "qkv differs from qkv_proj's"
    return None


def install_norm_qkv(model: torch.nn.Module, force: bool = False) -> list:
    """Fuse every eligible (input norm, qkv) pair; returns the ``(norm, attention)`` pairs fused. On by default
    (``OCTAVO_MOE_NORM_QKV=0`` off; ``force`` for benchmarks' A/B)."""
    if not (force or env_switch("OCTAVO_MOE_NORM_QKV", default=DEFAULT_ON)):
        return []
    done, verified = [], {}
    for norm, attn in _pairs(model):
        attn._norm_qkv = {"on": True, **DEFAULTS}
        key = (tuple(attn.qkv_proj.weight.shape), attn.qkv_proj.weight.dtype, norm.weight.dtype, float(norm.eps))
        if key not in verified:
            verified[key] = _agrees(norm, attn)
            if verified[key]:
                logger.warning("MoE input norm + qkv fusion not used: %s", verified[key])
        if verified[key]:
            del attn._norm_qkv
            continue
        object.__setattr__(norm, "_moe_attn", attn)  # a plain reference: not a submodule of the norm
        norm._moe_norm_forward = norm.forward
        norm.forward = types.MethodType(_norm_forward, norm)
        done.append((norm, attn))
    if done:
        logger.info("MoE input norm + qkv GEMV in one launch on %d layers", len(done))
    return done


def set_norm_qkv(pairs: list, **settings) -> None:
    """Change ``on`` / ``block_n`` / ``block_k`` / ``pre`` of installed pairs (graphs captured afterwards use them)."""
    bad = set(settings) - {"on", *DEFAULTS}
    if bad:
        raise ValueError(f"unknown norm + qkv settings {sorted(bad)}")
    for _, attn in pairs:
        attn._norm_qkv.update(settings)
