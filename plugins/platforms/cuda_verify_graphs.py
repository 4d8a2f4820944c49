"""CUDA graphs for speculative-decoding verify steps: ``n`` requests x ``q`` tokens each (the last verified
token + ``q - 1`` drafts), captured next to the decode graphs of :mod:`cuda_graphs`.

Speculation runs at small batches (the batch-size policy switches it off above ``disable_by_batch_size``),
where a step's kernel launches cost most; at batch 1 every verify step is uniform (one request), so all of
them replay. The shapes come from ``ModelHandle.spec_verify_shapes`` (sizes 1, 2, 4, 8 below the policy's
limit x q = 2 .. k + 1). A step whose requests carry different draft counts, or a size not captured, runs
eagerly, as before. Padding rows are harmless by the decode graphs' construction: ``q`` tokens at positions
0.. of the null block 0 (slot 0), seq_len ``q``, which reads and writes only block 0.

Captured after the decode graphs, in their memory pool; a failure here is logged and leaves the decode
graphs in place (verify steps then run eagerly).
"""

from __future__ import annotations

import logging

import torch

from octavo.attention import AttentionLayout
from octavo.model import ForwardContext
from octavo.platform import StepInputs

logger = logging.getLogger(__name__)


class VerifyGraphsMixin:
    """Mixed into ``cuda_graphs.CUDAGraphRunner`` (decode graphs) by ``maybe_capture_cuda_graphs``: adds
    uniform verify graphs keyed ``(n, q)``. A mixin, so this module does not import cuda_graphs (no circle)."""

    def __init__(self, *args, verify_shapes=(), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        shapes = sorted({(n, q) for n, q in verify_shapes if 1 <= n <= self.max_size and q >= 2})
        self.verify_shapes = shapes
        self.verify_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.verify_outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.num_verify_replays = 0
        if not shapes:
            return
        tokens = max(n * q for n, q in shapes)
        dev = self.device
        self.v_ids = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.v_pos = torch.zeros(tokens, dtype=torch.int64, device=dev)
        self.v_slots = torch.zeros(tokens, dtype=torch.int64, device=dev)
        n_max = max(n for n, _ in shapes)
        self.v_qsl = {q: torch.arange(n_max + 1, dtype=torch.int32, device=dev) * q for _, q in shapes}

    def _verify_layout(self, n: int, q: int) -> AttentionLayout:
        return AttentionLayout(
            query_start_loc=self.v_qsl[q][: n + 1], seq_lens=self.seq_lens[:n], num_computed_tokens=self.num_computed[:n],
            block_tables=self.block_tables[:n], slot_mapping=self.v_slots[: n * q], block_size=self.block_size,
            max_query_len=q, max_seq_len=self.max_model_len, num_decode_reqs=0)

    def _check_verify_safe(self, metadata, q: int) -> None:
        static = [self.v_qsl[q], self.seq_lens, self.num_computed, self.block_tables, self.v_slots]
        spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in static]
        values = vars(metadata).values() if hasattr(metadata, "__dict__") else [
            getattr(metadata, f) for f in getattr(metadata, "__dataclass_fields__", {})]
        for v in values:
            if isinstance(v, torch.Tensor) and not any(lo <= v.data_ptr() < hi for lo, hi in spans):
                raise RuntimeError("the attention backend copies its metadata; verify graphs would read stale inputs")

    @torch.inference_mode()
    def capture(self) -> None:
        super().capture()
        if not self.verify_shapes:
            return
        try:
            for n, q in sorted(self.verify_shapes, reverse=True):
                self.seq_lens[:n].fill_(q)  # a valid layout for the warm-up: q new tokens, nothing cached
                layout = self._verify_layout(n, q)
                metadata = self.attn_backend_cls.build_metadata(layout, self.device)
                self._check_verify_safe(metadata, q)
                ctx = ForwardContext(attn_metadata=metadata, query_start_loc=layout.query_start_loc)
                ids, pos = self.v_ids[: n * q], self.v_pos[: n * q]
                self.model(ids, pos, ctx)  # warm-up outside the graph
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    out = self.model(ids, pos, ctx)
                self.verify_graphs[(n, q)], self.verify_outputs[(n, q)] = graph, out
                self.metadata[(n, q)] = metadata
            torch.cuda.synchronize(self.device)
            logger.info("Captured %d CUDA graphs for speculative verify steps (requests x tokens: %s)",
                        len(self.verify_graphs), sorted(self.verify_graphs))
        except Exception as e:  # decode graphs stay; verify steps run eagerly
            logger.warning("CUDA graph capture of verify steps failed (%s: %s); they run eagerly",
                           type(e).__name__, e)
            self.verify_graphs.clear()
            self.verify_outputs.clear()
        finally:
            self.seq_lens.fill_(1)

    def maybe_run(self, inputs: StepInputs, ctx: ForwardContext | None = None) -> torch.Tensor | None:
        out = super().maybe_run(inputs, ctx)
        if out is not None or not self.verify_graphs:
            return out
        layout = inputs.layout
        n, total = layout.num_reqs, layout.num_tokens
        q = layout.max_query_len
        if q < 2 or n * q != total or layout.max_seq_len > self.max_model_len:
            return None  # mixed: prefills, or requests with different draft counts
        size = next((m for m, qq in self.verify_shapes if qq == q and m >= n and (m, q) in self.verify_graphs), None)
        if size is None:
            return None
        width = layout.block_tables.shape[1]
        self.v_ids[:total].copy_(inputs.input_ids, non_blocking=True)
        self.v_pos[:total].copy_(inputs.positions, non_blocking=True)
        self.v_slots[:total].copy_(layout.slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(layout.seq_lens, non_blocking=True)
        self.num_computed[:n].copy_(layout.num_computed_tokens, non_blocking=True)
        self.block_tables[:n, :width].copy_(layout.block_tables, non_blocking=True)
        if size > n:  # padding rows: q tokens at positions 0.. of the null block
            self.v_ids[total:size * q].zero_()
            self.v_pos[total:size * q].zero_()
            self.v_slots[total:size * q].zero_()
            self.seq_lens[n:size].fill_(q)
            self.num_computed[n:size].zero_()
            self.block_tables[n:size, 0].zero_()
        self.verify_graphs[(size, q)].replay()
        self.num_verify_replays += 1
        return self.verify_outputs[(size, q)][:total]
