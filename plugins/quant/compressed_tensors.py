"""``compressed-tensors`` (llm-compressor's format): integer W4A16 / W8A16 weight-only and INT8 W8A8.

Read from ``quantization_config`` (``quant_method: compressed-tensors``): one config group (targets
``Linear``) whose ``weights`` / ``input_activations`` are ``QuantizationArgs``, and a ``format``. Per
projection on disk (N outputs, K inputs, G = K / group_size; one column for strategy ``channel``)::

    pack-quantized (W4A16, W8A16: int weights, no activation quantization)
        weight_packed      int32 [N, K * bits / 32]  32 consecutive codes per ``bits`` words; 4-bit: nibble j of
                                                     word c is column 8c + j; 8-bit: byte j is column 4c + j;
                                                     codes offset by 2^(bits-1) (stored q + 8 / q + 128)
        weight_scale       fp16/bf16/fp32 [N, G]
        weight_zero_point  int32 [ceil(N * bits / 32), G]  only when asymmetric: packed the same way along
                                                     the OUTPUT rows (packed_dim 0), offset-coded too
        weight_shape       int [2] (N, K)            w = s * (q - zp)   (q, zp signed: [-8, 7] / [-128, 127])
    int-quantized / naive-quantized with int8 input_activations (INT8 W8A8)
        weight             int8 [N, K]               symmetric
        weight_scale       [N, 1] (channel) or [1] (tensor)
        input_scale        [1], input_zero_point [1]  only for static (``dynamic: false``) activations
    int-quantized / naive-quantized without input_activations (W8A16): ``weight`` int8, ``weight_scale``, and
        ``weight_zero_point`` int8 when asymmetric.

Each scheme repacks exactly onto an existing kernel family: 4-bit onto the int4 group kernels
(``w = (q' - 8) * s + z`` with ``q' = q + 8``, ``z = -s * zp``), 8-bit weight-only onto the int8 group kernels
(:mod:`.int8_group`), W8A8 onto the int8 x int8 GEMM (:mod:`.int8_w8a8`).

``float-quantized`` FP8 W8A8 (e4m3 ``weight``, ``weight_scale`` per channel or tensor, dynamic per-token
activations) runs on the fp8 quantizer's linear method (CUDA, compute capability >= 8.9; refused on CPU).

Refused at start, each naming the field: FP4 and other float types, static FP8 activation scales, more than one
config group or other targets,
activation quantization with 4-bit weights or with a weight-only format, asymmetric W8A8 weights, group-wise
W8A8 weights, block / token / tensor_group weight strategies, ``actorder: group`` (``weight_g_idx``), a
``kv_cache_scheme`` other than FP8 per-tensor (whose ``k_scale`` / ``v_scale`` the fp8 KV cache reads), sparsity or
transform configs, and checkpoints not saved ``compressed``.
"""

from __future__ import annotations

import logging
import re
from typing import Any, ClassVar

import torch

from octavo.platform import Availability
from octavo.plugins.quant.gptq_awq import unpack_cols, unpack_rows
from octavo.plugins.quant.int8_group import Int8GroupMethod, canonical_int8
from octavo.plugins.quant.int8_w8a8 import Int8W8A8Method
from octavo.plugins.quant.kernels import INT4_GROUP_SIZES, Int4GroupMethod, pick_group_size
from octavo.quant import LinearMethod, Quantizer

logger = logging.getLogger(__name__)
_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
_W8A8_FORMATS = ("int-quantized", "naive-quantized")
_KNOWN_ARG_KEYS = {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
                   "actorder", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"}


class _PackedW4(Int4GroupMethod):
    """pack-quantized 4-bit, symmetric or with zero points, group or channel scales."""

    def __init__(self, group_size: int | None, symmetric: bool) -> None:  # None: one scale per row ("channel")
        self.checkpoint_group, self.symmetric = group_size, symmetric
        self.checkpoint_suffixes = ("weight_packed", "weight_scale", "weight_shape") + (
            () if symmetric else ("weight_zero_point",))
        super().__init__(group_size if group_size else 128)

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        if self.checkpoint_group is None:
            self.group_size = pick_group_size(input_size)
        super().create_weights(layer, input_size, output_sizes, params_dtype)

    def convert(self, tensors, module):
        n, k = _shape(tensors["weight_shape"])
        q = unpack_cols(tensors["weight_packed"])[:, :k]  # [N, K], q + 8 in 0..15
        scales = tensors["weight_scale"].float().reshape(n, -1)  # [N, G]
        if self.symmetric:
            zeros = torch.zeros_like(scales)
        else:  # w = s * (q - zp) = (q' - 8) * s + s * (8 - zp')   with zp' = zp + 8 as stored
            zp = unpack_rows(tensors["weight_zero_point"])[:n].float().reshape(n, -1)  # [N, G]
            zeros = scales * (8 - zp)
        repeat = (k // scales.shape[1]) // self.group_size  # > 1 for "channel" scales
        return {"qweight": q.contiguous(), "scales": scales.repeat_interleave(repeat, 1).contiguous(),
                "zeros": zeros.repeat_interleave(repeat, 1).contiguous()}


class _Int8WeightOnly(Int8GroupMethod):
    """8-bit weight-only: pack-quantized (4 codes per int32) or a plain int8 ``weight``."""

    def __init__(self, group_size: int | None, symmetric: bool, packed: bool) -> None:
        self.symmetric, self.packed = symmetric, packed
        names = ("weight_packed", "weight_scale", "weight_shape") if packed else ("weight", "weight_scale")
        self.checkpoint_suffixes = names + (() if symmetric else ("weight_zero_point",))
        super().__init__(group_size or -1)

    def convert(self, tensors, module):
        if self.packed:
            n, k = _shape(tensors["weight_shape"])
            u = unpack_cols(tensors["weight_packed"], bits=8)[:, :k]  # [N, K], q + 128
        else:
            w = tensors["weight"]
            if w.dtype != torch.int8:
                raise ValueError(f"compressed-tensors {module}.weight is {w.dtype}, not int8")
            n, k = w.shape
            u = (w.to(torch.int32) + 128).to(torch.uint8)
        scales = tensors["weight_scale"].float().reshape(n, -1)  # [N, G]
        if self.symmetric:
            zp = torch.full_like(scales, 128)
        elif self.packed:
            zp = unpack_rows(tensors["weight_zero_point"], bits=8)[:n].float().reshape(n, -1)  # zp + 128
        else:
            zp = tensors["weight_zero_point"].float().reshape(n, -1) + 128
        qweight, s, z = canonical_int8(u.t(), zp.t(), scales.t())
        return {"qweight": qweight, "scales": s, "zeros": z}


def _shape(t: torch.Tensor) -> tuple[int, int]:
    n, k = (int(v) for v in t.reshape(-1).tolist())
    return n, k


def _check_args(args: dict[str, Any], what: str) -> None:
    unknown = set(args) - _KNOWN_ARG_KEYS
    if unknown:
        raise ValueError(f"compressed-tensors {what} has fields octavo does not read: {sorted(unknown)}")
    if args.get("type", "int") != "int":
        raise ValueError(f"compressed-tensors {what} type={args.get('type')!r}, num_bits={args.get('num_bits')}: "
                         "octavo reads integer schemes and FP8 W8A8 (float-quantized) here (FP4 and other float "
                         "schemes are not supported)")
    if args.get("block_structure"):
        raise ValueError(f"compressed-tensors {what} block_structure={args['block_structure']}: block-wise scales "
                         "are not supported")


def _fp8_method(fmt: str, weights: dict[str, Any], acts: dict[str, Any] | None):
    """FP8 W8A8 (``float-quantized``): e4m3 weights with channel / tensor scales, dynamic per-token activations."""
    from octavo.plugins.quant.fp8 import _FP8Method

    for args, what in ((weights, "weights"), (acts or {}, "input_activations")):
        if set(args) - _KNOWN_ARG_KEYS:
            raise ValueError(f"compressed-tensors {what} has fields octavo does not read: "
                             f"{sorted(set(args) - _KNOWN_ARG_KEYS)}")
    w_ok = (weights.get("num_bits") == 8 and weights.get("symmetric", True) and not weights.get("dynamic")
            and weights.get("strategy") in ("channel", "tensor") and not weights.get("block_structure"))
    a_ok = (acts is not None and acts.get("type") == "float" and acts.get("num_bits") == 8
            and acts.get("dynamic") is True and acts.get("strategy") == "token" and acts.get("symmetric", True))
    if fmt not in ("float-quantized", "naive-quantized") or not w_ok or not a_ok:
        raise ValueError(f"compressed-tensors FP8 scheme format={fmt!r}, weights={weights}, input_activations="
                         f"{acts}: octavo reads float-quantized FP8 W8A8 with channel or tensor weight scales and "
                         "dynamic per-token activations (static FP8 activation scales and FP8 weight-only are not "
                         "supported)")
    return (lambda: _FP8Method(prequantized=True)), "FP8"


def _scheme_method(fmt: str, weights: dict[str, Any], acts: dict[str, Any] | None):
    """``(factory of the LinearMethod, short scheme name)``; ValueError naming the unsupported field."""
    if weights.get("type") == "float" and weights.get("num_bits") == 8:
        return _fp8_method(fmt, weights, acts)
    _check_args(weights, "weights")
    bits, sym, strategy = weights.get("num_bits"), bool(weights.get("symmetric", True)), weights.get("strategy")
    group = weights.get("group_size")
    if weights.get("dynamic", False):
        raise ValueError("compressed-tensors weights dynamic=true: weight scales must be stored in the checkpoint")
    if str(weights.get("actorder")).lower() in ("group", "dynamic"):
        raise ValueError("compressed-tensors weights actorder='group' (weight_g_idx) is not supported; "
                         "actorder 'weight' / 'static' (no g_idx) is")
    if strategy not in ("group", "channel", "tensor"):
        raise ValueError(f"compressed-tensors weights strategy={strategy!r}: octavo reads group, channel or tensor")
    if acts is not None:  # W8A8
        _check_args(acts, "input_activations")
        if fmt not in _W8A8_FORMATS:
            raise ValueError(f"compressed-tensors format={fmt!r} with input_activations: octavo runs activation "
                             f"quantization for the {_W8A8_FORMATS} formats (INT8 W8A8)")
        if bits != 8 or acts.get("num_bits") != 8:
            raise ValueError(f"compressed-tensors weights num_bits={bits}, input_activations num_bits="
                             f"{acts.get('num_bits')}: octavo's activation-quantized scheme is INT8 W8A8")
        if not sym or strategy not in ("channel", "tensor"):
            raise ValueError(f"compressed-tensors W8A8 weights symmetric={sym}, strategy={strategy!r}: octavo reads "
                             "symmetric int8 weights with channel or tensor scales")
        a_strategy, dynamic = acts.get("strategy"), acts.get("dynamic", False)
        if dynamic is True and a_strategy in ("token", "tensor"):
            per_token = a_strategy == "token"
        elif dynamic is False and a_strategy == "tensor":
            per_token = False
        else:
            raise ValueError(f"compressed-tensors input_activations strategy={a_strategy!r}, dynamic={dynamic!r}: "
                             "octavo reads dynamic per-token / per-tensor or static per-tensor activation scales")
        a_sym = bool(acts.get("symmetric", True))
        return (lambda: Int8W8A8Method(dynamic=bool(dynamic), per_token=per_token, symmetric=a_sym)), "W8A8"
    if strategy == "tensor":
        raise ValueError("compressed-tensors weight-only strategy='tensor' is not supported; use group or channel")
    if strategy == "group" and not group:
        raise ValueError("compressed-tensors weights strategy='group' needs a group_size")
    g = group if strategy == "group" else None
    if bits == 4:
        if fmt != "pack-quantized":
            raise ValueError(f"compressed-tensors 4-bit weights in format={fmt!r}: octavo reads pack-quantized")
        if g is not None and g not in INT4_GROUP_SIZES:
            raise ValueError(f"compressed-tensors weights group_size={g}: 4-bit groups of {INT4_GROUP_SIZES}")
        return (lambda: _PackedW4(g, sym)), "W4A16"
    if bits == 8:
        if g is not None and g % 32:
            raise ValueError(f"compressed-tensors weights group_size={g}: 8-bit groups must be multiples of 32")
        return (lambda: _Int8WeightOnly(g, sym, fmt == "pack-quantized")), "W8A16"
    raise ValueError(f"compressed-tensors weights num_bits={bits}: octavo reads 4- and 8-bit integer weights")


def _check_kv_cache_scheme(kv: dict[str, Any] | None) -> None:
    """llm-compressor's FP8 KV-cache scheme stores one ``k_scale`` / ``v_scale`` per attention layer, which the
    weight loader puts on the attention layers (``octavo.nn.kv_quant``) and the fp8 KV cache uses with
    ``kv_cache_dtype="fp8"``. Any other KV scheme is refused."""
    if not kv:
        return
    ok = (kv.get("type") == "float" and kv.get("num_bits") == 8 and kv.get("strategy") == "tensor"
          and kv.get("dynamic") in (False, None) and kv.get("symmetric", True))
    if not ok:
        raise ValueError(f"compressed-tensors kv_cache_scheme={kv!r} is not supported; octavo reads the FP8 "
                         "per-tensor static scheme (one k_scale / v_scale per attention layer)")
    logger.info("compressed-tensors kv_cache_scheme: FP8 per-tensor k_scale / v_scale are read from the checkpoint "
                "and used when kv_cache_dtype='fp8' (another kv_cache_dtype keeps a 16/32-bit cache without them)")


def _ignored(prefix: str, patterns: list[str]) -> bool:
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], prefix):
                return True
        elif prefix == p or prefix.endswith("." + p):
            return True
    return False


class CompressedTensorsQuantizer(Quantizer):
    """llm-compressor checkpoints: W4A16 / W8A16 (sym or asym) weight-only and INT8 W8A8 (see module doc)."""

    name: ClassVar[str] = "compressed-tensors"
    device_types: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def __init__(self, make_method, scheme: str, ignore: list[str]) -> None:
        self._make, self.scheme, self.ignore = make_method, scheme, ignore

    @classmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> CompressedTensorsQuantizer:
        fmt = hf_quant_config.get("format")
        groups = hf_quant_config.get("config_groups") or {}
        if len(groups) != 1:
            raise ValueError(f"compressed-tensors with {len(groups)} config groups: octavo reads exactly one")
        for key in ("sparsity_config", "transform_config"):
            if hf_quant_config.get(key):
                raise ValueError(f"compressed-tensors {key}={hf_quant_config[key]!r} is not supported")
        _check_kv_cache_scheme(hf_quant_config.get("kv_cache_scheme"))
        status = hf_quant_config.get("quantization_status", "compressed")
        if status != "compressed":
            raise ValueError(f"compressed-tensors quantization_status={status!r}: octavo reads checkpoints saved "
                             "compressed")
        group = next(iter(groups.values()))
        if not isinstance(group, dict):
            raise ValueError(f"compressed-tensors config group {group!r} is not a scheme")
        targets = group.get("targets", ["Linear"])
        if list(targets) != ["Linear"]:
            raise ValueError(f"compressed-tensors targets={targets}: octavo reads one group targeting 'Linear'")
        fmt = group.get("format") or fmt
        if fmt not in _FORMATS:
            raise ValueError(f"compressed-tensors format={fmt!r}: octavo reads {_FORMATS} (mixed-precision, "
                             "NVFP4 / MXFP4 and others are not supported)")
        if group.get("output_activations"):
            raise ValueError("compressed-tensors output_activations quantization is not supported")
        make, scheme = _scheme_method(fmt, group.get("weights") or {}, group.get("input_activations"))
        return cls(make, scheme, list(hf_quant_config.get("ignore") or []))

    def supports(self, platform: Any) -> Availability:
        if self.scheme == "FP8":  # e4m3 matmuls: the fp8 quantizer's own platform rule (CUDA, cc >= 8.9)
            from octavo.plugins.quant.fp8 import FP8Quantizer

            answer = FP8Quantizer(prequantized=True).supports(platform)
            return answer if answer else Availability(False, f"the FP8 W8A8 scheme: {answer.reason}")
        return super().supports(platform)

    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        parts = self.part_prefixes(layer_prefix)  # a fused layer is ignored only as a whole
        ignored = [p for p in parts if _ignored(p, self.ignore)]
        if ignored and len(ignored) < len(parts):
            raise ValueError(f"compressed-tensors ignore list leaves {ignored} dense but quantizes the other parts "
                             f"of the fused layer {layer_prefix}; octavo needs a fused layer all or nothing")
        return None if ignored else self._make()
