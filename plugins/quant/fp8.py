"""``fp8``: W8A8 FP8 (e4m3) linear layers for GPUs with FP8 tensor cores (Hopper / Ada, compute >= 8.9).

Weights are e4m3 with one scale per output row; activations are quantized per token at run time
(dynamic scales: one fused Triton kernel, plugins/quant/fp8_triton.py, or torch ops when Triton is missing or
``OCTAVO_FP8_FUSED_QUANT=0``) and multiplied with ``torch._scaled_mm`` (row-wise scales, bf16 output). Inputs
of one row (batch-1 decode; ``OCTAVO_FP8_GEMV_MAX_M=0`` turns it off) take one Triton GEMV instead
that quantizes the activations itself and applies both scales (plugins/quant/fp8_gemv.py): same W8A8
arithmetic, one launch, and all SMs streaming weights, where ``_scaled_mm``'s tiles leave most idle at one
row. The GEMV is checked once per weight shape against ``_scaled_mm`` on the device at load (and tuned
there, outside any CUDA-graph capture); a mismatch keeps ``_scaled_mm`` with a warning. Above the GEMV's
rows, an input made by RMSNorm or SiLU-and-mul arrives already quantized by that kernel (fp8_fused.py); 2-64
rows take the tensor-core GEMV where this card has a measured, load-checked tile (fp8_smallm.py). Two sources:

- a dense bf16/fp16 checkpoint with ``quantization="fp8"``: each weight is quantized as it streams in;
- a pre-quantized checkpoint (``quantization_config.quant_method == "fp8"``, vLLM / llm-compressor style):
  ``weight`` (float8_e4m3fn ``[N, K]``) and ``weight_scale`` (per tensor or per row), dynamic activations.
  A per-tensor scale is expanded to rows at load, so fused ``qkv_proj`` parts keep their own scales.

CPU has no FP8 matmul: the quantizer reports itself unavailable there and the loader refuses it at start.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Any, ClassVar

import torch
from torch import nn

from octavo.env_flags import env_switch
from octavo.nn import set_weight_attrs
from octavo.platform import Availability
from octavo.quant import LinearMethod, Quantizer

FP8_MAX = 448.0  # float8_e4m3fn
logger = logging.getLogger(__name__)
_GEMV_VERIFIED: dict[tuple, bool] = {}  # (N, K, has bias, dtype) -> the GEMV matched _scaled_mm on this device


def _gemv_max_m() -> int | None:
    """Rows up to which a GEMV replaces ``_scaled_mm`` (``OCTAVO_FP8_GEMV_MAX_M``; 0 = never; None = unset: one
    row, or ``_TC_DEFAULT_ROWS`` on the tensor-core GEMV). Above 1 only the tensor-core GEMV serves (one weight
    read for all rows); the CUDA-core kernel's several-row variant measured slower than ``_scaled_mm`` on H100."""
    raw = os.environ.get("OCTAVO_FP8_GEMV_MAX_M", "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"OCTAVO_FP8_GEMV_MAX_M={raw!r} is not an integer (rows; 0 turns the fp8 GEMV off)") from None
    if not 0 <= value <= 16:
        raise ValueError(f"OCTAVO_FP8_GEMV_MAX_M={value}: 0 (off) to 16 rows (above 1: the tensor-core GEMV only)")
    return value


# Hopper's fast fp8 accumulation in _scaled_mm (no periodic promotion of the tensor cores' accumulator to fp32). On
# H100 5-18 % faster at 256-512 rows (gate_up 0.113 -> 0.093 ms at 512) with 4-8e-3 error vs float64 there (exact:
# 2.5e-3), but at ONE row of the qkv shape it was 7.3e-2 from the exact GEMV (session 6 batch 2). Session 8: on by
# default for calls of >= FAST_ACCUM_MIN_ROWS rows only (the big-batch decode and prefill GEMMs; vLLM's CUTLASS fp8
# GEMMs accumulate this way too), exact below. OCTAVO_FP8_FAST_ACCUM=1: every call; 0: never.
def fast_accum_from_env() -> tuple[bool, int]:
    """``(FAST_ACCUM, FAST_ACCUM_MIN_ROWS)`` from ``OCTAVO_FP8_FAST_ACCUM``: unset (False, 256), 1 (True, 256), 0
    (False, 0 = never); anything else is refused."""
    on = env_switch("OCTAVO_FP8_FAST_ACCUM", default=False)
    return on, 0 if os.environ.get("OCTAVO_FP8_FAST_ACCUM", "").strip() == "0" else 256


FAST_ACCUM, FAST_ACCUM_MIN_ROWS = fast_accum_from_env()


def use_fast_accum(rows: int, on_cuda: bool, exact: bool) -> bool:
    """Whether a ``_scaled_mm`` call of ``rows`` rows takes fast accumulation (never for ``exact`` checks)."""
    if exact or not on_cuda:
        return False
    return FAST_ACCUM or (FAST_ACCUM_MIN_ROWS > 0 and rows >= FAST_ACCUM_MIN_ROWS)
_TC_DEFAULT_ROWS = 1  # rows the tensor-core GEMV takes by default (docs/performance.md, "FP8 ... session 5")
_WARNED: set = set()


def _gemv_kernel() -> str:
    """``OCTAVO_FP8_GEMV_KERNEL``: which one-row GEMV runs. ``tc`` = the tensor-core GEMV (fp8_gemv_tc.py) for
    every shape (its measured tile where fp8_configs/gemv_tc.json has one for this card); ``cuda`` = the
    CUDA-core GEMV (fp8_gemv.py); ``auto`` (default) = the tensor-core GEMV where this card has a measured tile."""
    raw = os.environ.get("OCTAVO_FP8_GEMV_KERNEL", "").strip() or "auto"
    if raw not in ("auto", "tc", "cuda"):
        raise ValueError(f"OCTAVO_FP8_GEMV_KERNEL={raw!r}: one of auto, tc, cuda")
    return raw


def _fused_quant() -> bool:
    return env_switch("OCTAVO_FP8_FUSED_QUANT", default=True) and importlib.util.find_spec("triton") is not None


def quantize_fp8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> (float8_e4m3fn weight, float32 scale per row)."""
    scale = (w.float().abs().amax(1) / FP8_MAX).clamp(min=1e-12)
    return (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


class _FP8Method(LinearMethod):
    def __init__(self, prequantized: bool) -> None:
        self.prequantized = prequantized
        self.checkpoint_suffixes = ("weight", "weight_scale") if prequantized else ("weight",)

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        n = sum(output_sizes)
        weight = nn.Parameter(torch.empty(n, input_size, dtype=torch.float8_e4m3fn), requires_grad=False)
        scale = nn.Parameter(torch.empty(n, dtype=torch.float32), requires_grad=False)
        layer.register_parameter("weight", set_weight_attrs(weight, output_dim=0, input_dim=1))
        layer.register_parameter("weight_scale", set_weight_attrs(scale, output_dim=0))

    def convert(self, tensors, module):
        w = tensors["weight"]
        if not self.prequantized:
            weight, scale = quantize_fp8_rows(w)
            return {"weight": weight, "weight_scale": scale}
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f"fp8 checkpoint: {module}.weight is {w.dtype}, not float8_e4m3fn")
        scale = tensors["weight_scale"].float().reshape(-1)
        if scale.numel() == 1:
            scale = scale.expand(w.shape[0])
        elif scale.numel() != w.shape[0]:
            raise ValueError(f"fp8 checkpoint: {module}.weight_scale has {scale.numel()} values; expected 1 "
                             f"(per tensor) or {w.shape[0]} (per row)")
        return {"weight": w, "weight_scale": scale.contiguous()}

    def process_weights_after_loading(self, layer):
        layer.weight_scale.data = layer.weight_scale.data.reshape(1, -1).contiguous()  # [1, N]
        self.fused = layer.weight.device.type == "cuda" and _fused_quant()
        want = _gemv_max_m()
        self.gemv_max_m = 0 if not self.fused or want == 0 else 1
        self.gemv_pre_ok = False  # the GEMV may take an input its producer already quantized
        self.gemv_tc = None  # (dot_fp8, config) when the tensor-core GEMV serves this shape
        if self.gemv_max_m:
            rows = _TC_DEFAULT_ROWS if want is None else want
            self.gemv_tc = self._tc_choice(layer, _gemv_kernel(), rows)
            if self.gemv_tc is not None:  # checked on both inputs (own quantization and the producer's)
                self.gemv_max_m, self.gemv_pre_ok = rows, True
            else:
                if rows > 1 and want is not None and tuple(layer.weight.shape) not in _WARNED:
                    _WARNED.add(tuple(layer.weight.shape))
                    logger.warning("OCTAVO_FP8_GEMV_MAX_M=%d: the %s weight runs the CUDA-core GEMV (no tensor-core "
                                   "tile for it), which takes one row; %d rows use _scaled_mm",
                                   rows, tuple(layer.weight.shape), rows)
                ok, self.gemv_pre_ok = self._gemv_ok(layer)
                if not ok:
                    self.gemv_max_m = 0
        self.small_m = []  # 2-64 rows on the tensor-core GEMV where this card has a measured tile (fp8_smallm.py)
        if self.fused:
            from octavo.plugins.quant import fp8_smallm

            self.small_m = fp8_smallm.choose(layer, lambda x2, pre, exact: self._scaled_mm(layer, x2, layer.bias,
                                                                                         pre, exact))

    def _tc_choice(self, layer, kernel: str, rows: int = 1):
        """The tensor-core GEMV's (dot_fp8, config) for this shape if ``kernel`` asks for it, it compiles, and it
        matches ``_scaled_mm`` (in-kernel and producer quantization alike); else None (checked once per shape)."""
        if kernel == "cuda":
            return None
        from octavo.plugins.quant.fp8_gemv_tc import fp8_gemv_tc, tc_config

        n, k = layer.weight.shape
        choice = tc_config(n, k, torch.cuda.get_device_name(layer.weight.device))
        if choice is None:
            if kernel == "auto":
                return None
            choice = (True, (16, 512, 4, 3))
        key = ("tc", n, k, layer.bias is not None, choice, rows)
        if key not in _GEMV_VERIFIED:
            from octavo.plugins.quant import fp8_triton

            ok = False
            try:
                worst = 0.0
                with torch.inference_mode():
                    for m in sorted({1, rows}):
                        x = torch.randn(m, k, device=layer.weight.device, dtype=torch.bfloat16)
                        want = self._scaled_mm(layer, x, layer.bias, exact=True).float()
                        xq, xs = fp8_triton.quantize_per_token(x)
                        ys = (fp8_gemv_tc(x, layer.weight, layer.weight_scale, layer.bias, config=choice[1],
                                          dot_fp8=choice[0]),
                              fp8_gemv_tc(xq, layer.weight, layer.weight_scale, layer.bias, x_scale=xs,
                                          out_dtype=torch.bfloat16, config=choice[1], dot_fp8=choice[0]))
                        worst = max(worst, *(float((y.float() - want).abs().max()
                                                   / want.abs().max().clamp(min=1e-30)) for y in ys))
                ok = worst < 2e-2  # a rounding step of the output dtype, not a wrong product
                if not ok:
                    logger.warning("fp8 tensor-core GEMV not used for %s: %.3g from _scaled_mm", (n, k), worst)
            except Exception as e:  # noqa: BLE001 - fall back to the CUDA-core GEMV
                logger.warning("fp8 tensor-core GEMV not used for %s: %s: %s", (n, k), type(e).__name__, e)
            _GEMV_VERIFIED[key] = ok
        return choice if _GEMV_VERIFIED[key] else None

    def _gemv_ok(self, layer) -> tuple[bool, bool]:
        """Compile and tune the GEMV for this weight shape and check it against ``_scaled_mm`` (once per shape);
        then its variant for already quantized input against the GEMV. Returns (GEMV ok, variant ok)."""
        key = (*layer.weight.shape, layer.bias is not None, self.gemv_max_m)
        if key not in _GEMV_VERIFIED:
            from octavo.plugins.quant import fp8_triton

            def err(got, want):
                return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-30))

            ok = pre_ok = False
            xs_by_rows = {rows: torch.randn(rows, layer.weight.shape[1], device=layer.weight.device,
                                            dtype=torch.bfloat16) for rows in sorted({1, self.gemv_max_m})}
            try:  # the one-row kernel and the several-rows one vs _scaled_mm
                from octavo.plugins.quant.fp8_gemv import fp8_gemv

                with torch.inference_mode():
                    worst = max(err(fp8_gemv(x, layer.weight, layer.weight_scale, layer.bias),
                                    self._scaled_mm(layer, x, layer.bias, exact=True)) for x in xs_by_rows.values())
                ok = worst < 2e-2  # a rounding step of the output dtype, not a wrong product
                if not ok:
                    logger.warning("fp8 GEMV not used for %s: %.3g from _scaled_mm (relative)", key[:2], worst)
            except Exception as e:  # noqa: BLE001 - keep _scaled_mm for a shape the kernel cannot take
                logger.warning("fp8 GEMV not used for %s: %s: %s", key[:2], type(e).__name__, e)
            if ok:
                try:  # the variant for already quantized input vs the GEMV itself
                    with torch.inference_mode():
                        worst = 0.0
                        for x in xs_by_rows.values():
                            xq, xs = fp8_triton.quantize_per_token(x)
                            worst = max(worst, err(fp8_gemv(xq, layer.weight, layer.weight_scale, layer.bias,
                                                            x_scale=xs),
                                                   fp8_gemv(x, layer.weight, layer.weight_scale, layer.bias)))
                    pre_ok = worst < 2e-2
                    if not pre_ok:
                        logger.warning("fp8 GEMV on prequantized input not used for %s: %.3g", key[:2], worst)
                except Exception as e:  # noqa: BLE001 - the GEMV quantizes its input itself
                    logger.warning("fp8 GEMV on prequantized input not used for %s: %s: %s", key[:2],
                                   type(e).__name__, e)
            _GEMV_VERIFIED[key] = (ok, pre_ok)
        return _GEMV_VERIFIED[key]

    def apply(self, layer, x, bias=None):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [m, K]
        pre = getattr(x, "_octavo_fp8", None)  # quantized by the norm / SiLU kernel that made x (fp8_fused.py)
        if pre is not None and pre[0].shape != x2.shape:
            pre = None
        if x2.shape[0] <= getattr(self, "gemv_max_m", 0) and x2.shape[0]:
            tc = getattr(self, "gemv_tc", None)
            if tc is not None:  # the tensor-core GEMV (fp8_gemv_tc.py): in-kernel or producer quantization
                from octavo.plugins.quant.fp8_gemv_tc import fp8_gemv_tc

                if pre is not None:
                    y = fp8_gemv_tc(pre[0], layer.weight, layer.weight_scale, bias, x_scale=pre[1],
                                    out_dtype=x.dtype, config=tc[1], dot_fp8=tc[0])
                else:
                    y = fp8_gemv_tc(x2, layer.weight, layer.weight_scale, bias, config=tc[1], dot_fp8=tc[0])
                return y.reshape(*shape[:-1], -1)
            from octavo.plugins.quant.fp8_gemv import fp8_gemv
            from octavo.plugins.quant.fp8_prefetch import gemv_launch

            launch = gemv_launch(self, x2.device, tuple(layer.weight.shape)) if x2.shape[0] == 1 else {}  # L2 prefetch chain, PDL
            if x2.shape[0] == 1 and getattr(layer, "_octavo_norm_tail", None) is not None:
                from octavo.plugins.quant import fp8_gemv_norm

                if fp8_gemv_norm.STATE["on"]:  # launched by the norm this output goes to (fp8_gemv_norm.py)
                    y = fp8_gemv_norm.deferred(layer, x2, pre if self.gemv_pre_ok else None, launch)
                    return y if x.dim() == 2 else fp8_gemv_norm.carry(y, y.reshape(*shape[:-1], -1))
            if pre is not None and self.gemv_pre_ok:
                y = fp8_gemv(pre[0], layer.weight, layer.weight_scale, bias, x_scale=pre[1], out_dtype=x.dtype,
                             **launch)
            else:
                y = fp8_gemv(x2, layer.weight, layer.weight_scale, bias, **launch)
            return y.reshape(*shape[:-1], -1)
        if getattr(self, "small_m", None) and x2.shape[0] > 1:
            from octavo.plugins.quant import fp8_smallm

            y = fp8_smallm.apply(layer, self.small_m, x2, pre, bias)
            if y is not None:
                return y.reshape(*shape[:-1], -1)
        return self._scaled_mm(layer, x2, bias, pre).reshape(*shape[:-1], -1)

    def _scaled_mm(self, layer, x2, bias, pre=None, exact=False):
        """Per-token quantization (one Triton kernel or torch ops) + ``torch._scaled_mm``; ``x2 [m, K]``.

        ``pre``: ``(e4m3 [m, K], scale [m, 1])`` of ``x2`` already computed by the producing kernel."""
        from octavo.plugins.quant import fp8_triton

        if pre is not None:
            xq, x_scale = pre
        elif getattr(self, "fused", False):  # one kernel: per-token absmax, scale, cast
            xq, x_scale = fp8_triton.quantize_per_token(x2)
        else:
            xq, x_scale = fp8_triton.quantize_per_token_torch(x2)
        fast = {"use_fast_accum": True} if use_fast_accum(xq.shape[0], xq.is_cuda, exact) else {}  # checks: exact
        y = torch._scaled_mm(xq, layer.weight.t(), scale_a=x_scale, scale_b=layer.weight_scale,
                             out_dtype=torch.bfloat16, **fast)
        y = y.to(x2.dtype)  # [m, N]
        return y + bias if bias is not None else y


class FP8Quantizer(Quantizer):
    """W8A8 FP8 e4m3, per-row weight scales, dynamic per-token activation scales, ``torch._scaled_mm``."""

    name: ClassVar[str] = "fp8"
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    quantizes_dense: ClassVar[bool] = True

    def __init__(self, prequantized: bool) -> None:
        self.prequantized = prequantized

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> FP8Quantizer:
        scheme = hf_quant_config.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ValueError(f"fp8 activation_scheme={scheme!r}: octavo computes activation scales per token at "
                             "run time (dynamic) and does not read static input scales")
        if hf_quant_config.get("weight_block_size"):
            raise ValueError("fp8 weight_block_size (block-wise scales) is not supported; per-tensor or per-row")
        return cls(prequantized=set(hf_quant_config) != {"quant_method"})

    def supports(self, platform: Any) -> Availability:
        base = super().supports(platform)
        if not base:
            return Availability(False, f"{base.reason}: FP8 matmuls need a GPU with FP8 tensor cores")
        if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
            return Availability(False, f"fp8 needs compute capability >= 8.9; this GPU has "
                                       f"{torch.cuda.get_device_capability()}")
        return base

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        return _FP8Method(self.prequantized)
