"""Writers of tiny quantized checkpoints, each following its format's public specification.

The packing here is written independently of octavo's readers (plain loops over nibbles, per the GPTQ /
AutoGPTQ and AutoAWQ layouts), and each writer returns the dequantized float weight it encoded, which the
tests save as the dense reference checkpoint.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def group_index(k: int, group: int, desc_act: bool, seed: int = 0) -> torch.Tensor:
    """GPTQ's ``g_idx [K]``: each input column's group; with ``desc_act`` the columns are permuted (act-order)."""
    if not desc_act:
        return (torch.arange(k) // group).to(torch.int32)
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group).to(torch.int32)
    return g_idx


def _quantize_groups(w: torch.Tensor, g_idx: torch.Tensor, num_groups: int, sym: bool, bits: int = 4):
    """``w [N, K]`` -> integer ``q [K, N]`` in 0..2^bits - 1, integer zeros and scales ``[G, N]``: w ~ s * (q - z)
    (symmetric: z = 2^(bits - 1), s = amax / (levels / 2))."""
    n, k = w.shape
    levels = 2**bits - 1
    q = torch.empty(k, n, dtype=torch.int32)
    zeros = torch.empty(num_groups, n, dtype=torch.int32)
    scales = torch.empty(num_groups, n, dtype=torch.float16)
    for g in range(num_groups):
        cols = (g_idx == g).nonzero().squeeze(1)
        block = w[:, cols].float()  # [N, group]
        if sym:
            s = (block.abs().amax(1) / (levels / 2)).clamp(min=1e-6).half().float()
            z = torch.full((n,), 2 ** (bits - 1), dtype=torch.int32)
        else:
            lo, hi = block.amin(1), block.amax(1)
            s = ((hi - lo) / levels).clamp(min=1e-6).half().float()
            z = torch.clamp(torch.round(-lo / s), 0, levels).to(torch.int32)
        q[cols] = torch.clamp(torch.round(block / s[:, None]) + z[:, None], 0, levels).to(torch.int32).t()
        zeros[g], scales[g] = z, s.half()
    return q, zeros, scales


def _dequant(q, zeros, scales, g_idx) -> torch.Tensor:
    return ((q - zeros[g_idx]).float() * scales[g_idx].float()).t().contiguous()  # [N, K]


def _pack(values: torch.Tensor, dim: int, order: list[int] | None = None) -> torch.Tensor:
    """Pack 8 nibbles along ``dim`` into int32: nibble j holds element 8c + (order[j] if order else j)."""
    v = values.to(torch.int64).movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], -1, 8)
    packed = torch.zeros(v.shape[:-1], dtype=torch.int64)
    for j in range(8):
        packed |= v[..., order[j] if order else j] << (4 * j)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # reinterpret as int32
    return packed.movedim(-1, dim).contiguous()


def gptq_tensors(w: torch.Tensor, group_size: int, sym: bool, desc_act: bool, seed: int = 0):
    """GPTQ (v1 format: stored zero = z - 1) tensors of one projection, and its dequantized weight."""
    n, k = w.shape
    group = k if group_size == -1 else group_size
    g_idx = group_index(k, group, desc_act, seed)
    q, zeros, scales = _quantize_groups(w, g_idx.long(), k // group, sym)
    tensors = {"qweight": _pack(q, 0), "qzeros": _pack(zeros - 1, 1), "scales": scales, "g_idx": g_idx}
    return tensors, _dequant(q, zeros, scales, g_idx.long())


def awq_tensors(w: torch.Tensor, group_size: int):
    """AWQ GEMM-format tensors of one projection (asymmetric, zero points), and its dequantized weight."""
    n, k = w.shape
    g_idx = torch.arange(k) // group_size
    q, zeros, scales = _quantize_groups(w, g_idx, k // group_size, sym=False)
    tensors = {"qweight": _pack(q, 1, AWQ_ORDER), "qzeros": _pack(zeros, 1, AWQ_ORDER), "scales": scales}
    return tensors, _dequant(q, zeros, scales, g_idx)


def compressed_w4a16_tensors(w: torch.Tensor, group_size: int):
    """compressed-tensors ``pack-quantized`` W4A16 (symmetric, offset-coded q + 8, packed along input columns)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group_size, group_size)
    scale = (groups.abs().amax(-1) / 7.5).clamp(min=1e-6).half().float()  # [N, G]
    q = torch.clamp(torch.round(groups / scale[..., None]), -8, 7).reshape(n, k)  # signed int4
    tensors = {"weight_packed": _pack((q + 8).to(torch.int32), 1), "weight_scale": scale.half(),
               "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    return tensors, (q.reshape(n, k // group_size, group_size) * scale[..., None]).reshape(n, k)


def write_checkpoints(hf_model, root: str, name: str, quant_config: dict | None, make) -> tuple[str, str]:
    """Save ``hf_model`` quantized by ``make(weight, layer_index) -> (tensors, dequantized)`` under
    ``root/name`` and its dequantized dense twin under ``root/name-dense``; returns both paths."""
    qdir, ddir = os.path.join(root, name), os.path.join(root, f"{name}-dense")
    state = {k: v.detach().clone().float().contiguous() for k, v in hf_model.state_dict().items()}
    qstate, dstate = {}, {}
    for i, (key, value) in enumerate(sorted(state.items())):
        module, _, suffix = key.rpartition(".")
        if suffix == "weight" and module.rpartition(".")[2] in LINEAR and make is not None:
            tensors, dense = make(value, i)
            qstate.update({f"{module}.{s}": t.contiguous() for s, t in tensors.items()})
            dstate[key] = dense
        else:
            qstate[key] = dstate[key] = value
    for path, st, qc in ((qdir, qstate, quant_config), (ddir, dstate, None)):
        os.makedirs(path, exist_ok=True)
        hf_model.config.save_pretrained(path)
        if qc is not None:
            with open(os.path.join(path, "config.json")) as f:
                cfg = json.load(f)
            cfg["quantization_config"] = qc
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(cfg, f)
        save_file(st, os.path.join(path, "model.safetensors"))
    return qdir, ddir
