"""A compiled CPU decode step: the whole model forward of a decode-only batch as one inductor (C++) graph.

Why: at batch 1 a SmolLM2-sized model runs ~1,500 small aten ops per step (a bf16 RMSNorm alone is ~15:
casts, pow, mean, rsqrt, mul), each paying Python and dispatcher cost; the weights are only ~70-270 MB.
``torch.compile`` (inductor's C++/OpenMP backend) fuses every norm, residual add, rotary and SiLU-and-mul
into a few loops, and the paged attention of decode rows is written here in plain tensor ops that compile
into the same graph, so a step is one call instead of ~30 graph pieces between eager attention calls.

What it runs: steps whose requests all decode one token (``num_decode_reqs == num_reqs``, no drafts), at
most ``max_batch`` of them. Everything else (prefill chunks, mixed steps, LoRA, images) returns ``None``
and runs eagerly, so the compiled path is only ever a faster copy of the eager decode math:

    cache write   k_cache[slot] = k           (index_put into the layer's cache, in place)
    context       whole blocks of each request, ``index_select`` over its block ids (``nb`` blocks, rounded
                  up to a multiple of ``BLOCK_ROUND``; rows past ``seq_len`` are masked with -inf)
    attention     ``scaled_dot_product_attention`` over ``[B, kv_heads, g, d]`` queries (GQA grouped)

Graph breaks are allowed: model code dynamo cannot trace (a ctypes kernel, say) runs eagerly between
compiled pieces, correct but with less fused; to stay inside the one graph such a kernel should be a
``torch.library.custom_op`` with a fake (meta) implementation.

Shapes: the batch and the context-block dimensions are marked dynamic, so one graph serves every decode
batch of size >= 2 and another (dynamo specialises size 1) batch 1; the context grows without recompiling.
Compiled code is cached on disk by inductor (its FX graph cache, under ``TORCHINDUCTOR_CACHE_DIR``), so a
second process pays tracing but not C++ compilation. The attention layers keep their bound backend: this
runner wraps each layer's ``impl`` in :class:`_DecodeOrEager`, which takes the compiled-friendly path only
for this runner's own metadata type and otherwise calls the original backend unchanged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from octavo.attention import AttentionLayout
from octavo.model import ForwardContext
from octavo.platform import StepInputs

logger = logging.getLogger(__name__)

#: decode batches up to this size run compiled (the platform's default). Batch 1 is measured 1.3-1.6x faster
#: than eager; the dynamic-batch graph (n >= 2) ran a 64 x 128/128 offline workload at 36 tok/s, several
#: times slower than eager (docs/performance.md), so it stays off until that is understood.
MAX_COMPILED_BATCH = 1
#: context blocks are gathered in multiples of this (fewer distinct shapes, never the 0/1 sizes).
BLOCK_ROUND = 8


@dataclass
class CpuDecodeMetadata:
    """Per-step tensors of a decode-only batch (all plain tensors, so the compiled graph takes them as inputs)."""

    kv_slots: torch.Tensor  # int64 [2B] rows of the layer's cache viewed [2 * slots, kv_heads, d]: K then V
    block_ids: torch.Tensor  # int64 [B, nb] first nb blocks of each row (past its last: its last, masked)
    bias: torch.Tensor  # float [B, 1, 1, nb * block_size] 0 for visible context rows, -inf past seq_len


@dataclass
class _Inputs:
    """The fields of :class:`~octavo.platform.StepInputs` this runner reads (for the warm-up step)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    layout: AttentionLayout


class _DecodeOrEager:
    """Wraps one layer's attention backend: decode metadata of this runner -> tensor ops; anything else -> the
    original backend's ``forward``. Attribute reads fall through to the wrapped backend."""

    def __init__(self, impl) -> None:
        self.impl = impl
        self.num_heads, self.num_kv_heads, self.head_size = impl.num_heads, impl.num_kv_heads, impl.head_size
        self.scale = impl.scale

    def __getattr__(self, name):
        return getattr(self.impl, name)

    def forward(self, query, key, value, kv_cache, metadata):
        if not isinstance(metadata, CpuDecodeMetadata):
            return self.impl.forward(query, key, value, kv_cache, metadata)
        b, kvh, d = query.shape[0], self.num_kv_heads, self.head_size
        k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, kv_heads, d]
        bs = k_cache.shape[1]
        # one index_put over both halves of the layer's cache: inductor writes it in place (two writes into
        # two views of one base made it copy the whole cache every step)
        kv_cache.view(-1, kvh, d)[metadata.kv_slots] = torch.cat([key, value]).to(kv_cache.dtype)
        ids = metadata.block_ids.reshape(-1)
        ctx = metadata.block_ids.shape[1] * bs
        k = k_cache.index_select(0, ids).view(b, ctx, kvh, d).to(query.dtype).transpose(1, 2)  # [B, kvh, L, d]
        v = v_cache.index_select(0, ids).view(b, ctx, kvh, d).to(query.dtype).transpose(1, 2)
        q = query.view(b, kvh, self.num_heads // kvh, d)  # [B, kvh, g, d]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=metadata.bias, scale=self.scale)
        return out.reshape(b, self.num_heads, d)


def supports_compiled_decode(model: torch.nn.Module) -> str | None:
    """``None`` when every attention layer can run the compiled decode path, else the reason it cannot."""
    layers = [m for m in model.modules() if hasattr(m, "bind") and hasattr(m, "num_kv_heads")]
    if not layers:
        return "the model has no paged attention layers"
    for layer in layers:
        if layer.impl is None:
            return f"{layer.prefix}: no attention backend bound"
        if layer.sliding_window is not None or layer.logits_soft_cap is not None:
            return f"{layer.prefix} uses a sliding window or a logits soft cap; the compiled decode path covers " \
                   "plain causal attention only"
        cache = layer.kv_cache
        if cache is None or cache.dim() != 5 or cache.shape[0] != 2 or tuple(cache.shape[3:]) != (
                layer.num_kv_heads, layer.head_size):
            return f"{layer.prefix}: the KV cache is not laid out [2, blocks, block_size, kv_heads, head_size]"
        if cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return f"{layer.prefix}: an fp8 KV cache (kv_cache_dtype); the compiled path reads unscaled caches only"
    from octavo.nn.parallel import get_tp_size

    if get_tp_size() > 1:
        return "tensor parallelism (the compiled graph would hold the collectives); use tensor_parallel_size=1"
    return None


class CpuCompiledDecodeRunner:
    """:class:`octavo.platform.StepRunner` running decode-only steps through one ``torch.compile``d forward."""

    def __init__(self, model: torch.nn.Module, block_size: int, max_batch: int, dtype: torch.dtype,
                 mode: str | None = None, backend: str = "inductor", fullgraph: bool = False) -> None:
        self.model = model
        self.block_size = block_size
        self.max_batch = max_batch
        self.dtype = dtype
        self.layers = [m for m in model.modules() if hasattr(m, "bind") and hasattr(m, "num_kv_heads")]
        for layer in self.layers:
            if not isinstance(layer.impl, _DecodeOrEager):
                layer.impl = _DecodeOrEager(layer.impl)
        # graph breaks allowed (see above); tests trace with backend="eager", fullgraph=True (one graph, no codegen)
        self._compiled = torch.compile(self._forward, dynamic=None, mode=mode, backend=backend, fullgraph=fullgraph)
        self.num_runs = 0
        self.compile_seconds: dict[str, float] = {}

    def _forward(self, input_ids, positions, slot_mapping, block_ids, seq_lens):
        ctx_len = block_ids.shape[1] * self.block_size
        visible = torch.arange(ctx_len, device=seq_lens.device)[None, :] < seq_lens[:, None]  # [B, L]
        bias = torch.zeros(visible.shape, dtype=self.dtype).masked_fill(~visible, float("-inf"))
        num_slots = self.layers[0].kv_cache.shape[1] * self.block_size
        md = CpuDecodeMetadata(torch.cat([slot_mapping, slot_mapping + num_slots]), block_ids, bias[:, None, None, :])
        return self.model(input_ids, positions, ForwardContext(attn_metadata=md))

    def metadata_tensors(self, layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(slot_mapping [B], block_ids [B, nb], seq_lens [B]) int64 for a decode-only layout."""
        bs = self.block_size
        lens = layout.seq_lens.to(torch.int64)
        nb = -(-int(layout.max_seq_len) // bs)
        nb = -(-nb // BLOCK_ROUND) * BLOCK_ROUND
        tables = layout.block_tables.to(torch.int64)
        idx = torch.minimum(torch.arange(nb, dtype=torch.int64)[None, :], ((lens - 1) // bs)[:, None])
        if tables.shape[1] < nb:  # table narrower than the rounded width: clamp keeps indices inside it
            idx = idx.clamp(max=tables.shape[1] - 1)
        return layout.slot_mapping.to(torch.int64), torch.gather(tables, 1, idx), lens

    def warm_up(self) -> dict[str, float]:
        """Compile both graphs now (batch 1, and the dynamic batch when ``max_batch >= 2``), so the first
        request does not pay for it. The dummy rows write only into the null block 0 (never allocated)."""
        for n in (1, 2) if self.max_batch >= 2 else (1,):
            ids = torch.zeros(n, dtype=torch.int64)
            layout = AttentionLayout(
                query_start_loc=torch.arange(n + 1, dtype=torch.int32), seq_lens=torch.ones(n, dtype=torch.int32),
                num_computed_tokens=torch.zeros(n, dtype=torch.int32),
                block_tables=torch.zeros(n, 1, dtype=torch.int32), slot_mapping=torch.zeros(n, dtype=torch.int64),
                block_size=self.block_size, max_query_len=1, max_seq_len=1, num_decode_reqs=n)
            with torch.inference_mode():
                self.maybe_run(_Inputs(ids, ids.clone(), layout))
        self.num_runs = 0
        return dict(self.compile_seconds)

    def maybe_run(self, inputs: StepInputs) -> torch.Tensor | None:
        layout = inputs.layout
        n = int(inputs.input_ids.shape[0])
        if n == 0 or n > self.max_batch or layout.num_decode_reqs != n or layout.query_start_loc.shape[0] != n + 1:
            return None
        slots, block_ids, lens = self.metadata_tensors(layout)
        if n > 1:
            for t in (inputs.input_ids, inputs.positions, slots, block_ids, lens):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(block_ids, 1)
        key = "batch1" if n == 1 else "batchN"
        first = key not in self.compile_seconds
        t0 = time.perf_counter()
        out = self._compiled(inputs.input_ids, inputs.positions, slots, block_ids, lens)
        if first:
            self.compile_seconds[key] = time.perf_counter() - t0
            logger.info("compiled the CPU decode step (%s) in %.1f s", key, self.compile_seconds[key])
        self.num_runs += 1
        return out
