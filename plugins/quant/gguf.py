"""``gguf``: run a llama.cpp GGUF checkpoint with its quantized weights kept quantized.

The loader hands each linear projection's tensor over as :class:`octavo.quant.GGUFBlocks` (raw ggml
blocks) and this quantizer repacks it once for the CPU/CUDA kernels:

    Q4_0, Q4_1, Q4_K        -> int4, groups of 32, exact:   Q4_0  d * (q - 8)        s = d,        z = 0
                                                            Q4_1  d * q + m          s = d,        z = m + 8d
                                                            Q4_K  d*sc * q - dmin*m  s = d*sc,     z = 8s - dmin*m
    Q5_0/1, Q5_K, Q6_K, Q8_0, Q8_K, Q2_K, Q3_K, F16/F32 parts of a mixed fused layer
                            -> int8 per output row, rounded again from the block values (one more rounding,
                               at most half an int8 step of the row's largest weight)

A fused layer (``qkv_proj``) takes int4 only if all its parts are 4-bit types (Q4_K_M files store
``attn_v`` as Q6_K, so their ``qkv_proj`` is int8). Layers whose parts are all plain floats stay dense.
Embeddings and norms are dequantized by the loader as before (they are not linear layers); when the
head (``output``, or the tied ``token_embd``) is quantized in the file, logits come from an int8 copy of
it (rounded per row from the dequantized values).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from octavo.plugins.quant.kernels import Int4GroupMethod, Int8LMHeadMethod, Int8RowMethod, quantize_int8
from octavo.quant import GGUFBlocks, LinearMethod, Quantizer

Q4_0, Q4_1, Q8_0, Q4_K = 2, 3, 8, 12
FLOAT_TYPES = {0, 1, 30}  # F32, F16, BF16
INT4_TYPES = {Q4_0, Q4_1, Q4_K}
#: ggml types a linear layer may hold: exact int4, or dequantized then rounded to int8 per row.
SUPPORTED_TYPES = INT4_TYPES | {6, 7, Q8_0, 10, 11, 13, 14, 15} | FLOAT_TYPES
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)  # [num_blocks, 1]


def _nibbles_32(packed: np.ndarray) -> np.ndarray:
    # Q4_0/Q4_1: byte j holds element j (low nibble) and element j + 16 (high nibble)
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)  # [num_blocks, 32]


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins of a Q4_K/Q5_K super-block (12 packed bytes), as in ggml."""
    d, m, m_d = np.split(scales.reshape(-1, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(-1, 8).astype(np.float32), mn.reshape(-1, 8).astype(np.float32)


def blocks_to_int4(t: GGUFBlocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0 / Q4_1 / Q4_K tensor -> canonical int4 ``(qweight uint8 [N, K], scales, zeros [N, K / 32])``."""
    rows, cols = t.shape
    raw = t.data.numpy() if isinstance(t.data, torch.Tensor) else np.asarray(t.data)
    if t.ggml_type in (Q4_0, Q4_1):
        blocks = raw.reshape(-1, 18 if t.ggml_type == Q4_0 else 20)  # [rows * cols / 32, bytes]
        d = _f16(blocks, 0)
        if t.ggml_type == Q4_0:
            q, zero = _nibbles_32(blocks[:, 2:]), np.zeros_like(d)
        else:
            q, zero = _nibbles_32(blocks[:, 4:]), _f16(blocks, 2) + 8 * d
        scale = d
    elif t.ggml_type == Q4_K:
        blocks = raw.reshape(-1, 144)  # [rows * cols / 256, bytes]: d, dmin, 12 scale bytes, 128 nibble bytes
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, mn = _k_scale_min(blocks[:, 4:16])
        # 4 chunks of 32 bytes: low nibbles are sub-block 2i, high nibbles sub-block 2i + 1
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (qs & 0x0F).reshape(-1, 32)  # [rows * cols / 32, 32]
        scale = (d * sc).reshape(-1, 1)
        zero = (8 * d * sc - dmin * mn).reshape(-1, 1)
    else:
        raise ValueError(f"ggml type {TYPE_NAMES.get(t.ggml_type, t.ggml_type)} is not a 4-bit type")
    qweight = torch.from_numpy(np.ascontiguousarray(q, dtype=np.uint8)).reshape(rows, cols)
    return (qweight, torch.from_numpy(scale.astype(np.float32)).reshape(rows, cols // 32),
            torch.from_numpy(zero.astype(np.float32)).reshape(rows, cols // 32))


def blocks_to_float(t: GGUFBlocks | torch.Tensor) -> torch.Tensor:
    """Any GGUF tensor -> float32 ``[N, K]`` (through ``gguf.quants``; used before int8 rounding)."""
    if isinstance(t, torch.Tensor):
        return t.float()
    raw = t.data.numpy() if isinstance(t.data, torch.Tensor) else np.asarray(t.data)
    if t.ggml_type in FLOAT_TYPES and t.ggml_type != 30:
        return torch.from_numpy(raw.view(np.float32 if t.ggml_type == 0 else np.float16).astype(np.float32)
                                ).reshape(t.shape)
    if t.ggml_type in INT4_TYPES:
        return (lambda q, s, z: (q.float() - 8) * s.repeat_interleave(32, 1) + z.repeat_interleave(32, 1))(
            *blocks_to_int4(t))
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(raw, GGMLQuantizationType(t.ggml_type)).reshape(t.shape).copy())


class _GGUFInt4(Int4GroupMethod):
    int8_activations = True  # llama.cpp's math for these files (docs/quantization.md "int8 activations")

    def __init__(self) -> None:
        super().__init__(32)

    def convert(self, tensors, module):
        qweight, scales, zeros = blocks_to_int4(tensors["weight"])
        return {"qweight": qweight, "scales": scales, "zeros": zeros}


class _GGUFInt8(Int8RowMethod):
    int8_activations = True

    def convert(self, tensors, module):
        qweight, scales = quantize_int8(blocks_to_float(tensors["weight"]))
        return {"qweight": qweight, "scales": scales}


class _GGUFHead(Int8LMHeadMethod):
    int8_activations = True


class GGUFQuantizer(Quantizer):
    """GGUF block formats, repacked for torch's int4 / int8 weight-only kernels.

    Config (built by the loader from the file): ``{"quant_method": "gguf", "tensor_types": {hf module
    name: ggml type}, "file_type": general.file_type}``.
    """

    name: ClassVar[str] = "gguf"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    #: the loader keeps this quantizer's linear tensors as raw :class:`GGUFBlocks`.
    reads_gguf_blocks: ClassVar[bool] = True

    def __init__(self, tensor_types: dict[str, int]) -> None:
        self.tensor_types = tensor_types

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> GGUFQuantizer:
        if "tensor_types" not in hf_quant_config:
            raise ValueError("quantization='gguf' needs a .gguf checkpoint (its tensor types); this is not one")
        return cls(dict(hf_quant_config["tensor_types"]))

    def get_lm_head_method(self) -> LinearMethod | None:
        """An int8 head when the file stores it quantized (``output``, or the tied ``token_embd``)."""
        head = self.tensor_types.get("lm_head", self.tensor_types.get("model.embed_tokens"))
        return _GGUFHead() if head is not None and head not in FLOAT_TYPES else None

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        parts = self.part_prefixes(layer_prefix)
        types = [self.tensor_types.get(p) for p in parts]
        if any(t is None for t in types):
            return None  # not in the file: the loader reports the missing weight by name
        unsupported = [f"{p} ({TYPE_NAMES.get(t, t)})" for p, t in zip(parts, types) if t not in SUPPORTED_TYPES]
        if unsupported:
            raise ValueError(f"GGUF tensor types not supported for linear layers: {', '.join(unsupported)}; "
                             f"supported: {', '.join(TYPE_NAMES[t] for t in sorted(SUPPORTED_TYPES))}")
        if all(t in FLOAT_TYPES for t in types):
            return None
        if all(t in INT4_TYPES for t in types):
            return _GGUFInt4()
        return _GGUFInt8()
