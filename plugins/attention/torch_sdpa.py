"""The reference attention backend ``torch_sdpa``: plain PyTorch, any device, any dtype; the oracle.

Per step, ``build_metadata`` turns the host-side layout into gather indices (host work, then one copy to the
device, so ``forward`` never syncs). Per layer, ``forward``:

1. writes the new K/V into the paged cache: ``cache[0].view(num_slots, kv_heads, d)[slot_mapping] = k``;
2. decode requests (the leading ``num_decode_reqs``, one new token each) attend together: one padded gather
   of every request's context ``[D, L, kv_heads, d]``, a masked matmul, float32 softmax. The gather copies
   whole blocks (``index_select`` over the block ids, ``L`` rounded up to whole blocks; past a request's
   last block its own last block repeats, masked) rather than one slot per position: on a CPU that is ~3x
   faster than advanced indexing of slots, and the attended values are identical;
3. every other request (prefill chunks, on top of a cached prefix or not) gathers its own context and runs
   ``scaled_dot_product_attention`` with a mask where query ``i`` (position ``num_computed + i``) sees context
   positions ``<= num_computed + i`` (and, with a sliding window, ``> num_computed + i - window``).

Attention runs through ``scaled_dot_product_attention`` in the query's dtype (its CPU kernels accumulate
in float32); the soft-capped path computes scores and softmax in float32.

An fp8 cache (``kv_cache_dtype="fp8"``/``"fp8_e5m2"``) stores ``x / scale`` saturated to fp8 (written through
a uint8 view: torch has no fp8 ``index_copy_`` on CPU) and the gathered blocks are dequantized to the
query's dtype (``octavo.nn.kv_quant``), so everything after the gather is the unquantized path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from octavo.attention import AttentionBackend, AttentionLayout
from octavo.nn.kv_quant import FP8_KV_DTYPES, dequantize, is_fp8, quantize
from octavo.platform import Availability

# scaled_dot_product_attention(enable_gqa=...) exists from torch 2.5
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass
class PrefillItem:
    """One non-decode request: its rows in the flat batch and the cache slots of its whole context."""

    q_start: int
    q_end: int
    slots: torch.Tensor  # int64 [seq_len] cache slot of each context position
    q_pos: torch.Tensor  # int64 [q_len, 1] position of each new token
    k_pos: torch.Tensor  # int64 [1, seq_len] position of each context slot


@dataclass
class TorchSDPAMetadata:
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    num_decodes: int
    decode_blocks: torch.Tensor | None  # int64 [D * B] the first B blocks of each decode request (padded)
    decode_seq_lens: torch.Tensor | None  # int64 [D, 1]
    decode_k_pos: torch.Tensor | None  # int64 [1, L = B * block_size] position of each gathered row
    prefills: list[PrefillItem]
    # per-step cache of masks by sliding window (all layers of one window share them)
    masks: dict[Any, Any] = field(default_factory=dict)


def _context_slots(block_table: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    pos = torch.arange(seq_len, dtype=torch.int64)
    return block_table[pos // block_size].to(torch.int64) * block_size + pos % block_size


class TorchSDPABackend(AttentionBackend):
    """Reference paged attention in plain PyTorch (see the module docstring)."""

    name = "torch_sdpa"

    @classmethod
    def supports(cls, *, device_type, dtype, head_size, sliding_window=None, logits_soft_cap=None, block_size=16):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            return Availability(False, f"dtype {dtype} is not a floating point type torch_sdpa computes")
        return Availability(True)

    @classmethod
    def supports_kv_cache_dtype(cls, name: str, device) -> Availability:
        """fp8 caches on any device that stores fp8 tensors (plain torch; the worker probes the device)."""
        return Availability(name in FP8_KV_DTYPES, None if name in FP8_KV_DTYPES else f"unknown fp8 name {name!r}")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k_scale = self.v_scale = 1.0  # per-layer fp8 scales; the worker sets checkpoint values

    @staticmethod
    def _read(cache: torch.Tensor, index: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
        """``cache.index_select(0, index)`` in ``dtype``; an fp8 cache is gathered as bytes (fp8 indexing kernels
        are not on every device) and dequantized."""
        if is_fp8(cache.dtype):
            return dequantize(cache.view(torch.uint8).index_select(0, index).view(cache.dtype), scale, dtype)
        return cache.index_select(0, index).to(dtype)

    @classmethod
    def build_metadata(cls, layout: AttentionLayout, device: torch.device) -> TorchSDPAMetadata:
        bs = layout.block_size
        seq_lens = layout.seq_lens.tolist()
        num_computed = layout.num_computed_tokens.tolist()
        qsl = layout.query_start_loc.tolist()
        tables = layout.block_tables
        num_decodes = layout.num_decode_reqs
        decode_blocks = decode_seq_lens = decode_k_pos = None
        if num_decodes:
            num_blocks = -(-max(seq_lens[:num_decodes]) // bs)
            lens = torch.tensor(seq_lens[:num_decodes], dtype=torch.int64)
            # blocks past a request's last one repeat its last block; the mask hides them
            idx = torch.minimum(torch.arange(num_blocks, dtype=torch.int64)[None, :], ((lens - 1) // bs)[:, None])
            decode_blocks = torch.gather(tables[:num_decodes].to(torch.int64), 1, idx).reshape(-1).to(device)
            decode_seq_lens = lens[:, None].to(device)
            decode_k_pos = torch.arange(num_blocks * bs, dtype=torch.int64)[None, :].to(device)
        prefills = []
        for i in range(num_decodes, layout.num_reqs):
            seq_len, start = seq_lens[i], num_computed[i]
            q_pos = torch.arange(start, seq_len, dtype=torch.int64)
            prefills.append(PrefillItem(qsl[i], qsl[i + 1], _context_slots(tables[i], seq_len, bs).to(device),
                                        q_pos[:, None].to(device),
                                        torch.arange(seq_len, dtype=torch.int64)[None, :].to(device)))
        return TorchSDPAMetadata(layout.slot_mapping.to(device=device, dtype=torch.int64), num_decodes,
                                 decode_blocks, decode_seq_lens, decode_k_pos, prefills)

    def _allowed(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Boolean ``[.., q, k]`` mask: causal, and inside the sliding window when there is one."""
        allowed = k_pos <= q_pos
        if self.sliding_window is not None:
            allowed = allowed & (k_pos > q_pos - self.sliding_window)
        return allowed

    def forward(self, query, key, value, kv_cache, metadata: TorchSDPAMetadata):
        num_slots = kv_cache.shape[1] * kv_cache.shape[2]
        k_cache = kv_cache[0].view(num_slots, self.num_kv_heads, self.head_size)  # [slots, kv_heads, d]
        v_cache = kv_cache[1].view(num_slots, self.num_kv_heads, self.head_size)
        if is_fp8(kv_cache.dtype):
            k_cache.view(torch.uint8).index_copy_(0, metadata.slot_mapping,
                                                  quantize(key, self.k_scale, kv_cache.dtype).view(torch.uint8))
            v_cache.view(torch.uint8).index_copy_(0, metadata.slot_mapping,
                                                  quantize(value, self.v_scale, kv_cache.dtype).view(torch.uint8))
        else:
            k_cache.index_copy_(0, metadata.slot_mapping, key.to(k_cache.dtype))
            v_cache.index_copy_(0, metadata.slot_mapping, value.to(v_cache.dtype))
        out = torch.empty_like(query)
        group = self.num_heads // self.num_kv_heads
        if metadata.num_decodes:
            out[: metadata.num_decodes] = self._decode(query[: metadata.num_decodes], kv_cache, metadata, group)
        for item in metadata.prefills:
            out[item.q_start:item.q_end] = self._prefill(query[item.q_start:item.q_end], k_cache, v_cache, item,
                                                         metadata, group)
        return out

    def _decode(self, q, kv_cache, md: TorchSDPAMetadata, group: int) -> torch.Tensor:
        num_decodes = q.shape[0]
        ctx_len = md.decode_k_pos.shape[1]
        # whole blocks [D * B, block_size, kv_heads, d] -> [D, kv_heads, L, d]; the cache may have its own
        # dtype (kv_cache_dtype): attend in the query's
        k = self._read(kv_cache[0], md.decode_blocks, self.k_scale, q.dtype).view(
            num_decodes, ctx_len, self.num_kv_heads, self.head_size).transpose(1, 2)
        v = self._read(kv_cache[1], md.decode_blocks, self.v_scale, q.dtype).view(
            num_decodes, ctx_len, self.num_kv_heads, self.head_size).transpose(1, 2)
        qg = q.view(num_decodes, self.num_kv_heads, group, self.head_size)  # [D, kv_heads, g, d]
        if self.logits_soft_cap:
            allowed = self._mask(md, "decode", lambda: self._allowed(md.decode_seq_lens - 1, md.decode_k_pos))
            scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)) * self.scale  # [D, kv_heads, g, L]
            scores = self.logits_soft_cap * torch.tanh(scores / self.logits_soft_cap)
            probs = torch.softmax(scores.masked_fill(~allowed[:, None, None, :], float("-inf")), dim=-1)
            out = torch.matmul(probs, v.float()).to(q.dtype)
        else:
            # additive mask [D, 1, 1, L], built once per step and window, shared by all layers
            bias = self._mask(md, ("decode-bias", q.dtype), lambda: torch.zeros(
                (num_decodes, ctx_len), dtype=q.dtype, device=q.device).masked_fill(
                ~self._allowed(md.decode_seq_lens - 1, md.decode_k_pos), float("-inf"))[:, None, None, :])
            out = F.scaled_dot_product_attention(qg, k, v, attn_mask=bias, scale=self.scale)
        return out.reshape(num_decodes, self.num_heads, self.head_size)

    def _mask(self, md: TorchSDPAMetadata, kind, build):
        key = (kind, self.sliding_window)
        mask = md.masks.get(key)
        if mask is None:
            mask = md.masks[key] = build()
        return mask

    def _prefill(self, q, k_cache, v_cache, item: PrefillItem, md: TorchSDPAMetadata, group: int) -> torch.Tensor:
        allowed = self._mask(md, id(item), lambda: self._allowed(item.q_pos, item.k_pos))  # [q_len, seq_len]
        qh = q.transpose(0, 1)  # [heads, q_len, d]
        kh = self._read(k_cache, item.slots, self.k_scale, q.dtype).transpose(0, 1)  # [kv_heads, seq_len, d]
        vh = self._read(v_cache, item.slots, self.v_scale, q.dtype).transpose(0, 1)
        if self.logits_soft_cap:
            kh = kh.float().repeat_interleave(group, dim=0)  # [heads, seq_len, d]
            scores = torch.matmul(qh.float(), kh.transpose(1, 2)) * self.scale  # [heads, q_len, seq_len]
            scores = self.logits_soft_cap * torch.tanh(scores / self.logits_soft_cap)
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
            out = torch.matmul(probs, vh.float().repeat_interleave(group, dim=0)).to(q.dtype)
        elif _SDPA_GQA or group == 1:
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=self.scale,
                                                 **({"enable_gqa": True} if group > 1 else {}))
        else:  # torch < 2.5: repeat the KV heads
            out = F.scaled_dot_product_attention(qh, kh.repeat_interleave(group, dim=0),
                                                 vh.repeat_interleave(group, dim=0), attn_mask=allowed,
                                                 scale=self.scale)
        return out.transpose(0, 1)  # [q_len, heads, d]
