"""``cpu_paged``: the CPU's default attention backend — ``torch_sdpa``'s math with the two slow CPU paths replaced.

Why (profile of a bf16 SmolLM2 step at batch 64, docs/performance.md "CPU decode"): with ``torch_sdpa`` about
40 % of a decode step was attention — a padded ``index_select`` copy of every request's context, then
``scaled_dot_product_attention`` with a mask over that copy — and a fresh prompt's prefill attention ran
SDPA with a boolean mask, ~8x slower on this torch build than the same call with ``is_causal=True``. Here:

- decode rows (the leading ``num_decode_reqs``, one token each) run one C kernel over the paged cache itself
  (``_cpu_paged_kernel.paged_decode``: no copy, no mask, online softmax in float32, OpenMP over request x
  KV head), for float32 / bfloat16 caches;
- a prefill chunk that starts at position 0 (a fresh prompt: its context is exactly its own new tokens)
  attends with ``is_causal=True`` straight on this step's K/V, and runs of such prompts with the same length
  (the usual shape of an offline batch) go through one batched SDPA call;
- everything else (prompts on a cached prefix, fp8 caches, shapes outside the kernel's limits) is
  ``torch_sdpa`` unchanged, which is also the whole backend where the C compiler is missing.

Supported like ``torch_sdpa`` minus sliding windows and logit soft caps (refused in ``supports``, so the
selection falls back to ``torch_sdpa`` for those models). Results equal ``torch_sdpa``'s to float32
rounding (sums run in another order); tests/unit/test_cpu_paged_attention.py checks both against float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.nn.kv_quant import is_fp8
from octavo.platform import Availability
from octavo.plugins.attention import _cpu_paged_kernel as kernel
from octavo.plugins.attention.torch_sdpa import TorchSDPABackend, TorchSDPAMetadata


class CpuPagedAttentionBackend(TorchSDPABackend):
    """Paged attention for CPUs (see the module docstring)."""

    name = "cpu_paged"
    platform_priority = {"cpu": 5}  # low: a third-party CPU backend that ranks itself wins

    @classmethod
    def supports(cls, *, device_type, dtype, head_size, sliding_window=None, logits_soft_cap=None, block_size=16):
        if device_type != "cpu":
            return Availability(False, f"a CPU backend (device {device_type})")
        if dtype not in (torch.float32, torch.bfloat16):
            return Availability(False, f"dtype {dtype}: the kernel reads float32 or bfloat16 caches")
        if sliding_window is not None or logits_soft_cap is not None:
            return Availability(False, "sliding window / logits soft cap: use torch_sdpa")
        if head_size > kernel.MAX_HEAD_SIZE or block_size > kernel.MAX_BLOCK_SIZE:
            return Availability(False, f"head_size <= {kernel.MAX_HEAD_SIZE} and block_size <= "
                                       f"{kernel.MAX_BLOCK_SIZE} only")
        if kernel.library() is None:
            return Availability(False, f"its C kernel cannot be built here: {kernel.unavailable_reason()}")
        return Availability(True)

    def forward(self, query, key, value, kv_cache, metadata: TorchSDPAMetadata):
        if is_fp8(kv_cache.dtype) or not kernel.shape_supported(kv_cache, self.num_heads):
            return super().forward(query, key, value, kv_cache, metadata)
        num_slots = kv_cache.shape[1] * kv_cache.shape[2]
        k_cache = kv_cache[0].view(num_slots, self.num_kv_heads, self.head_size)  # [slots, kv_heads, d]
        v_cache = kv_cache[1].view(num_slots, self.num_kv_heads, self.head_size)
        k_cache.index_copy_(0, metadata.slot_mapping, key.to(k_cache.dtype))
        v_cache.index_copy_(0, metadata.slot_mapping, value.to(v_cache.dtype))
        out = torch.empty_like(query)
        group = self.num_heads // self.num_kv_heads
        nd = metadata.num_decodes
        if nd:
            tables = metadata.decode_blocks.view(nd, -1)
            out[:nd] = kernel.paged_decode(query[:nd], kv_cache, tables, metadata.decode_seq_lens.view(-1),
                                           self.scale).to(query.dtype)
        items = metadata.prefills
        i = 0
        while i < len(items):
            item = items[i]
            q_len = item.q_end - item.q_start
            if item.k_pos.shape[1] != q_len:  # on a cached prefix: the reference path
                out[item.q_start:item.q_end] = self._prefill(query[item.q_start:item.q_end], k_cache, v_cache,
                                                             item, metadata, group)
                i += 1
                continue
            j = i + 1  # a run of fresh prompts of this length, back to back in the flat batch
            while (j < len(items) and items[j].q_start == items[j - 1].q_end
                   and items[j].q_end - items[j].q_start == q_len and items[j].k_pos.shape[1] == q_len):
                j += 1
            s, e = item.q_start, items[j - 1].q_end
            out[s:e] = self._causal(query[s:e], key[s:e].to(query.dtype), value[s:e].to(query.dtype), j - i,
                                    q_len, group)
            i = j
        return out

    def _causal(self, q, k, v, n: int, q_len: int, group: int) -> torch.Tensor:
        """``n`` fresh prompts of ``q_len`` tokens each, flat ``[n * q_len, heads, d]``: one causal SDPA call.

        KV heads are repeated for the query groups: this torch build's ``enable_gqa`` path was slower."""
        qh = q.view(n, q_len, self.num_heads, self.head_size).transpose(1, 2)  # [n, heads, q_len, d]
        kh = k.view(n, q_len, self.num_kv_heads, self.head_size).transpose(1, 2)
        vh = v.view(n, q_len, self.num_kv_heads, self.head_size).transpose(1, 2)
        if group > 1:
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale)
        return out.transpose(1, 2).reshape(n * q_len, self.num_heads, self.head_size)
