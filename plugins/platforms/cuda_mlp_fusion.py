"""Gate/up GEMV with SiLU-and-mul in its epilogue, for batch-1 decode of Llama-style MLPs (opt-in:
``OCTAVO_FUSE_SILU_GEMV=1``).

Why: at batch 1 a Llama layer runs ``gate_up_proj`` (a GEMV writing ``[1, 2 * I]``) and then a separate
SiLU-and-mul kernel (~2 us, docs/performance.md kernel tables) that reads it back; one kernel per layer less is
~60 us of an 8B decode step, which matters most at TP=2 where the step is 3.5 ms (issue 12).

How: each program owns ``BLOCK_N`` outputs ``n`` and reads both weight rows ``n`` (gate) and ``I + n`` (up) of
the merged weight (the column-parallel shard's layout: ``[gate_local; up_local]``), then stores
``silu(gate) * up`` with the roundings of the unfused path (each GEMV output rounded to the dtype, SiLU rounded,
the product rounded). Installed per MLP instance whose forward is ``down_proj(act_fn(gate_up_proj(x)))`` with a
SiLU-and-mul and a dense, bias-free gate_up on the Triton GEMV path, after a check against that path on random
inputs (to one rounding of the dtype: the fused kernel is tuned on its own, so its tile and thus the summation
order may differ). Off at run time (``set_silu_gemv``), with hooks on the layers (LoRA), or for more than one
row, the original forward runs.
"""

from __future__ import annotations

import logging
import os
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait, launch_opts

logger = logging.getLogger(__name__)

_INSTALL = env_switch("OCTAVO_FUSE_SILU_GEMV", default=True)  # session 6 batch 1: TP=1 8B graph 5.41 -> 5.35 ms
_STATE = {"on": _INSTALL}


def set_silu_gemv(on: bool) -> None:
    """Use the fused gate/up + SiLU kernel in forwards (and graph captures) from now on, or not."""
    _STATE["on"] = bool(on)


@triton.jit
def _gemv_silu_kernel(x_ptr, w_ptr, y_ptr, N_OUT, K, stride_wn, EVEN: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = n < N_OUT
    g_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    u_rows = w_ptr + (n + N_OUT).to(tl.int64)[:, None] * stride_wn
    acc_g = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k0 = 0
    if PDL:  # cuda_pdl.py: the first gate/up weight tiles load while the producer of x finishes (weights never
        kk = tl.arange(0, BLOCK_K)  # change, as in cuda_fusions._gemv_kernel); x only after the wait
        if EVEN:
            wg = tl.load(g_rows + kk[None, :])
            wu = tl.load(u_rows + kk[None, :])
        else:
            m = nm[:, None] & (kk[None, :] < K)
            wg = tl.load(g_rows + kk[None, :], mask=m, other=0.0)
            wu = tl.load(u_rows + kk[None, :], mask=m, other=0.0)
        gdc_wait()
        gdc_launch_dependents()
        if EVEN:
            x = tl.load(x_ptr + kk)
        else:
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        xf = x.to(tl.float32)[None, :]
        acc_g += wg.to(tl.float32) * xf
        acc_u += wu.to(tl.float32) * xf
        k0 = BLOCK_K
    for k in range(k0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            wg = tl.load(g_rows + kk[None, :])
            wu = tl.load(u_rows + kk[None, :])
            x = tl.load(x_ptr + kk)
        else:
            m = nm[:, None] & (kk[None, :] < K)
            wg = tl.load(g_rows + kk[None, :], mask=m, other=0.0)
            wu = tl.load(u_rows + kk[None, :], mask=m, other=0.0)
            x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        xf = x.to(tl.float32)[None, :]
        acc_g += wg.to(tl.float32) * xf
        acc_u += wu.to(tl.float32) * xf
    elt = y_ptr.dtype.element_ty
    g = tl.sum(acc_g, 1).to(elt).to(tl.float32)  # the GEMV's stored outputs
    u = tl.sum(acc_u, 1).to(elt).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(elt).to(tl.float32)  # as the SiLU-and-mul kernel rounds
    tl.store(y_ptr + n, (s * u).to(elt), mask=nm)


def _configs():
    """Autotuned over GEMV tiles (BLOCK_N, BLOCK_K, warps, stages) like cuda_fusions' GEMV; this module does not
    import cuda_fusions (it imports this one), so the list is its own."""
    import inspect

    tiles = ((8, 512, 4, 3), (16, 512, 4, 3), (16, 256, 4, 4), (32, 256, 4, 3), (16, 1024, 8, 3), (32, 512, 8, 3))
    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st) for bn, bk, w, st in tiles]
    tuning = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    return triton.autotune(configs=configs, key=["N_OUT", "K", "EVEN"], **tuning)(_gemv_silu_kernel)


_tuned = None


def gemv_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(x @ W[:I].T) * (x @ W[I:].T)`` for one row ``x [1, K]`` and a merged gate/up ``W [2I, K]``."""
    global _tuned
    two_i, K = weight.shape
    i = two_i // 2
    y = torch.empty(1, i, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    if os.environ.get("TRITON_INTERPRET") == "1":  # no timer to autotune with: one fixed tile
        _gemv_silu_kernel[(triton.cdiv(i, 16),)](x, weight, y, i, K, weight.stride(0), EVEN=False, BLOCK_N=16,
                                                 BLOCK_K=64, **launch_opts())
        return y
    if _tuned is None:
        _tuned = _configs()
    _tuned[lambda meta: (triton.cdiv(i, meta["BLOCK_N"]),)](x, weight, y, i, K, weight.stride(0),
                                                            EVEN=K % 1024 == 0 and i % 64 == 0, **launch_opts())
    return y


def _fusable(module) -> bool:
    from octavo.nn.activation import SiluAndMul

    gu, act = getattr(module, "gate_up_proj", None), getattr(module, "act_fn", None)
    if gu is None or type(act) is not SiluAndMul or getattr(module, "down_proj", None) is None:
        return False
    from octavo.plugins.models.llama import LlamaMLP

    code, ref = getattr(type(module).forward, "__code__", None), LlamaMLP.forward.__code__
    # forward is LlamaMLP's ``down_proj(act_fn(gate_up_proj(x)))`` (its class or a copy of its code), nothing more
    same = code is not None and (code.co_code, code.co_names, code.co_consts) == (ref.co_code, ref.co_names,
                                                                               ref.co_consts)
    return (same and getattr(gu, "bias", None) is None
            and type(gu.quant_method).__name__ == "TritonGemvLinearMethod" and gu.weight.stride(1) == 1
            and gu.weight.shape[0] % 2 == 0)


def _install(module) -> None:
    inner = module.forward
    gu, act = module.gate_up_proj, module.act_fn

    def forward(self, x):
        if (_STATE["on"] and x.dim() == 2 and not gu._forward_hooks
                and not gu._forward_pre_hooks and not act._forward_hooks and not act._forward_pre_hooks):
            if x.shape[0] == 1:
                return self.down_proj(gemv_silu(x, gu.weight))
            from octavo.plugins.platforms.cuda_gemm_silu import gate_up_silu

            y = gate_up_silu(x, gu.weight, lambda t: act(gu(t)))  # 2-256 rows, measured shapes only
            if y is not None:
                return self.down_proj(y)
        return inner(x)

    module.forward = types.MethodType(forward, module)


@torch.inference_mode()
def fuse_silu_gemv(model: torch.nn.Module, dtype: torch.dtype, device: torch.device, close) -> dict[str, int]:
    """Wrap every fusable MLP of ``model`` (the kernel checked once per weight shape against the unfused
    gate_up GEMV + SiLU-and-mul with ``close(got, want)``, cuda_fusions' tolerance) when
    ``OCTAVO_FUSE_SILU_GEMV=1``; returns ``{"MLP(gemv+silu)": count}``."""
    if not _INSTALL:
        return {}

    verified: dict[tuple, bool] = {}
    gen = torch.Generator(device=device).manual_seed(1)
    n = 0
    for module in model.modules():
        if not _fusable(module):
            continue
        gu = module.gate_up_proj
        key = tuple(gu.weight.shape)
        if key not in verified:
            x = torch.randn(1, key[1], generator=gen, device=device, dtype=torch.float32).to(dtype)
            try:
                verified[key] = close(gemv_silu(x, gu.weight), module.act_fn(gu(x)))
            except Exception as e:  # noqa: BLE001 - keep the unfused layers
                logger.warning("gate/up + SiLU GEMV not used for %s: %s", key, e)
                verified[key] = False
            if not verified[key]:
                logger.warning("gate/up + SiLU GEMV not used for %s: it disagrees with the unfused path", key)
        if verified[key]:
            _install(module)
            n += 1
    return {"MLP(gemv+silu)": n}
