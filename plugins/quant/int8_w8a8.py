"""INT8 W8A8: int8 weights and int8 activations multiplied in integers (``torch._int_mm``), CPU and CUDA.

Used by compressed-tensors ``int-quantized`` checkpoints (llm-compressor's ``W8A8`` / ``INT8`` scheme). Why a
separate method: unlike the weight-only kernels, the *activations* are rounded to int8 too, so the product
is an int8 x int8 -> int32 GEMM (oneDNN VNNI / AMX on CPU, cuBLASLt IMMA on CUDA) and the result is
rescaled once per output element::

    y[m, n] = s_x[m] * s_w[n] * (sum_k xq[m, k] * wq[n, k]  -  z_x[m] * sum_k wq[n, k])

- weights: int8 ``[N, K]`` symmetric, a scale per output row (``channel``) or one per tensor (expanded to rows
  at load so the parts of a fused ``qkv_proj`` keep their own);
- activations: dynamic (computed per token, or per tensor, at run time) or static (``input_scale`` and, when
  asymmetric, ``input_zero_point`` from the checkpoint); symmetric or asymmetric (``z_x`` above; the column
  sums of the weight are computed once at load).

Static scales of the parts of one fused layer (q/k/v see the same input) are merged as vLLM does: the largest
scale is used (symmetric); asymmetric parts must agree, else the load fails naming the layer. The whole weight
is never dequantized at run time.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.nn import set_weight_attrs
from octavo.plugins.quant import int8_cpu_kernel
from octavo.quant import LinearMethod

INT8_MIN, INT8_MAX = -128, 127
_CUDA_MIN_ROWS = 17  # cuBLASLt's int8 GEMM in torch._int_mm needs more than 16 rows


def _param(shape, dtype, **attrs) -> nn.Parameter:
    return set_weight_attrs(nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False), **attrs)


def quantize_activations(x: torch.Tensor, per_token: bool, symmetric: bool):
    """Dynamic int8 quantization of ``x [m, K]``: ``(xq int8, scale float32 [m | 1, 1], zero int32 or None)``.

    Symmetric: ``s = amax|x| / 127``, ``xq = round(x / s)`` in [-127, 127]. Asymmetric: ``s = (max - min) / 255``
    with 0 inside the range, ``z = round(-128 - min / s)``, ``xq = round(x / s) + z`` in [-128, 127].
    """
    xf = x.float()
    dims = (-1,) if per_token else (0, 1)
    if symmetric:
        scale = (xf.abs().amax(dim=dims, keepdim=True) / 127.0).clamp(min=1e-10)
        return torch.round(xf / scale).clamp_(-127, 127).to(torch.int8), scale, None
    lo = xf.amin(dim=dims, keepdim=True).clamp(max=0)
    hi = xf.amax(dim=dims, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 255.0).clamp(min=1e-10)
    zero = torch.round(INT8_MIN - lo / scale)
    xq = (torch.round(xf / scale) + zero).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
    return xq, scale, zero.to(torch.int32)


def int8_gemm(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    """``xq [m, K] int8 @ wq[N, K]^T`` -> int32 ``[m, N]`` (exact), through ``torch._int_mm`` on any device."""
    m = xq.shape[0]
    if xq.device.type == "cuda" and (m < _CUDA_MIN_ROWS or m % 8):  # pad rows to the kernel's shapes
        rows = max(_CUDA_MIN_ROWS, m)
        rows = (rows + 7) // 8 * 8
        xq = torch.nn.functional.pad(xq, (0, 0, 0, rows - m))
        return torch._int_mm(xq, wq.t())[:m]
    return torch._int_mm(xq, wq.t())


class Int8W8A8Method(LinearMethod):
    """int8 weights (a scale per output row) times int8 activations (dynamic or static scales).

    Args:
        dynamic: activation scales computed at run time; else ``input_scale`` (and ``input_zero_point`` when
            asymmetric) are read from the checkpoint.
        per_token: dynamic scales per token (row of ``x``); False: one per call (per tensor).
        symmetric: symmetric activation quantization (no activation zero point).
    """

    def __init__(self, dynamic: bool = True, per_token: bool = True, symmetric: bool = True) -> None:
        self.dynamic, self.per_token, self.symmetric = dynamic, per_token, symmetric
        self.fused_static: float | None = None  # set at load when the fused CPU kernel runs this layer
        suffixes = ["weight", "weight_scale"]
        if not dynamic:
            suffixes += ["input_scale"] + ([] if symmetric else ["input_zero_point"])
        self.checkpoint_suffixes = tuple(suffixes)

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        n = sum(output_sizes)
        layer.register_parameter("qweight", _param((n, input_size), torch.int8, output_dim=0, input_dim=1))
        layer.register_parameter("weight_scale", _param((n,), torch.float32, output_dim=0))
        if not self.dynamic:  # the part's scalar, repeated over its rows (fused parts load their own slice)
            layer.register_parameter("input_scale", _param((n,), torch.float32, output_dim=0))
            if not self.symmetric:
                layer.register_parameter("input_zero_point", _param((n,), torch.float32, output_dim=0))

    def convert(self, tensors, module):
        w = tensors["weight"]
        if w.dtype != torch.int8 or w.dim() != 2:
            raise ValueError(f"int8 W8A8 checkpoint: {module}.weight is {w.dtype} {tuple(w.shape)}, not an int8 "
                             "matrix")
        n = w.shape[0]
        out = {"qweight": w, "weight_scale": _rows(tensors["weight_scale"], n, f"{module}.weight_scale")}
        if not self.dynamic:
            out["input_scale"] = _scalar_rows(tensors["input_scale"], n, f"{module}.input_scale")
            if not self.symmetric:
                out["input_zero_point"] = _scalar_rows(tensors["input_zero_point"], n, f"{module}.input_zero_point")
        return out

    def process_weights_after_loading(self, layer):
        w = layer.qweight.data
        if w.device.type == "cuda" and (w.shape[0] % 8 or w.shape[1] % 8):
            raise ValueError(f"{layer.prefix}: int8 W8A8 on CUDA needs input and output sizes that are multiples "
                             f"of 8 (torch._int_mm); this layer is {w.shape[1]} -> {w.shape[0]}")
        if not self.symmetric:  # sum_k wq[n, k], for the activation zero point's term
            layer.register_buffer("weight_sums", w.to(torch.int32).sum(1), persistent=False)
        if not self.dynamic:
            scale = layer.input_scale.data
            if not self.symmetric:
                zero = layer.input_zero_point.data
                if not (torch.all(scale == scale[0]) and torch.all(zero == zero[0])):
                    raise ValueError(f"{layer.prefix}: the fused parts have different static input scales / zero "
                                     "points; asymmetric static activations need one pair per fused layer")
                layer.register_buffer("x_zero", zero[:1].round().to(torch.int32).reshape(1, 1), persistent=False)
                del layer.input_zero_point
            layer.register_buffer("x_scale", scale.max().reshape(1, 1).float(), persistent=False)
            del layer.input_scale
        layer.register_buffer("w_scale", layer.weight_scale.data.float().reshape(1, -1).contiguous(),
                              persistent=False)
        del layer.weight_scale
        # decode rows on CPU: the fused kernel (quantize + VNNI dot + rescale in one call), symmetric schemes
        self.fused_static = None
        if (w.device.type == "cpu" and self.symmetric and (self.per_token or not self.dynamic)
                and int8_cpu_kernel.library() is not None):
            layer.register_buffer("weight_sums_128", int8_cpu_kernel.weight_sums_128(w), persistent=False)
            self.fused_static = 0.0 if self.dynamic else float(layer.x_scale)

    def _quantize(self, layer, x2: torch.Tensor):
        if self.dynamic:
            return quantize_activations(x2, self.per_token, self.symmetric)
        scale = layer.x_scale
        q = torch.round(x2.float() / scale)
        zero = None
        if not self.symmetric:
            zero = layer.x_zero
            q = q + zero
        return q.clamp_(INT8_MIN, INT8_MAX).to(torch.int8), scale, zero

    def apply(self, layer, x, bias=None):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.fused_static is not None and x2.shape[0] <= int8_cpu_kernel.FUSED_MAX_ROWS:
            y = int8_cpu_kernel.w8a8_linear(x2, layer.qweight, layer.w_scale, layer.weight_sums_128,
                                            self.fused_static)
            y = y.to(x.dtype).reshape(*shape[:-1], -1)
            return y + bias if bias is not None else y
        xq, x_scale, x_zero = self._quantize(layer, x2)
        acc = int8_gemm(xq, layer.qweight)  # int32 [m, N], exact
        if x_zero is not None:
            acc = acc - x_zero * layer.weight_sums
        y = acc.float() * (x_scale * layer.w_scale)
        y = y.to(x.dtype).reshape(*shape[:-1], -1)
        return y + bias if bias is not None else y


def _rows(scale: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """A per-tensor or per-row scale -> float32 ``[n]``."""
    s = scale.float().reshape(-1)
    if s.numel() == 1:
        return s.expand(n).contiguous()
    if s.numel() != n:
        raise ValueError(f"{what} has {s.numel()} values; expected 1 (per tensor) or {n} (per output row)")
    return s.contiguous()


def _scalar_rows(value: torch.Tensor, n: int, what: str) -> torch.Tensor:
    if value.numel() != 1:
        raise ValueError(f"{what} has {value.numel()} values; static activation quantization reads one per "
                         "tensor")
    return value.float().reshape(1).expand(n).contiguous()
