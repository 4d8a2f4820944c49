"""The fp8 gate/up GEMV with SiLU-and-mul in its epilogue, for batch-1 decode of Llama-style MLPs (opt-in:
``OCTAVO_FP8_SILU_GEMV=1``; measured slower than the unfused path on H100 in session 6 batch 2, 3.95 vs 3.87
ms/token in one engine, before the one-row GEMV had its split accumulator and PDL: session 11 gave it both, the
same launch settings as the unfused gate_up GEMV; the platform's bf16 version is cuda_mlp_fusion.py).

Why: at one row an fp8 Llama MLP is the gate_up GEMV, a separate SiLU-and-mul kernel (~2 us a layer on H100,
docs/performance.md "FP8 session 5") and the down GEMV; fusing the middle kernel into the first removes one launch
per layer (H100, session 6 batch 1: 44.1 us a call vs 43.5 for the gate_up GEMV + 2.1 for SiLU-and-mul).

How: each program owns ``BLOCK_N`` outputs ``n`` of ``[1, I]`` and streams both rows ``n`` (gate) and ``I + n``
(up) of the merged e4m3 weight, against the row's e4m3 activations (quantized here, or by the norm before it:
``_octavo_fp8``), with fp8_gemv.py's W8A8 arithmetic; then rounds like the unfused path (each GEMV output to
bf16, SiLU to bf16, the product to bf16) and stores ``silu(gate) * up``. Installed per MLP whose forward is
LlamaMLP's ``down_proj(act_fn(gate_up_proj(x)))`` (cuda_mlp_fusion's test) with an fp8 gate_up on the
CUDA-core one-row GEMV, after a check against the unfused path on random rows (own and producer quantization,
to one bf16 rounding: the tile, and so the fp32 summation order, may differ from the tuned GEMV's).
"""

from __future__ import annotations

import logging
import os
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.quant.fp8_gemv import _CACHE_TUNING, _quant_e4m3

logger = logging.getLogger(__name__)
STATE = {"on": env_switch("OCTAVO_FP8_SILU_GEMV", default=False)}  # installed wrappers read it per call


def _on() -> bool:
    return STATE["on"]


@triton.jit
def _silu_step(acc_g, acc_u, wg, wu, x_ptr, kk, s_x, K, QUANT_X: tl.constexpr, EVEN: tl.constexpr,
               SOFT_FP8: tl.constexpr, ACC_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One weight block of both rows into the accumulators (fp8_gemv's ``_gemv_step``, two rows)."""
    if EVEN:
        x = tl.load(x_ptr + kk).to(tl.float32)
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
    if QUANT_X:
        x = _quant_e4m3(x, s_x, SOFT_FP8)
    if ACC_SPLIT > 0:  # fp8_gemv's split accumulator: each thread's run of ACC_SPLIT products summed at once
        acc_g += tl.sum(tl.reshape(wg.to(tl.float32) * x[None, :], [BLOCK_N, BLOCK_K // ACC_SPLIT, ACC_SPLIT]), 2)
        acc_u += tl.sum(tl.reshape(wu.to(tl.float32) * x[None, :], [BLOCK_N, BLOCK_K // ACC_SPLIT, ACC_SPLIT]), 2)
    else:
        acc_g += wg.to(tl.float32) * x[None, :]
        acc_u += wu.to(tl.float32) * x[None, :]
    return acc_g, acc_u


@triton.jit
def _fp8_gemv_silu_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, N_OUT, K, stride_wn, QUANT_X: tl.constexpr,
                          EVEN: tl.constexpr, SOFT_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          USE_PDL: tl.constexpr = False, PDL_W: tl.constexpr = False, ACC_SPLIT: tl.constexpr = 0):
    """``USE_PDL`` / ``PDL_W`` / ``ACC_SPLIT`` as fp8_gemv's one-row kernel (session 11): launched as a programmatic
    dependent launch, the first weight block of both rows read before ``gdc_wait``, the split accumulator."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N_OUT
    g_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    u_rows = w_ptr + (n + N_OUT).to(tl.int64)[:, None] * stride_wn
    ws_g = tl.load(ws_ptr + n, mask=nm, other=0.0)
    ws_u = tl.load(ws_ptr + N_OUT + n, mask=nm, other=0.0)
    if PDL_W and EVEN:
        wg0 = tl.load(g_rows + tl.arange(0, BLOCK_K)[None, :])
        wu0 = tl.load(u_rows + tl.arange(0, BLOCK_K)[None, :])
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if PDL_W:
            tl.extra.cuda.gdc_launch_dependents()
    s_x = 1.0
    if QUANT_X:  # the row's per-token scale (fp8_gemv.py)
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + tl.arange(0, BLOCK_K)
            amax = tl.maximum(amax, tl.abs(tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)))
        s_x = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), 448.0), 1e-12)
    else:
        s_x = tl.load(xs_ptr)
    if ACC_SPLIT > 0:
        acc_g = tl.zeros([BLOCK_N, BLOCK_K // ACC_SPLIT], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K // ACC_SPLIT], dtype=tl.float32)
    else:
        acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k0 = 0
    if PDL_W and EVEN:
        acc_g, acc_u = _silu_step(acc_g, acc_u, wg0, wu0, x_ptr, tl.arange(0, BLOCK_K), s_x, K, QUANT_X, EVEN,
                                  SOFT_FP8, ACC_SPLIT, BLOCK_N, BLOCK_K)
        k0 = BLOCK_K
    for k in range(k0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            wg = tl.load(g_rows + kk[None, :])
            wu = tl.load(u_rows + kk[None, :])
        else:
            m = nm[:, None] & (kk[None, :] < K)
            wg = tl.load(g_rows + kk[None, :], mask=m, other=0.0)
            wu = tl.load(u_rows + kk[None, :], mask=m, other=0.0)
        acc_g, acc_u = _silu_step(acc_g, acc_u, wg, wu, x_ptr, kk, s_x, K, QUANT_X, EVEN, SOFT_FP8, ACC_SPLIT,
                                  BLOCK_N, BLOCK_K)
    elt = y_ptr.dtype.element_ty
    g = (tl.sum(acc_g, 1) * s_x * ws_g).to(elt).to(tl.float32)  # what the GEMV would store
    u = (tl.sum(acc_u, 1) * s_x * ws_u).to(elt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(elt).to(tl.float32)  # as the SiLU-and-mul kernel rounds
    tl.store(y_ptr + n, (s * u).to(elt), mask=nm)


# (BLOCK_N, BLOCK_K, num_warps, num_stages) the compiled kernel is tuned over (session 11; (8, 1024, 4) was the
# fixed tile before); timed with the call's own flags (PDL, split accumulator), cached as fp8_gemv's
_CONFIGS = ((8, 1024, 4, 3), (4, 1024, 4, 3), (16, 512, 4, 3), (8, 512, 4, 3), (16, 1024, 8, 3))
_tuned = triton.autotune(
    configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st) for bn, bk, w, st in _CONFIGS],
    key=["N_OUT", "K", "QUANT_X", "EVEN", "USE_PDL", "PDL_W", "ACC_SPLIT"], **_CACHE_TUNING)(_fp8_gemv_silu_kernel)


def fp8_gemv_silu(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  x_scale: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                  config: tuple[int, int, int] | None = None, *, pdl: bool = False, pdl_w: bool = False,
                  acc_split: int = 0) -> torch.Tensor:
    """``silu(g) * u`` of the fp8 GEMV ``[g | u] = x @ W.T`` for one row ``x [1, K]`` (bf16, or e4m3 with
    ``x_scale``) and a merged gate/up e4m3 ``W [2I, K]`` with per-row ``weight_scale``; ``[1, I]``.
    ``pdl`` / ``pdl_w`` / ``acc_split``: as ``fp8_gemv`` (compiled kernel only; the interpreter refuses PDL)."""
    two_i, k = weight.shape
    if x.shape != (1, k) or two_i % 2 or weight.stride(1) != 1:
        raise ValueError(f"fp8_gemv_silu: x {tuple(x.shape)}, weight {tuple(weight.shape)}: one row, [2I, K] row-major")
    if (x_scale is not None) != (x.dtype == torch.float8_e4m3fn):
        raise ValueError("fp8_gemv_silu: an e4m3 x comes with its x_scale, a 16-bit x without")
    if acc_split not in (0, 8, 16):
        raise ValueError(f"fp8_gemv_silu: acc_split={acc_split}: 0, 8 or 16")
    i = two_i // 2
    x = x.contiguous()
    y = torch.empty(1, i, dtype=out_dtype, device=x.device)
    ws = weight_scale.reshape(-1)
    soft = os.environ.get("TRITON_INTERPRET") == "1"
    if pdl and soft:
        raise ValueError("fp8_gemv_silu: pdl is for the compiled kernel (interpreter)")
    args = (x, x_scale.reshape(-1) if x_scale is not None else ws, weight, ws, y, i, k, weight.stride(0))
    launch = {"launch_pdl": True} if pdl else {}
    if soft or config is not None:
        bn, bk, warps = (16, 64, 4) if soft else config
        even = not soft and k % bk == 0 and i % bn == 0
        _fp8_gemv_silu_kernel[(triton.cdiv(i, bn),)](
            *args, QUANT_X=x_scale is None, EVEN=even, SOFT_FP8=soft, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
            USE_PDL=pdl, PDL_W=pdl and pdl_w and even, ACC_SPLIT=acc_split, **launch)
        return y
    even = k % 1024 == 0 and i % 16 == 0  # every tile of _CONFIGS divides
    _tuned[lambda meta: (triton.cdiv(i, meta["BLOCK_N"]),)](
        *args, QUANT_X=x_scale is None, EVEN=even, SOFT_FP8=False, USE_PDL=pdl, PDL_W=pdl and pdl_w and even,
        ACC_SPLIT=acc_split, **launch)
    return y


def _launch(gu, device) -> dict:
    """The one-row fp8 GEMV's launch settings for the fused kernel (read per call: benchmarks flip them): PDL and
    its early weight block (fp8_prefetch.gemv_launch; no L2 chain), the split accumulator (fp8_gemv.ACC_SPLIT)."""
    from octavo.plugins.quant import fp8_gemv
    from octavo.plugins.quant.fp8_prefetch import gemv_launch

    launch = gemv_launch(gu.quant_method, device)
    soft = os.environ.get("TRITON_INTERPRET") == "1"
    return {"pdl": bool(launch.get("pdl")), "pdl_w": bool(launch.get("pdl_w")),
            "acc_split": 0 if soft else fp8_gemv.ACC_SPLIT}


def _fusable(module) -> bool:
    """LlamaMLP's forward (its class or a copy of its code, cuda_mlp_fusion's test), SiLU-and-mul, and an fp8
    gate_up without bias on the CUDA-core one-row GEMV."""
    from octavo.nn.activation import SiluAndMul
    from octavo.plugins.models.llama import LlamaMLP
    from octavo.plugins.quant.fp8 import _FP8Method

    gu = getattr(module, "gate_up_proj", None)
    qm = getattr(gu, "quant_method", None)
    if (not isinstance(qm, _FP8Method) or getattr(qm, "gemv_tc", None) is not None or not getattr(qm, "gemv_max_m", 0)
            or type(getattr(module, "act_fn", None)) is not SiluAndMul or getattr(module, "down_proj", None) is None
            or getattr(gu, "bias", None) is not None or gu.weight.stride(1) != 1 or gu.weight.shape[0] % 2):
        return False
    code, ref = getattr(type(module).forward, "__code__", None), LlamaMLP.forward.__code__
    return code is not None and (code.co_code, code.co_names, code.co_consts) == (ref.co_code, ref.co_names,
                                                                               ref.co_consts)


def _install(module) -> None:
    inner = module.forward
    gu, act = module.gate_up_proj, module.act_fn

    def forward(self, x):
        if (_on() and x.dim() == 2 and x.shape[0] == 1 and not gu._forward_hooks and not gu._forward_pre_hooks
                and not act._forward_hooks and not act._forward_pre_hooks):
            pre = getattr(x, "_octavo_fp8", None)  # quantized by the norm that made x (fp8_fused.py)
            launch = _launch(gu, x.device)
            if pre is not None and pre[0].shape == x.shape:
                return self.down_proj(fp8_gemv_silu(pre[0], gu.weight, gu.weight_scale, pre[1], x.dtype, **launch))
            return self.down_proj(fp8_gemv_silu(x, gu.weight, gu.weight_scale, out_dtype=x.dtype, **launch))
        return inner(x)

    module.forward = types.MethodType(forward, module)
    module._octavo_fp8_silu = True  # never wrapped twice


@torch.inference_mode()
def fuse_fp8_silu_gemv(model: torch.nn.Module, device: torch.device) -> int:
    """Wrap every fusable fp8 MLP of ``model`` (the kernel checked once per weight shape against the unfused
    GEMV + SiLU-and-mul, own and producer quantization, within one bf16 rounding); returns how many."""
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    verified: dict[tuple, bool] = {}
    gen = torch.Generator(device=device).manual_seed(1)
    n = 0
    for module in model.modules():
        if "_octavo_fp8_silu" in vars(module) or not _fusable(module):
            continue
        gu = module.gate_up_proj
        key = tuple(gu.weight.shape)
        if key not in verified:
            try:
                x = torch.randn(1, key[1], generator=gen, device=device).bfloat16()
                want = module.act_fn(gu(x)).float()
                xq, xs = quantize_per_token(x)
                launch = _launch(gu, device)  # the settings the wrapper calls it with
                worst = max(float((got.float() - want).abs().max()) for got in (
                    fp8_gemv_silu(x, gu.weight, gu.weight_scale, **launch),
                    fp8_gemv_silu(xq, gu.weight, gu.weight_scale, xs, **launch)))
                verified[key] = worst <= 1.6e-2 * float(want.abs().max())  # one bf16 rounding step
                if not verified[key]:
                    logger.warning("fp8 gate/up + SiLU GEMV not used for %s: %.3g from the unfused path", key, worst)
            except Exception as e:  # noqa: BLE001 - keep the unfused layers
                logger.warning("fp8 gate/up + SiLU GEMV not used for %s: %s: %s", key, type(e).__name__, e)
                verified[key] = False
        if verified[key]:
            _install(module)
            n += 1
    return n
