"""``int8`` and ``int4``: weight-only quantization of a dense checkpoint while it loads (CPU and CUDA).

``quantization="int8"`` rounds each linear weight to int8 with one scale per output row;
``quantization="int4"`` to 4 bits with a scale and zero per group of input columns (``group_size`` from
the config, default the largest of 128 / 64 / 32 that divides the layer's input size; ``sym`` default
False). Each projection is quantized as its dense tensor streams in, so the dense model never exists
in memory. Embeddings and the LM head stay dense (they are not linear layers).
"""

from __future__ import annotations

from typing import Any, ClassVar

from octavo.plugins.quant.kernels import (
    Int4GroupMethod,
    Int8RowMethod,
    pick_group_size,
    quantize_int4,
    quantize_int8,
)
from octavo.quant import LinearMethod, Quantizer


class _OnlineInt8(Int8RowMethod):
    def convert(self, tensors, module):
        qweight, scales = quantize_int8(tensors["weight"])
        return {"qweight": qweight, "scales": scales}


class _OnlineInt4(Int4GroupMethod):
    def __init__(self, group_size: int | None, sym: bool) -> None:
        self.wanted, self.sym = group_size, sym
        self.group_size, self.input_perm = 0, False

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        self.group_size = pick_group_size(input_size, self.wanted)
        super().create_weights(layer, input_size, output_sizes, params_dtype)

    def convert(self, tensors, module):
        qweight, scales, zeros = quantize_int4(tensors["weight"], self.group_size, self.sym)
        return {"qweight": qweight, "scales": scales, "zeros": zeros}


class Int8Quantizer(Quantizer):
    """int8 weight-only, per-output-row scales, ``_weight_int8pack_mm`` (AVX-512 VNNI / AMX on CPU)."""

    name: ClassVar[str] = "int8"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    quantizes_dense: ClassVar[bool] = True
    reads_checkpoint: ClassVar[bool] = False

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> Int8Quantizer:
        return cls()

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        return _OnlineInt8()


class Int4Quantizer(Quantizer):
    """int4 weight-only, group-wise asymmetric by default, torch's tinygemm int4 kernels."""

    name: ClassVar[str] = "int4"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    quantizes_dense: ClassVar[bool] = True
    reads_checkpoint: ClassVar[bool] = False

    def __init__(self, group_size: int | None = None, sym: bool = False) -> None:
        self.group_size, self.sym = group_size, sym

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> Int4Quantizer:
        unknown = set(hf_quant_config) - {"quant_method", "group_size", "sym"}
        if unknown:
            raise ValueError(f"int4 quantization config has unknown keys {sorted(unknown)}; it reads group_size "
                             "and sym")
        return cls(hf_quant_config.get("group_size"), bool(hf_quant_config.get("sym", False)))

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        return _OnlineInt4(self.group_size, self.sym)
