"""8-bit weight-only with a scale and a zero per group of input columns (GPTQ 8-bit, compressed-tensors W8A16).

Canonical layout (shaped like a dense weight, so fused and tensor-parallel loading is the dense path)::

    qweight int8 [N, K]   scales, zeros float32 [N, K / group]     w = q * s + z

(an unsigned 8-bit code ``u`` with zero point ``zp`` and scale ``s`` is ``q = u - 128``, ``z = s * (128 - zp)``;
a symmetric checkpoint has ``z = 0``). Why not the int8-per-row method: GPTQ's and llm-compressor's 8-bit
checkpoints have a scale per group (and asymmetric zero points), and re-rounding them to one scale per row
would add an error the checkpoint does not have.

Kernels (the weight stays int8 in memory):

- CPU: octavo's fp32 int8 kernel (:func:`octavo.plugins.quant.cpu_kernel.int8_linear`, a scale per group of 32,
  the group scale repeated) plus the zero term ``sum_g z[n, g] * sum_{k in g} x[m, k]``, a ``[m, G] x [G, N]``
  product (1 / group of the main product's work) skipped for symmetric weights. Same fp32 arithmetic as the
  dequantized model.
- CUDA: a Triton dequant-GEMM (:mod:`octavo.plugins.quant.int8_triton`) when Triton is present.
- Elsewhere (no C compiler on CPU, or no Triton on CUDA): the weight is dequantized once at load and the layer
  runs dense, with a warning naming why and the memory cost.
"""

from __future__ import annotations

import importlib.util
import logging

import torch
from torch import nn

from octavo.nn import set_weight_attrs
from octavo.plugins.quant import cpu_kernel
from octavo.quant import LinearMethod

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _param(shape, dtype, **attrs) -> nn.Parameter:
    return set_weight_attrs(nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False), **attrs)


def canonical_int8(u_kn: torch.Tensor, zero_gn: torch.Tensor, scale_gn: torch.Tensor):
    """Unsigned codes ``u [K, N]`` (0..255), integer zero points and scales ``[G, N]`` (``w = s * (u - zp)``,
    contiguous groups of input rows) -> canonical ``(qweight [N, K], scales [N, G], zeros [N, G])``."""
    scales = scale_gn.float()
    zeros = scales * (128 - zero_gn.float())
    return ((u_kn.to(torch.int32) - 128).to(torch.int8).t().contiguous(), scales.t().contiguous(),
            zeros.t().contiguous())


def dequantize_int8_group(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """Canonical int8 group layout -> dense float32 ``[N, K]`` (references, tests and the dense fallback)."""
    g = qweight.shape[1] // scales.shape[1]
    return qweight.float() * scales.repeat_interleave(g, 1) + zeros.repeat_interleave(g, 1)


class Int8GroupMethod(LinearMethod):
    """8-bit weights with a scale and a zero per group of ``group_size`` input columns (-1: one group per row).

    Args:
        group_size: the checkpoint's group (a multiple of 32, or -1 for one group per output row).
        input_perm: the weight's input columns are stored permuted (GPTQ act-order): an ``input_perm [K]``
            parameter, and ``apply`` gathers ``x[:, input_perm]``.
    """

    def __init__(self, group_size: int, input_perm: bool = False) -> None:
        if group_size != -1 and (group_size <= 0 or group_size % cpu_kernel.GROUP):
            raise ValueError(f"8-bit group size {group_size} is not supported: use a multiple of "
                             f"{cpu_kernel.GROUP} or -1 (one group per row)")
        self.group_size, self.input_perm = group_size, input_perm

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        group = input_size if self.group_size == -1 else self.group_size
        if input_size % group or input_size % cpu_kernel.GROUP:
            raise ValueError(f"{layer.prefix}: input size {input_size} (this rank's) is not a multiple of the "
                             f"8-bit group size {group} and of {cpu_kernel.GROUP}")
        n = sum(output_sizes)
        layer.register_parameter("qweight", _param((n, input_size), torch.int8, output_dim=0, input_dim=1))
        layer.register_parameter("scales", _param((n, input_size // group), torch.float32, output_dim=0,
                                                  input_dim=1))
        layer.register_parameter("zeros", _param((n, input_size // group), torch.float32, output_dim=0,
                                                 input_dim=1))
        if self.input_perm:
            if layer.tp_size > 1:
                raise ValueError(f"{layer.prefix}: act-order (desc_act) weights cannot be split for tensor "
                                 "parallelism here; use tensor_parallel_size=1")
            layer.register_parameter("input_perm", _param((input_size,), torch.int64))

    def process_weights_after_loading(self, layer):
        q, k = layer.qweight.data, layer.qweight.shape[1]
        scales, zeros = layer.scales.data, layer.zeros.data
        device = q.device
        if self.input_perm:
            layer.register_buffer("input_perm_index", layer.input_perm.data, persistent=False)
            del layer.input_perm
        has_zeros = bool(torch.any(zeros != 0))
        if device.type == "cpu" and cpu_kernel.library() is not None:
            layer.register_buffer("s32", cpu_kernel.per_32(scales, k), persistent=False)
            if has_zeros:  # [G, N] for the zero term x_groups @ z^T
                layer.register_buffer("zeros_t", zeros.t().contiguous(), persistent=False)
            del layer.scales, layer.zeros
            self.kernel = "cpu"
            return
        if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
            layer.register_buffer("scales_t", scales.t().contiguous(), persistent=False)  # [G, N]
            layer.register_buffer("zeros_t", zeros.t().contiguous(), persistent=False)
            layer.register_buffer("qweight_t", q.t().contiguous(), persistent=False)  # [K, N]
            del layer.qweight, layer.scales, layer.zeros
            self.kernel = "triton"
            return
        why = ("no C compiler for octavo's CPU kernels: " + str(cpu_kernel.unavailable_reason())
               if device.type == "cpu" else f"no int8 group kernel on {device.type} without Triton")
        if why not in _warned:
            _warned.add(why)
            logger.warning("8-bit group-quantized layers run on dequantized weights (%s): 4x the weight memory "
                           "of the int8 weights on CPU", why)
        dense = dequantize_int8_group(q, scales, zeros)
        del layer.qweight, layer.scales, layer.zeros
        layer.register_buffer("dense_weight", dense.to(torch.float32 if device.type == "cpu" else torch.bfloat16),
                              persistent=False)
        self.kernel = "dense"

    def apply(self, layer, x, bias=None):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.input_perm:
            x2 = x2[:, layer.input_perm_index]
        kernel = getattr(self, "kernel", "dense")
        if kernel == "cpu":
            y = cpu_kernel.int8_linear(x2, layer.qweight, layer.s32)
            if hasattr(layer, "zeros_t"):
                groups = layer.zeros_t.shape[0]
                y = y + x2.float().reshape(x2.shape[0], groups, -1).sum(-1) @ layer.zeros_t
        elif kernel == "triton":
            from octavo.plugins.quant.int8_triton import int8_group_matmul

            y = int8_group_matmul(x2, layer.qweight_t, layer.scales_t, layer.zeros_t)
        else:
            y = torch.nn.functional.linear(x2.to(layer.dense_weight.dtype), layer.dense_weight)
        y = y.to(x.dtype).reshape(*shape[:-1], -1)
        return y + bias if bias is not None else y
