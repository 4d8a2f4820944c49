"""The two weight-only linear methods every integer quantizer ends in: int4 with group scales, int8 per row.

Each format (GGUF blocks, GPTQ, AWQ, a dense checkpoint quantized at load) converts its on-disk tensors into
one canonical layout that is shaped like a dense weight, so fused and tensor-parallel loading is the dense
code path (``output_dim=0``, ``input_dim=1``):

    int4:  qweight uint8 [N, K] (0..15)   scales, zeros float32 [N, K / group]     w = (q - 8) * s + z
    int8:  qweight int8  [N, K]           scales float32 [N]                       w = q * s

After loading, the weights are repacked once for a kernel that keeps them packed in memory:

- CPU: octavo's fp32 kernels (:mod:`octavo.plugins.quant.cpu_kernel`, compiled on first use): fp32
  activations, scales and accumulation, so the result equals fp32 arithmetic on the dequantized weights
  to fp32 rounding. torch's CPU int4 kernel needs bf16 activations, scales and output, and those roundings
  flipped greedy answers of the embedded model (docs/quantization.md); it is used only when no C compiler
  is available, with a warning that names the reason.
- CUDA: torch's tinygemm (``_weight_int4pack_mm``) and ``_weight_int8pack_mm`` with bf16 activations.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from octavo.nn import set_weight_attrs
from octavo.plugins.quant import cpu_kernel
from octavo.quant import LinearMethod

logger = logging.getLogger(__name__)

#: group sizes the tinygemm int4 kernels accept.
INT4_GROUP_SIZES = (32, 64, 128, 256)
_COMPUTE_DTYPE = torch.bfloat16


def pick_group_size(input_size: int, wanted: int | None = None) -> int:
    """The largest of 128, 64, 32 that divides ``input_size`` (or ``wanted`` if it does); ValueError if none."""
    for g in ((wanted,) if wanted else ()) + (128, 64, 32):
        if g in INT4_GROUP_SIZES and input_size % g == 0:
            return g
    raise ValueError(f"input size {input_size} is not a multiple of 32; the int4 kernels need groups of "
                     f"{INT4_GROUP_SIZES}")


def quantize_int4(w: torch.Tensor, group_size: int, sym: bool = False):
    """Round a dense ``[N, K]`` weight to 4 bits per group: ``(qweight uint8, scales, zeros)`` canonical."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group_size, group_size)
    if sym:
        scale = (groups.abs().amax(-1) / 7.5).clamp(min=1e-10)  # q - 8 in [-8, 7], centred: [-7.5, 7.5]
        q = torch.clamp(torch.round(groups / scale[..., None] + 8), 0, 15)
        zero = torch.zeros_like(scale)
    else:
        lo, hi = groups.amin(-1), groups.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-10)
        q = torch.clamp(torch.round((groups - lo[..., None]) / scale[..., None]), 0, 15)
        zero = lo + 8 * scale  # (q - 8) * s + z == q * s + lo
    return q.reshape(n, k).to(torch.uint8), scale, zero


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """Canonical int4 -> dense float32 ``[N, K]`` (references and tests)."""
    g = qweight.shape[1] // scales.shape[1]
    return (qweight.float() - 8) * scales.repeat_interleave(g, 1) + zeros.repeat_interleave(g, 1)


def quantize_int8(w: torch.Tensor):
    """Round a dense ``[N, K]`` weight to int8 with one symmetric scale per output row."""
    scale = (w.float().abs().amax(1) / 127).clamp(min=1e-10)
    return torch.clamp(torch.round(w.float() / scale[:, None]), -127, 127).to(torch.int8), scale


_warned: list[bool] = []


def _fp32_kernel(layer, k: int) -> bool:
    """Whether ``layer`` (on CPU, input size ``k``) runs octavo's fp32 kernels; warns once when it cannot."""
    if layer_device(layer).type != "cpu" or k % cpu_kernel.GROUP:
        return False
    if cpu_kernel.library() is not None:
        return True
    if not _warned:
        _warned.append(True)
        logger.warning("octavo's fp32 CPU quantization kernels are unavailable (%s): using torch's int4/int8 "
                       "kernels with bf16 activations and scales, which are less accurate (greedy answers can "
                       "differ from the fp32 model); install a C compiler or pass quantization='none' for GGUF",
                       cpu_kernel.unavailable_reason())
    return False


def layer_device(layer) -> torch.device:
    return next(t.device for t in layer.parameters())


def _param(shape, dtype, **attrs) -> nn.Parameter:
    return set_weight_attrs(nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False), **attrs)


_TINYGEMM_K_MULTIPLE = 128  # CUDA's _convert_weight_to_int4pack: K in whole tiles of 8 x 16 packed bytes
_dense_fallback_warned: set[str] = set()


def _warn_dense_fallback(prefix: str, k: int) -> None:
    model = prefix.split(".")[0] if prefix else "model"
    if model not in _dense_fallback_warned:
        _dense_fallback_warned.add(model)
        logger.warning("int4 weights with input size %d (layer %s) do not fit the GPU int4 kernel (K must be a "
                       "multiple of %d): such layers run on dequantized bf16 weights", k, prefix,
                       _TINYGEMM_K_MULTIPLE)


class Int4GroupMethod(LinearMethod):
    """4-bit weights with a scale and a zero per group of ``group_size`` input columns.

    Args:
        group_size: one of :data:`INT4_GROUP_SIZES`.
        input_perm: the weight's input columns are stored in a permuted order (GPTQ act-order); the layer
            then has an ``input_perm [K]`` parameter and ``apply`` gathers ``x[:, input_perm]``.
    """

    #: True: CPU rows may run with int8 activations, every row count (cpu_kernel's ``act8``; GGUF sets it, see
    #: docs/quantization.md "int8 activations"); False keeps fp32 activations.
    int8_activations = False

    def __init__(self, group_size: int, input_perm: bool = False) -> None:
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"int4 group size {group_size} is not one of {INT4_GROUP_SIZES}")
        self.group_size = group_size
        self.input_perm = input_perm

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        n, groups = sum(output_sizes), input_size // self.group_size
        if input_size % self.group_size:
            raise ValueError(f"{layer.prefix}: input size {input_size} (this rank's) is not a multiple of the "
                             f"group size {self.group_size}")
        layer.register_parameter("qweight", _param((n, input_size), torch.uint8, output_dim=0, input_dim=1))
        layer.register_parameter("scales", _param((n, groups), torch.float32, output_dim=0, input_dim=1))
        layer.register_parameter("zeros", _param((n, groups), torch.float32, output_dim=0, input_dim=1))
        if self.input_perm:
            if layer.tp_size > 1:
                raise ValueError(f"{layer.prefix}: act-order (desc_act) weights cannot be split for tensor "
                                 "parallelism here; use tensor_parallel_size=1")
            layer.register_parameter("input_perm", _param((input_size,), torch.int64))

    def process_weights_after_loading(self, layer):
        q, device = layer.qweight.data, layer.qweight.device
        if _fp32_kernel(layer, q.shape[1]):  # w = q * s + (z - 8 s), scales per group of 32
            k = q.shape[1]
            layer.register_buffer("w4", cpu_kernel.pack_int4(q), persistent=False)
            layer.register_buffer("s32", cpu_kernel.per_32(layer.scales.data, k), persistent=False)
            layer.register_buffer("z32", cpu_kernel.per_32(layer.zeros.data - 8 * layer.scales.data, k),
                                  persistent=False)
            del layer.qweight, layer.scales, layer.zeros
            self._move_perm(layer)
            return
        if device.type != "cpu" and q.shape[1] % _TINYGEMM_K_MULTIPLE:
            # CUDA tinygemm packs K in tiles of 128 (e.g. SmolLM2's K = 576 is not): this layer runs on its
            # dequantized weight instead, said once per model so the memory cost is not a surprise.
            _warn_dense_fallback(layer.prefix, q.shape[1])
            dense = dequantize_int4(q, layer.scales.data, layer.zeros.data)
            if self.input_perm:  # stored column j is input column input_perm[j]: back to input order
                dense = torch.empty_like(dense).index_copy_(1, layer.input_perm.data, dense)
                del layer.input_perm
            del layer.qweight, layer.scales, layer.zeros
            layer.register_buffer("dense_weight", dense.to(_COMPUTE_DTYPE), persistent=False)
            return
        scales_zeros = torch.stack([layer.scales.data.t(), layer.zeros.data.t()], -1)  # [K / group, N, 2]
        if device.type == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 2)
        else:  # CUDA tinygemm: two nibbles per byte, even column in the high nibble
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).contiguous(), 8)
        del layer.qweight, layer.scales, layer.zeros
        layer.register_buffer("packed_weight", packed, persistent=False)
        layer.register_buffer("scales_zeros", scales_zeros.to(_COMPUTE_DTYPE).contiguous(), persistent=False)
        self._move_perm(layer)

    def _move_perm(self, layer):
        if self.input_perm:
            perm = layer.input_perm.data
            del layer.input_perm
            layer.register_buffer("input_perm_index", perm, persistent=False)

    def apply(self, layer, x, bias=None):
        shape = x.shape
        if hasattr(layer, "w4"):  # fp32 CPU kernel
            x2 = x.reshape(-1, shape[-1])
            if self.input_perm:
                x2 = x2[:, layer.input_perm_index]
            y = cpu_kernel.int4_linear(x2, layer.w4, layer.s32, layer.z32, act8=self.int8_activations)
            y = y.to(x.dtype).reshape(*shape[:-1], -1)
            return y + bias if bias is not None else y
        if hasattr(layer, "dense_weight"):  # a shape the GPU int4 kernel cannot pack (see above)
            y = torch.nn.functional.linear(x.to(layer.dense_weight.dtype), layer.dense_weight).to(x.dtype)
            return y + bias if bias is not None else y
        x2 = x.reshape(-1, shape[-1]).to(_COMPUTE_DTYPE)  # [m, K]
        if self.input_perm:
            x2 = x2[:, layer.input_perm_index]
        if x2.device.type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, layer.packed_weight, self.group_size,
                                                           layer.scales_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm(x2, layer.packed_weight, self.group_size, layer.scales_zeros)
        y = y.to(x.dtype).reshape(*shape[:-1], -1)  # [..., N]
        return y + bias if bias is not None else y


class Int8RowMethod(LinearMethod):
    """8-bit weights with one scale per output row (``_weight_int8pack_mm``)."""

    int8_activations = False  # see Int4GroupMethod

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        n = sum(output_sizes)
        layer.register_parameter("qweight", _param((n, input_size), torch.int8, output_dim=0, input_dim=1))
        layer.register_parameter("scales", _param((n,), torch.float32, output_dim=0))

    def process_weights_after_loading(self, layer):
        if _fp32_kernel(layer, layer.qweight.shape[1]):  # the row scale repeated per group of 32
            k = layer.qweight.shape[1]
            layer.register_buffer("s32", layer.scales.data.float()[:, None].expand(-1, k // 32).contiguous(),
                                  persistent=False)
            return
        layer.scales.data = layer.scales.data.to(_COMPUTE_DTYPE)

    def apply(self, layer, x, bias=None):
        shape = x.shape
        if hasattr(layer, "s32"):  # fp32 CPU kernel
            y = cpu_kernel.int8_linear(x.reshape(-1, shape[-1]), layer.qweight, layer.s32, act8=self.int8_activations)
            y = y.to(x.dtype).reshape(*shape[:-1], -1)
            return y + bias if bias is not None else y
        x2 = x.reshape(-1, shape[-1]).to(_COMPUTE_DTYPE)  # [m, K]
        y = torch.ops.aten._weight_int8pack_mm(x2, layer.qweight, layer.scales)
        y = y.to(x.dtype).reshape(*shape[:-1], -1)  # [..., N]
        return y + bias if bias is not None else y


class Int8LMHeadMethod(Int8RowMethod):
    """Logits from an int8 copy of the LM head (the dense weight stays for a tied embedding's lookup).

    On CPU with the fp32 kernels the copy has a scale per group of 32 inputs: exact for a Q8_0 head (whose
    blocks are 32 int8 values and a scale, so the largest |q| of each block is 127 and ``amax / 127`` is
    its scale), and half an int8 step of the group's largest weight otherwise. Elsewhere, one scale per row.
    """

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        raise TypeError("Int8LMHeadMethod quantizes an existing head in process_weights_after_loading")

    def process_weights_after_loading(self, layer):
        w = layer.weight.data
        if _fp32_kernel(layer, w.shape[1]):
            groups = w.float().reshape(w.shape[0], -1, cpu_kernel.GROUP)  # [N, K / 32, 32]
            scale = (groups.abs().amax(-1) / 127).clamp(min=1e-30)
            q = torch.clamp(torch.round(groups / scale[..., None]), -127, 127).to(torch.int8)
            layer.register_buffer("logits_q8", q.reshape(w.shape).contiguous(), persistent=False)
            layer.register_buffer("logits_s32", scale.contiguous(), persistent=False)
            return
        qweight, scales = quantize_int8(w)
        layer.register_buffer("logits_qweight", qweight, persistent=False)
        layer.register_buffer("logits_scales", scales.to(_COMPUTE_DTYPE), persistent=False)

    def apply(self, layer, x, bias=None):
        shape = x.shape
        if hasattr(layer, "logits_q8"):  # fp32 CPU kernel
            y = cpu_kernel.int8_linear(x.reshape(-1, shape[-1]), layer.logits_q8, layer.logits_s32,
                                       act8=self.int8_activations)
            y = y.reshape(*shape[:-1], -1)  # [..., vocab]
            return y + bias if bias is not None else y
        x2 = x.reshape(-1, shape[-1]).to(_COMPUTE_DTYPE)  # [m, hidden]
        y = torch.ops.aten._weight_int8pack_mm(x2, layer.logits_qweight, layer.logits_scales)
        y = y.float().reshape(*shape[:-1], -1)  # [..., vocab]
        return y + bias if bias is not None else y
