"""``cpu_paged``: the CPU's default attention backend — ``torch_sdpa``'s math with the two slow CPU paths replaced.

Why (profile of a bf16 SmolLM2 step at batch 64, docs/performance.md "CPU decode"): with ``torch_sdpa`` about
40 % of a decode step was attention — a padded ``index_select`` copy of every request's context, then
``scaled_dot_product_attention`` with a mask over that copy — and a fresh prompt's prefill attention ran
SDPA with a boolean mask, ~8x slower on this torch build than the same call with ``is_causal=True``. Here:

- every row (decode rows and prefill rows alike, fresh prompts, chunks and prompts on a cached prefix) runs one
  C kernel over the paged cache itself after this step's K/V are written (``_cpu_paged_kernel.paged_rows``: no
  copy, no mask, online softmax in float32 over 16-position tiles from position 0, OpenMP over (rows of one
  request) x KV head), for float32 / bfloat16 caches;
- fp8 caches and shapes outside the kernel's limits are ``torch_sdpa`` unchanged, which is also the whole
  backend where the C compiler is missing.

Why one kernel for every row (session 6): a token's attention output is then the same bits however its prompt
was split into chunks, whether its prefix came from the prefix cache, and whichever other requests share the
step. Before, a fresh prompt ran causal SDPA and the tail of a prefix-cached prompt ran ``torch_sdpa``'s masked
SDPA over the gathered context; they agree only to rounding, and with int8 activations that rounding flipped a
near-tie token of a repeated greedy chat request (docs/quantization.md "Why opt-in again").
tests/unit/test_cpu_paged_invariance.py checks fresh == cached == chunked == decode bit for bit.

Supported like ``torch_sdpa`` minus sliding windows and logit soft caps (refused in ``supports``, so the
selection falls back to ``torch_sdpa`` for those models). Results equal ``torch_sdpa``'s to float32
rounding (sums run in another order); tests/unit/test_cpu_paged_attention.py checks both against float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo.attention import AttentionLayout
from octavo.nn.kv_quant import is_fp8
from octavo.platform import Availability
from octavo.plugins.attention import _cpu_paged_kernel as kernel
from octavo.plugins.attention.torch_sdpa import TorchSDPABackend, TorchSDPAMetadata


@dataclass
class CpuPagedMetadata(TorchSDPAMetadata):
    """``torch_sdpa``'s metadata (its path still runs fp8 caches) plus every row's request and context length."""

    tables: torch.Tensor | None = None  # int64 [num_reqs, max_blocks] block ids
    row_req: torch.Tensor | None = None  # int64 [num_tokens] request of each row
    row_len: torch.Tensor | None = None  # int64 [num_tokens] context positions row r attends to (its position + 1)
    task_row0: torch.Tensor | None = None  # int64 [tasks] first row of each kernel task (rows of one request)
    task_nrows: torch.Tensor | None = None


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

    @classmethod
    def build_metadata(cls, layout: AttentionLayout, device: torch.device) -> CpuPagedMetadata:
        md = super().build_metadata(layout, device)
        qsl = layout.query_start_loc.to(torch.int64)
        row_req = torch.repeat_interleave(torch.arange(layout.num_reqs), qsl[1:] - qsl[:-1])
        # row r's new token sits at position num_computed + (r - first row of its request): it sees that many + 1
        row_len = (layout.num_computed_tokens.to(torch.int64)[row_req] + torch.arange(row_req.shape[0])
                   - qsl[:-1][row_req] + 1)
        task_row0, task_nrows = kernel.row_tasks(qsl)
        tables = layout.block_tables.to(torch.int64).contiguous()  # once per step, not per layer
        return CpuPagedMetadata(**vars(md), tables=tables, row_req=row_req, row_len=row_len,
                                task_row0=task_row0, task_nrows=task_nrows)

    def forward(self, query, key, value, kv_cache, metadata: CpuPagedMetadata):
        if is_fp8(kv_cache.dtype) or not kernel.shape_supported(kv_cache, self.num_heads):
            return super().forward(query, key, value, kv_cache, metadata)
        kernel.write_kv(key, value, kv_cache, metadata.slot_mapping)  # [slots, kv_heads, d] rows, as index_copy_
        md = metadata
        out_dtype = query.dtype if query.dtype in (torch.float32, torch.bfloat16) else torch.float32
        return kernel.paged_rows(query, kv_cache, md.tables, md.row_req, md.row_len, md.task_row0, md.task_nrows,
                                 self.scale, out_dtype).to(query.dtype)
