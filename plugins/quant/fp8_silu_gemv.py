"""The fp8 gate/up GEMV with SiLU-and-mul in its epilogue, for batch-1 decode of Llama-style MLPs (opt-in:
``OCTAVO_FP8_SILU_GEMV=1``; measured slower than the unfused path on H100 in session 6 batch 2, 3.95 vs 3.87
ms/token in one engine, before the one-row GEMV had its split accumulator and PDL: session 11 gave it both, the
same launch settings as the unfused gate_up GEMV; the platform's bf16 version is cuda_mlp_fusion.py).

Why: at one row an fp8 Llama MLP is the gate_up GEMV, a separate SiLU-and-mul kernel (~2 us a layer on H100,
docs/performance.md "FP8 session 5") and the down GEMV; fusing the middle kernel into the first removes one launch
per layer (H100, session 6 batch 1: 44.1 us a call vs 43.5 for the gate_up GEMV + 2.1 for SiLU-and-mul).

How: each program owns ``BLOCK_N / 2`` outputs ``n`` of ``[1, I]``; its tile's rows are their gate rows ``n`` and
up rows ``I + n`` of the merged e4m3 weight, run through fp8_gemv.py's one-row body (``_pair_gemv``: the same loads,
accumulator, PDL and rounding) with the unfused gate_up GEMV's tuned tile (session 11), so every gate / up value
has that GEMV's bits; then SiLU and the product rounded as the SiLU-and-mul kernel rounds. Installed per MLP whose
forward is LlamaMLP's ``down_proj(act_fn(gate_up_proj(x)))`` (cuda_mlp_fusion's test) with an fp8 gate_up on the
CUDA-core one-row GEMV, after a check against the unfused path on random rows (own and producer quantization).
"""

from __future__ import annotations

import logging
import os
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.quant.fp8_gemv import _gemv_step

logger = logging.getLogger(__name__)
STATE = {"on": env_switch("OCTAVO_FP8_SILU_GEMV", default=False)}  # installed wrappers read it per call


def _on() -> bool:
    return STATE["on"]


@triton.jit
def _pair_gemv(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, n, nm, K, stride_wn, QUANT_X: tl.constexpr,
               PRE_Q: tl.constexpr, EVEN: tl.constexpr, SOFT_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr, PDL_W: tl.constexpr, ACC_SPLIT: tl.constexpr,
               X2D: tl.constexpr):
    """fp8_gemv's one-row kernel body for the ``BLOCK_N`` weight rows ``n`` (any rows, e.g. a gate row and its up
    row): the same loads, ``_gemv_step``, accumulator and rounding, so each output has the GEMV's bits when the tile
    is the GEMV's. Returns the outputs rounded to ``y_ptr``'s dtype, as fp32 ``[BLOCK_N]``."""
    rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn
    ws = tl.load(ws_ptr + n, mask=nm, other=0.0)
    if PDL_W and EVEN:
        w_first = tl.load(rows + tl.arange(0, BLOCK_K)[None, :])
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        if PDL_W:
            tl.extra.cuda.gdc_launch_dependents()
    s_x = 1.0
    if PRE_Q:
        s_x = tl.load(xs_ptr)
    if QUANT_X:  # the row's per-token scale (fp8_gemv.py)
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            kk = k + tl.arange(0, BLOCK_K)
            v = tl.load(x_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(v))
        s_x = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), 448.0), 1e-12)
    if ACC_SPLIT > 0:
        acc = tl.zeros([BLOCK_N, BLOCK_K // ACC_SPLIT], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k0 = 0
    if PDL_W and EVEN:
        acc = _gemv_step(acc, w_first, x_ptr, tl.arange(0, BLOCK_K), s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D,
                         False, ACC_SPLIT, BLOCK_N, BLOCK_K)
        k0 = BLOCK_K
    for k in range(k0, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        if EVEN:
            w = tl.load(rows + kk[None, :])
        else:
            w = tl.load(rows + kk[None, :], mask=nm[:, None] & (kk[None, :] < K), other=0.0)
        acc = _gemv_step(acc, w, x_ptr, kk, s_x, K, QUANT_X, PRE_Q, EVEN, SOFT_FP8, X2D, False, ACC_SPLIT,
                         BLOCK_N, BLOCK_K)
    return (tl.sum(acc, 1) * s_x * ws).to(y_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _halves(y, BLOCK_N: tl.constexpr):
    """``y [BLOCK_N]`` -> its first and second halves (``[BLOCK_N // 2]`` each)."""
    return tl.split(tl.trans(tl.reshape(y, [2, BLOCK_N // 2])))


@triton.jit
def _fp8_gemv_silu_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, N_OUT, K, stride_wn, QUANT_X: tl.constexpr,
                          EVEN: tl.constexpr, SOFT_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          USE_PDL: tl.constexpr = False, PDL_W: tl.constexpr = False, ACC_SPLIT: tl.constexpr = 0,
                          X2D: tl.constexpr = False, PRE_Q: tl.constexpr = False):
    """Program ``p`` owns outputs ``[p * BLOCK_N / 2, (p + 1) * BLOCK_N / 2)``: its tile's first half of rows are
    their gate rows, the second half their up rows (session 11: one accumulator over both, so with the gate_up
    GEMV's tile every gate / up value has that GEMV's bits); PDL and the split accumulator as fp8_gemv."""
    r = tl.arange(0, BLOCK_N)
    i = tl.program_id(0) * (BLOCK_N // 2) + (r % (BLOCK_N // 2))
    n = i + tl.where(r >= BLOCK_N // 2, N_OUT, 0)
    g, u = _halves(_pair_gemv(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, n, i < N_OUT, K, stride_wn, QUANT_X,
                              PRE_Q, EVEN, SOFT_FP8, BLOCK_N, BLOCK_K, USE_PDL, PDL_W, ACC_SPLIT, X2D), BLOCK_N)
    elt = y_ptr.dtype.element_ty
    s = (g / (1.0 + tl.exp(-g))).to(elt).to(tl.float32)  # as the SiLU-and-mul kernel rounds
    o = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(y_ptr + o, (s * u).to(elt), mask=o < N_OUT)


def gemv_tile(n: int, k: int, pre: bool, acc_split: int, device=None) -> tuple[int, int, int, int] | None:
    """The one-row GEMV's tile ``(BLOCK_N, BLOCK_K, num_warps, num_stages)`` for an ``[n, k]`` weight and input kind:
    its measured table's (fp8_gemv_tiles) or its autotuner's, if any (a fused kernel with it gives the GEMV's bits)."""
    from octavo.plugins.quant import fp8_gemv, fp8_gemv_tiles

    if device is not None and (tile := fp8_gemv_tiles.table_tile(device, n, k, acc_split)) is not None:
        return tile
    tuner = fp8_gemv._fp8_gemv_tuned_split if acc_split else fp8_gemv._fp8_gemv_tuned
    for key, cfg in tuner.cache.items():
        if key[0] == n and key[1] == k and bool(key[3]) == pre and bool(key[2]) != pre:
            kw = cfg.all_kwargs()
            return kw["BLOCK_N"], kw["BLOCK_K"], kw["num_warps"], kw["num_stages"]
    return None


def _tile(weight, x, x_scale, fused_rows: int, launch: dict, ref) -> tuple[int, int, int, int]:
    """The tile for a fused one-row call: the unfused GEMV's tuned tile for this weight (tuned here first by one
    unfused call if it has none), so the fused kernel sums every output in the GEMV's order."""
    n, k = weight.shape
    pre = x_scale is not None
    tile = gemv_tile(n, k, pre, launch.get("acc_split", 0), x.device)
    if tile is None:
        ref()
        tile = gemv_tile(n, k, pre, launch.get("acc_split", 0), x.device)
    if tile is None or tile[0] % 2 or fused_rows % (tile[0] // 2):
        raise ValueError(f"fp8 fused GEMV: no usable tuned tile for {tuple(weight.shape)} ({tile})")
    return tile


def _settings(name: str, x, weight, weight_scale, x_scale, out_dtype, fused_rows: int, config, pdl: bool,
              pdl_w: bool, acc_split: int | None) -> tuple[int, bool, tuple[int, ...]]:
    """What both fused one-row GEMVs (this one and fp8_rope_gemv) check and choose before their launch:
    ``acc_split`` (None: the unfused GEMV's, fp8_gemv.ACC_SPLIT) is 0, 8 or 16, PDL only on the compiled kernel,
    the tile (interpreter: ``config`` or (16, 64, 4); compiled: ``config`` or the unfused GEMV's tuned tile, so
    its bits). Returns ``(acc_split, soft, config)``; ``soft``: the Triton interpreter runs it."""
    if acc_split is None:  # the unfused GEMV's (fp8_gemv.ACC_SPLIT)
        from octavo.plugins.quant import fp8_gemv as _g

        acc_split = _g.ACC_SPLIT
    if acc_split not in (0, 8, 16):
        raise ValueError(f"{name}: acc_split={acc_split}: 0, 8 or 16")
    soft = os.environ.get("TRITON_INTERPRET") == "1"
    if pdl and soft:
        raise ValueError(f"{name}: pdl is for the compiled kernel (interpreter)")
    if soft:
        config = config or (16, 64, 4)
    elif config is None:
        from octavo.plugins.quant.fp8_gemv import fp8_gemv

        launch = dict(pdl=pdl, pdl_w=pdl_w, acc_split=acc_split)
        config = _tile(weight, x, x_scale, fused_rows, launch, lambda: fp8_gemv(x, weight, weight_scale,
                                                                                 x_scale=x_scale,
                                                                                 out_dtype=out_dtype, **launch))
    return acc_split, soft, config


def _kernel_args(config, x_scale, soft: bool, even: bool, pdl: bool, pdl_w: bool, acc_split: int) -> dict:
    """The constexprs and launch options both fused kernels take under the same names (``_pair_gemv``'s)."""
    bn, bk, warps, *stages = config
    return dict(QUANT_X=x_scale is None, PRE_Q=x_scale is not None, EVEN=even, SOFT_FP8=soft, BLOCK_N=bn,
                BLOCK_K=bk, num_warps=warps, **({"num_stages": stages[0]} if stages else {}), USE_PDL=pdl,
                PDL_W=pdl and pdl_w and even, ACC_SPLIT=acc_split, X2D=x_scale is not None and _x2d(),
                **({"launch_pdl": True} if pdl else {}))


def fp8_gemv_silu(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  x_scale: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                  config: tuple[int, ...] | None = None, *, pdl: bool = False, pdl_w: bool = False,
                  acc_split: int | None = None) -> torch.Tensor:
    """``silu(g) * u`` of the fp8 GEMV ``[g | u] = x @ W.T`` for one row ``x [1, K]`` (bf16, or e4m3 with
    ``x_scale``) and a merged gate/up e4m3 ``W [2I, K]`` with per-row ``weight_scale``; ``[1, I]``.
    ``config = (BLOCK_N, BLOCK_K, num_warps[, num_stages])``; None: the unfused GEMV's tuned tile (its bits).
    ``pdl`` / ``pdl_w`` / ``acc_split``: as ``fp8_gemv`` (compiled kernel only; the interpreter refuses PDL)."""
    two_i, k = weight.shape
    if x.shape != (1, k) or two_i % 2 or weight.stride(1) != 1:
        raise ValueError(f"fp8_gemv_silu: x {tuple(x.shape)}, weight {tuple(weight.shape)}: one row, [2I, K] row-major")
    if (x_scale is not None) != (x.dtype == torch.float8_e4m3fn):
        raise ValueError("fp8_gemv_silu: an e4m3 x comes with its x_scale, a 16-bit x without")
    i = two_i // 2
    x = x.contiguous()
    acc_split, soft, config = _settings("fp8_gemv_silu", x, weight, weight_scale, x_scale, out_dtype, i, config, pdl,
                                        pdl_w, acc_split)
    y = torch.empty(1, i, dtype=out_dtype, device=x.device)
    ws = weight_scale.reshape(-1)
    bn, bk = config[:2]
    even = not soft and k % bk == 0 and i % (bn // 2) == 0
    _fp8_gemv_silu_kernel[(triton.cdiv(i, bn // 2),)](
        x, x_scale.reshape(-1) if x_scale is not None else ws, weight, ws, y, i, k, weight.stride(0),
        **_kernel_args(config, x_scale, soft, even, pdl, pdl_w, acc_split))
    return y


def _x2d() -> bool:
    from octavo.plugins.quant import fp8_gemv

    return fp8_gemv.X2D


def _launch(gu, device) -> dict:
    """The one-row fp8 GEMV's launch settings for the fused kernel (read per call: benchmarks flip them): PDL and
    its early weight block (fp8_prefetch.gemv_launch; no L2 chain), the split accumulator (fp8_gemv.ACC_SPLIT)."""
    from octavo.plugins.quant import fp8_gemv
    from octavo.plugins.quant.fp8_prefetch import gemv_launch

    launch = gemv_launch(gu.quant_method, device)
    return {"pdl": bool(launch.get("pdl")), "pdl_w": bool(launch.get("pdl_w")),
            "acc_split": fp8_gemv.ACC_SPLIT}  # the unfused GEMV's (the interpreter's too): the same sums


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


def fuse_each(model, mark: str, fusable, key, check, install, what: str, log: logging.Logger) -> int:
    """Wrap every module of ``model`` that ``fusable`` accepts and that is not wrapped yet (``mark`` in its vars)
    with ``install``; once per ``key(module)``, ``check(module, key)`` returns (the fused path's largest difference
    from the unfused one, the unfused output's largest magnitude), and the fused path is used within one bf16
    rounding step; else, or on an error, ``log`` warns (``what`` names the path) and the layer stays unfused."""
    verified: dict[tuple, bool] = {}
    n = 0
    for module in model.modules():
        if mark in vars(module) or not fusable(module):
            continue
        k = key(module)
        if k not in verified:
            try:
                worst, top = check(module, k)
                verified[k] = worst <= 1.6e-2 * top  # one bf16 rounding step
                if not verified[k]:
                    log.warning("%s not used for %s: %.3g from the unfused path", what, k, worst)
            except Exception as e:  # noqa: BLE001 - keep the unfused layers
                log.warning("%s not used for %s: %s: %s", what, k, type(e).__name__, e)
                verified[k] = False
        if verified[k]:
            install(module)
            n += 1
    return n


@torch.inference_mode()
def fuse_fp8_silu_gemv(model: torch.nn.Module, device: torch.device) -> int:
    """Wrap every fusable fp8 MLP of ``model`` (the kernel checked once per weight shape against the unfused
    GEMV + SiLU-and-mul, own and producer quantization, within one bf16 rounding); returns how many."""
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    gen = torch.Generator(device=device).manual_seed(1)

    def check(module, key):
        gu = module.gate_up_proj
        x = torch.randn(1, key[1], generator=gen, device=device).bfloat16()
        want = module.act_fn(gu(x)).float()
        xq, xs = quantize_per_token(x)
        launch = _launch(gu, device)  # the settings the wrapper calls it with
        worst = max(float((got.float() - want).abs().max()) for got in (
            fp8_gemv_silu(x, gu.weight, gu.weight_scale, **launch),
            fp8_gemv_silu(xq, gu.weight, gu.weight_scale, xs, **launch)))
        return worst, float(want.abs().max())

    return fuse_each(model, "_octavo_fp8_silu", _fusable, lambda m: tuple(m.gate_up_proj.weight.shape), check,
                     _install, "fp8 gate/up + SiLU GEMV", logger)
