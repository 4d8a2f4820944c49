"""``compressed-tensors`` (llm-compressor's format): the W4A16 ``pack-quantized`` scheme, symmetric int4.

Read from ``quantization_config`` (``quant_method: compressed-tensors``, ``format: pack-quantized``, one
config group whose ``weights`` are ``num_bits: 4, type: int, symmetric: true, strategy: group | channel``
and whose ``input_activations`` are null). Per projection on disk::

    weight_packed  int32 [N, K / 8]   nibble j of word c is input column 8c + j, offset-coded (q + 8)
    weight_scale   fp16/bf16 [N, K / group]  (one column for strategy "channel")
    weight_shape   int [2]            (N, K)

``w = s * (stored - 8)``, which is the canonical int4 layout with ``z = 0``: the repack is exact and runs on
the int4 kernels. Not supported (refused at start, naming the scheme): FP8 / INT8 W8A8 (activation
quantization), asymmetric zero points, other bit widths, several config groups.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from octavo.plugins.quant.gptq_awq import unpack_cols
from octavo.plugins.quant.kernels import INT4_GROUP_SIZES, Int4GroupMethod, pick_group_size
from octavo.quant import LinearMethod, Quantizer


class _PackedW4A16(Int4GroupMethod):
    checkpoint_suffixes: ClassVar[tuple[str, ...]] = ("weight_packed", "weight_scale", "weight_shape")

    def __init__(self, group_size: int | None) -> None:  # None: one scale per row ("channel")
        self.checkpoint_group = group_size
        super().__init__(group_size if group_size else 128)

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        if self.checkpoint_group is None:
            self.group_size = pick_group_size(input_size)
        super().create_weights(layer, input_size, output_sizes, params_dtype)

    def convert(self, tensors, module):
        n, k = (int(v) for v in tensors["weight_shape"].reshape(-1).tolist())
        q = unpack_cols(tensors["weight_packed"])[:, :k]  # [N, K] offset-coded
        scales = tensors["weight_scale"].float().reshape(n, -1)  # [N, G]
        repeat = (k // scales.shape[1]) // self.group_size  # > 1 for "channel" scales
        scales = scales.repeat_interleave(repeat, 1).contiguous()
        return {"qweight": q.contiguous(), "scales": scales, "zeros": torch.zeros_like(scales)}


class CompressedTensorsQuantizer(Quantizer):
    """llm-compressor checkpoints: W4A16 ``pack-quantized`` (symmetric, group or channel) on the int4 kernels."""

    name: ClassVar[str] = "compressed-tensors"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def __init__(self, group_size: int | None, ignore: list[str]) -> None:
        self.group_size, self.ignore = group_size, ignore

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> CompressedTensorsQuantizer:
        fmt = hf_quant_config.get("format")
        groups = hf_quant_config.get("config_groups") or {}
        if fmt != "pack-quantized" or len(groups) != 1:
            raise ValueError(f"compressed-tensors format={fmt!r} with {len(groups)} config groups: octavo reads "
                             "one W4A16 pack-quantized group (FP8 / INT8 W8A8 are not supported yet)")
        group = next(iter(groups.values()))
        w, act = group.get("weights") or {}, group.get("input_activations")
        strategy = w.get("strategy")
        ok = (w.get("num_bits") == 4 and w.get("type") == "int" and w.get("symmetric") and act is None
              and strategy in ("group", "channel")
              and (strategy == "channel" or w.get("group_size") in INT4_GROUP_SIZES))
        if not ok:
            raise ValueError(f"compressed-tensors scheme weights={w}, input_activations={act}: octavo reads "
                             f"symmetric 4-bit int weights, group ({INT4_GROUP_SIZES}) or channel, no activation "
                             "quantization")
        return cls(w.get("group_size") if strategy == "group" else None, list(hf_quant_config.get("ignore") or []))

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        if any(layer_prefix.endswith(name) or layer_prefix == name for name in self.ignore):
            return None
        return _PackedW4A16(self.group_size)
