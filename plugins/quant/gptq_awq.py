"""``gptq`` and ``awq``: weight-only checkpoints (AutoGPTQ / GPTQModel 4- and 8-bit, AutoAWQ "gemm" 4-bit).

4-bit is unpacked once at load into the canonical int4 layout of :mod:`octavo.plugins.quant.kernels`
(``w = (q - 8) * s + z``); GPTQ 8-bit into the int8 group layout of :mod:`octavo.plugins.quant.int8_group`
(``w = q * s + z``, q int8), each then running on its kernels (CPU and CUDA).

On-disk layouts (K = input features, N = output features, G = K / group_size)::

    GPTQ  qweight int32 [K / 8, N]   nibble j of row i is input row 8i + j
          qzeros  int32 [G, N / 8]   nibble j of column c is output column 8c + j; stored zero = z - 1
          scales  fp16  [G, N]       w = s * (q - (stored + 1))
          g_idx   int32 [K]          group of each input row (act-order when desc_act)
    AWQ   qweight int32 [K, N / 8]   nibble j of column c is output column 8c + ORDER[j],
          qzeros  int32 [G, N / 8]     ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
          scales  fp16  [G, N]       w = s * (q - z)
    GPTQ 8-bit: the same with 4 bytes per int32 (byte j of row i is input row 4i + j; zeros likewise along
          columns); symmetric checkpoints have z = 128 (stored 127).

GPTQ ``desc_act``: the input columns are sorted by group (``argsort(g_idx)``) so groups are contiguous, and the
layer gathers ``x[:, perm]`` before the matmul; a fused layer's parts share one permutation (they see the
same input, hence the same Hessian order), which is checked. ``group_size = -1`` (one group per row) is
stored as groups of 128 (or 64 / 32) with repeated scales, which is exact.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from octavo.plugins.quant.int8_group import Int8GroupMethod, canonical_int8
from octavo.plugins.quant.kernels import INT4_GROUP_SIZES, Int4GroupMethod, pick_group_size
from octavo.quant import LinearMethod, Quantizer

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _shifts(bits: int) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=torch.int32)


def unpack_rows(packed: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int32 ``[R, C]`` holding ``32 / bits`` codes along rows -> uint8 ``[32R / bits, C]`` (code j -> row
    ``(32 / bits) i + j``)."""
    q = (packed.to(torch.int32)[:, None, :] >> _shifts(bits)[None, :, None]) & ((1 << bits) - 1)
    return q.reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_cols(packed: torch.Tensor, order: list[int] | None = None, bits: int = 4) -> torch.Tensor:
    """int32 ``[R, C]`` holding ``32 / bits`` codes along columns -> uint8 ``[R, 32C / bits]`` (code j -> column
    ``(32 / bits) c + order[j]``)."""
    q = (packed.to(torch.int32)[:, :, None] >> _shifts(bits)[None, None, :]) & ((1 << bits) - 1)  # [R, C, 32/b]
    if order is not None:
        q = q[:, :, torch.argsort(torch.tensor(order))]  # position p holds code j with order[j] == p
    return q.reshape(packed.shape[0], -1).to(torch.uint8)


def act_order_perm(g_idx: torch.Tensor, group: int, state: dict, module: str, fmt: str) -> torch.Tensor:
    """The input-column order that makes ``g_idx``'s groups contiguous (act-order / desc_act checkpoints).

    ``state`` is the layer method's memory: the parts of one fused layer must share one permutation (they see
    the same input, hence the same Hessian order).
    """
    k = g_idx.numel()
    g_idx = g_idx.long()
    perm = torch.argsort(g_idx, stable=True)
    if not torch.equal(torch.bincount(g_idx, minlength=k // group), torch.full((k // group,), group)):
        raise ValueError(f"{fmt} {module}: g_idx does not put {group} input rows in every group")
    if state.get("perm") is not None and not torch.equal(state["perm"], perm):
        raise ValueError(f"{fmt} {module}: the parts of one fused layer have different act-order "
                         "permutations (g_idx); octavo needs them equal")
    state["perm"] = perm
    return perm


def _canonical(q_kn: torch.Tensor, zeros_gn: torch.Tensor, scales_gn: torch.Tensor, group: int, out_group: int):
    """``q [K, N]``, integer zeros and scales ``[G, N]`` (w = s * (q - z)) -> canonical int4 tensors."""
    scales = scales_gn.float()
    zeros = scales * (8 - zeros_gn.float())  # s * (q - z) = (q - 8) * s + s * (8 - z)
    repeat = group // out_group
    return (q_kn.t().contiguous(), scales.t().repeat_interleave(repeat, 1).contiguous(),
            zeros.t().repeat_interleave(repeat, 1).contiguous())


class _GPTQMethod(Int4GroupMethod):
    checkpoint_suffixes: ClassVar[tuple[str, ...]] = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, group_size: int, desc_act: bool, zero_offset: int) -> None:
        self.checkpoint_group, self.desc_act, self.zero_offset = group_size, desc_act, zero_offset
        self._state: dict = {}
        super().__init__(group_size if group_size in INT4_GROUP_SIZES else 128, input_perm=desc_act)

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        if self.checkpoint_group == -1:  # one group per row: any kernel group dividing K is exact
            self.group_size = pick_group_size(input_size)
        elif self.checkpoint_group not in INT4_GROUP_SIZES:
            raise ValueError(f"gptq group_size={self.checkpoint_group} is not supported; use one of "
                             f"{INT4_GROUP_SIZES} or -1")
        super().create_weights(layer, input_size, output_sizes, params_dtype)

    def convert(self, tensors, module):
        q = unpack_rows(tensors["qweight"])  # [K, N]
        k = q.shape[0]
        group = k if self.checkpoint_group == -1 else self.checkpoint_group
        zeros = unpack_cols(tensors["qzeros"]).to(torch.int32) + self.zero_offset  # [G, N]
        q, out = _gptq_order(q, tensors["g_idx"], group, self.desc_act, self._state, module)
        qweight, scales, zeros_c = _canonical(q, zeros, tensors["scales"], group, self.group_size)
        out.update(qweight=qweight, scales=scales, zeros=zeros_c)
        return out


def _gptq_order(q: torch.Tensor, g_idx: torch.Tensor, group: int, desc_act: bool, state: dict, module: str):
    """Rows of ``q [K, N]`` in group order, and ``{"input_perm": perm}`` when act-order; checks ``g_idx``."""
    k = q.shape[0]
    if desc_act:
        perm = act_order_perm(g_idx, group, state, module, "gptq")
        return q[perm], {"input_perm": perm}
    if not torch.equal(g_idx.long(), torch.arange(k) // group):
        raise ValueError(f"gptq {module}: g_idx is not the sequential grouping but desc_act is false; the "
                         "checkpoint's quantization_config must say desc_act=true")
    return q, {}


class _GPTQ8Method(Int8GroupMethod):
    """GPTQ 8-bit: codes 0..255 with a scale and zero per group, on the int8 group kernels."""

    checkpoint_suffixes: ClassVar[tuple[str, ...]] = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, group_size: int, desc_act: bool, zero_offset: int) -> None:
        self.desc_act, self.zero_offset, self._state = desc_act, zero_offset, {}
        super().__init__(group_size, input_perm=desc_act)

    def convert(self, tensors, module):
        u = unpack_rows(tensors["qweight"], bits=8)  # [K, N]
        k = u.shape[0]
        group = k if self.group_size == -1 else self.group_size
        zeros = unpack_cols(tensors["qzeros"], bits=8).to(torch.int32) + self.zero_offset  # [G, N]
        u, out = _gptq_order(u, tensors["g_idx"], group, self.desc_act, self._state, module)
        qweight, scales, zeros_c = canonical_int8(u, zeros[:, :u.shape[1]], tensors["scales"])
        out.update(qweight=qweight, scales=scales, zeros=zeros_c)
        return out


class _AWQMethod(Int4GroupMethod):
    checkpoint_suffixes: ClassVar[tuple[str, ...]] = ("qweight", "qzeros", "scales")

    def convert(self, tensors, module):
        q = unpack_cols(tensors["qweight"], AWQ_ORDER)  # [K, N]
        zeros = unpack_cols(tensors["qzeros"], AWQ_ORDER)  # [G, N]
        qweight, scales, zeros_c = _canonical(q, zeros, tensors["scales"], self.group_size, self.group_size)
        return {"qweight": qweight, "scales": scales, "zeros": zeros_c}


def _modules_not_converted(config: dict[str, Any]) -> list[str]:
    return list(config.get("modules_to_not_convert") or [])


class GPTQQuantizer(Quantizer):
    """GPTQ 4-bit (group 32/64/128/256 or -1) and 8-bit (group a multiple of 32, or -1), sym / asym,
    desc_act; v1 checkpoint zeros (stored z - 1) or v2."""

    name: ClassVar[str] = "gptq"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def __init__(self, group_size: int, desc_act: bool, zero_offset: int, skip: list[str], bits: int = 4) -> None:
        self.group_size, self.desc_act, self.zero_offset, self.skip = group_size, desc_act, zero_offset, skip
        self.bits = bits

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> GPTQQuantizer:
        bits = hf_quant_config.get("bits", 4)
        if bits not in (4, 8):
            raise ValueError(f"gptq bits={bits}: octavo runs 4-bit and 8-bit GPTQ (2- and 3-bit are not supported)")
        fmt = hf_quant_config.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"gptq checkpoint_format={fmt!r} is not supported; use gptq or gptq_v2")
        group = int(hf_quant_config.get("group_size", 128))
        if bits == 8 and group != -1 and (group <= 0 or group % 32):
            raise ValueError(f"gptq bits=8 group_size={group}: octavo's 8-bit kernels need a multiple of 32 or -1")
        return cls(group, bool(hf_quant_config.get("desc_act", False)), 1 if fmt == "gptq" else 0,
                   _modules_not_converted(hf_quant_config), bits)

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        if any(s in layer_prefix for s in self.skip):
            return None
        if self.bits == 8:
            return _GPTQ8Method(self.group_size, self.desc_act, self.zero_offset)
        return _GPTQMethod(self.group_size, self.desc_act, self.zero_offset)


class AWQQuantizer(Quantizer):
    """AWQ 4-bit GEMM format (``version: gemm``, ``zero_point: true``), group 32/64/128/256."""

    name: ClassVar[str] = "awq"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def __init__(self, group_size: int, skip: list[str]) -> None:
        self.group_size, self.skip = group_size, skip

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> AWQQuantizer:
        bits = hf_quant_config.get("bits", hf_quant_config.get("w_bit", 4))
        version = str(hf_quant_config.get("version", "gemm")).lower()
        zero_point = hf_quant_config.get("zero_point", True)
        group = int(hf_quant_config.get("group_size", hf_quant_config.get("q_group_size", 128)))
        if bits != 4 or version != "gemm" or not zero_point or group not in INT4_GROUP_SIZES:
            raise ValueError(f"awq bits={bits}, version={version!r}, zero_point={zero_point}, group_size={group}: "
                             f"octavo reads 4-bit GEMM-format AWQ with zero points and groups of {INT4_GROUP_SIZES}")
        return cls(group, _modules_not_converted(hf_quant_config))

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        if any(s in layer_prefix for s in self.skip):
            return None
        return _AWQMethod(self.group_size)
