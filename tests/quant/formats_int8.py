"""Writers of tiny 8-bit and asymmetric checkpoints, each following its format's public specification.

Written independently of octavo's readers (plain loops over the packed codes), like tests/quant/formats.py:

- GPTQ 8-bit (AutoGPTQ / GPTQModel v1): ``qweight`` int32 ``[K / 4, N]`` (byte j of row i = input row 4i + j),
  ``qzeros`` int32 ``[G, N / 4]`` (byte j of column c = output column 4c + j, stored zero - 1), ``scales`` fp16
  ``[G, N]``, ``g_idx`` int32 ``[K]``; symmetric zero = 128; ``w = s * (q - z)``.
- compressed-tensors ``pack-quantized`` 4-bit asymmetric (llm-compressor W4A16_ASYM): signed codes in [-8, 7],
  ``scale = (max - min) / 15`` with 0 in the range, ``zp = clamp(round(-8 - min / scale))``; the codes + 8 packed
  8 per int32 along the input columns, the zero points + 8 packed along the OUTPUT rows (``packed_dim=0``).
- compressed-tensors ``int-quantized`` INT8 W8A8: int8 ``weight``, symmetric ``scale = amax / 127.5`` per
  output row (``[N, 1]``) or per tensor (``[1]``); static activation scales from a calibration run.

Each writer returns ``(on-disk tensors, the dequantized float weight they encode)``.
"""

from __future__ import annotations

import torch

from tests.quant.formats import _dequant, _quantize_groups, group_index


def _pack_codes(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned ``bits``-wide codes ``32 / bits`` per int32 along ``dim`` (code j at bit ``bits * j``)."""
    per = 32 // bits
    v = values.to(torch.int64).movedim(dim, -1)
    pad = (-v.shape[-1]) % per
    if pad:
        v = torch.nn.functional.pad(v, (0, pad))
    v = v.reshape(*v.shape[:-1], -1, per)
    packed = torch.zeros(v.shape[:-1], dtype=torch.int64)
    for j in range(per):
        packed |= v[..., j] << (bits * j)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # reinterpret as int32
    return packed.movedim(-1, dim).contiguous()


def gptq8_tensors(w: torch.Tensor, group_size: int, sym: bool, desc_act: bool, seed: int = 0):
    """GPTQ 8-bit (v1: stored zero = z - 1) tensors of one projection, and its dequantized weight."""
    k = w.shape[1]
    group = k if group_size == -1 else group_size
    g_idx = group_index(k, group, desc_act, seed)
    q, zeros, scales = _quantize_groups(w, g_idx.long(), k // group, sym, bits=8)
    dense = _dequant(q, zeros, scales, g_idx.long())
    tensors = {"qweight": _pack_codes(q, 8, 0), "qzeros": _pack_codes(zeros - 1, 8, 1), "scales": scales,
               "g_idx": g_idx}
    return tensors, dense


def ct_w4a16_asym_tensors(w: torch.Tensor, group_size: int | None):
    """compressed-tensors pack-quantized 4-bit asymmetric (group, or channel when ``group_size`` is None)."""
    n, k = w.shape
    group = group_size or k
    blocks = w.float().reshape(n, k // group, group)
    lo = blocks.amin(-1).clamp(max=0)
    hi = blocks.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-6).half().float()  # [N, G]
    zp = torch.clamp(torch.round(-8 - lo / scale), -8, 7)
    q = torch.clamp(torch.round(blocks / scale[..., None]) + zp[..., None], -8, 7)  # signed codes
    dense = ((q - zp[..., None]) * scale[..., None]).reshape(n, k)
    tensors = {"weight_packed": _pack_codes((q.reshape(n, k) + 8).to(torch.int32), 4, 1),
               "weight_scale": scale.half(),
               "weight_zero_point": _pack_codes((zp + 8).to(torch.int32), 4, 0),
               "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    return tensors, dense


def ct_w8a8_tensors(w: torch.Tensor, per_tensor: bool = False, input_scale: float | None = None):
    """compressed-tensors int-quantized INT8 W8A8 weight (symmetric, channel or tensor scale) and, for static
    activations, the layer's ``input_scale``."""
    amax = w.float().abs().amax() if per_tensor else w.float().abs().amax(1, keepdim=True)
    scale = (amax / 127.5).clamp(min=1e-8).reshape(1 if per_tensor else -1, *(() if per_tensor else (1,)))
    q = torch.clamp(torch.round(w.float() / scale), -128, 127)
    tensors = {"weight": q.to(torch.int8), "weight_scale": scale.float()}
    if input_scale is not None:
        tensors["input_scale"] = torch.tensor([input_scale], dtype=torch.float32)
    return tensors, q * scale


def calibrate_input_scales(hf_model, prompts: list[list[int]]) -> dict[str, float]:
    """Static per-tensor input scales (``amax / 127.5``) of every ``nn.Linear`` from a forward run over
    ``prompts`` (a min-max observer, as llm-compressor's default)."""
    amax: dict[str, float] = {}
    hooks = []
    for name, module in hf_model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def hook(mod, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
            hooks.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        for p in prompts:
            hf_model(torch.tensor([p]))
    for h in hooks:
        h.remove()
    return {name: a / 127.5 for name, a in amax.items()}


def w8a8_config(dynamic: bool = True, per_tensor_weights: bool = False) -> dict:
    """A compressed-tensors ``quantization_config`` of the INT8 W8A8 scheme, as llm-compressor writes it."""
    acts = ({"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
            if dynamic else {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "tensor", "dynamic": False})
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": acts,
                "weights": {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False,
                            "strategy": "tensor" if per_tensor_weights else "channel"}}},
            "ignore": ["lm_head"]}


def w4a16_asym_config(group_size: int | None) -> dict:
    weights = {"num_bits": 4, "type": "int", "symmetric": False, "dynamic": False,
               "strategy": "group" if group_size else "channel"}
    if group_size:
        weights["group_size"] = group_size
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": weights}},
            "ignore": ["lm_head"]}


def ct_w8a16_asym_tensors(w: torch.Tensor, group_size: int):
    """compressed-tensors pack-quantized 8-bit asymmetric, grouped (llm-compressor W8A16 with zero points)."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // group_size, group_size)
    lo, hi = blocks.amin(-1).clamp(max=0), blocks.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=1e-6).half().float()
    zp = torch.clamp(torch.round(-128 - lo / scale), -128, 127)
    q = torch.clamp(torch.round(blocks / scale[..., None]) + zp[..., None], -128, 127)
    dense = ((q - zp[..., None]) * scale[..., None]).reshape(n, k)
    tensors = {"weight_packed": _pack_codes((q.reshape(n, k) + 128).to(torch.int32), 8, 1),
               "weight_scale": scale.half(),
               "weight_zero_point": _pack_codes((zp + 128).to(torch.int32), 8, 0),
               "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    return tensors, dense


def w8a16_asym_config(group_size: int) -> dict:
    config = w4a16_asym_config(group_size)
    config["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    return config


def ct_w8a16_int_tensors(w: torch.Tensor, group_size: int):
    """compressed-tensors ``int-quantized`` 8-bit weight-only, asymmetric, grouped: the plain int8 ``weight`` and
    an int8 ``weight_zero_point [N, G]`` (no packing), as the naive compressor writes them."""
    tensors, dense = ct_w8a16_asym_tensors(w, group_size)
    n, k = w.shape
    blocks = w.float().reshape(n, k // group_size, group_size)
    scale = tensors["weight_scale"].float()
    lo = blocks.amin(-1).clamp(max=0)
    zp = torch.clamp(torch.round(-128 - lo / scale), -128, 127)
    q = torch.clamp(torch.round(blocks / scale[..., None]) + zp[..., None], -128, 127).reshape(n, k)
    return {"weight": q.to(torch.int8), "weight_scale": tensors["weight_scale"],
            "weight_zero_point": zp.to(torch.int8)}, dense


def w8a16_int_config(group_size: int) -> dict:
    config = w8a16_asym_config(group_size)
    config["format"] = "int-quantized"
    return config
