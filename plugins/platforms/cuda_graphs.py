"""CUDA graphs for decode steps: capture the model's forward at a set of batch sizes, replay padded batches.

A decode step of an 8B model launches hundreds of small kernels; at batch 1 their launch gaps cost more
than the kernels. The runner captures ``model(input_ids, positions, ctx)`` once per size in
``capture_sizes`` (one shared memory pool, largest first) over static device buffers, and for a decode-only
step of ``n`` requests picks the smallest captured size ``>= n``, copies the step's inputs into the static
buffers and replays. Padding rows are harmless by construction::

    row i < n   : the real request  (its ids, position, seq_len, block-table row, slot)
    row i >= n  : seq_len 1, block-table row of 0s, slot 0  -> reads/writes only the null block 0

The attention metadata is built once per size from a layout whose tensors *are* the static buffers; a
backend whose ``build_metadata`` returns those same tensors (``Tensor.to`` on a matching tensor does) is
graph-safe; any other backend is detected at capture time and the engine stays eager. Only device work
is replayed: the metadata's Python fields (``max_query_len=1``, ``max_seq_len=max_model_len`` as an upper
bound) are fixed per captured size.

The runner is an :class:`octavo.platform.StepRunner`: the cuda platform's ``prepare_model`` returns it in a
:class:`~octavo.platform.PreparedModel`, the core installs it, and the model runner calls
:meth:`CUDAGraphRunner.maybe_run` first on every step (``None`` means "run eagerly"). Everything here works
from the :class:`~octavo.platform.ModelHandle`; no core object is read or written.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from octavo.attention import AttentionLayout
from octavo.model import ForwardContext
from octavo.platform import ModelHandle, PreparedModel, StepInputs

logger = logging.getLogger(__name__)


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8 and then every multiple of 8 (16 past 256) up to ``max_num_seqs`` (at most 512)."""
    top = min(max_num_seqs, 512)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top, 256) + 1, 8)) + \
        list(range(272, top + 1, 16))
    if top not in sizes:
        sizes.append(top)
    return sorted(set(sizes))


def prepare_gpu_model(handle: ModelHandle, *, graphs: bool = True) -> PreparedModel:
    """GPU set-up after the KV cache is bound: fused small-op kernels, then CUDA graphs for decode.

    Fusions need Triton (skipped with a log line without it) and swap kernels into the model's ``octavo.nn``
    layers; graphs honour ``enforce_eager`` and need ``graphs`` (the platform's capability flag).
    """
    notes: dict = {"fused": None, "graph_sizes": []}
    if not graphs or handle.device.type == "cpu":
        return PreparedModel(notes=notes)
    try:
        from octavo.plugins.platforms.cuda_fusions import fuse_model

        notes["fused"] = fuse_model(handle.model, handle.dtype, handle.device)
        from octavo.plugins.platforms.cuda_moe import install_moe_kernels  # FusedMoE -> Triton (docs/moe.md)

        notes["moe"] = install_moe_kernels(handle.model, handle.dtype, handle.device)
        from octavo.plugins.platforms.cuda_head_gemv import install_head_gemv  # OCTAVO_HEAD_GEMV (default 1)

        notes["fused"].update(install_head_gemv(handle.model, handle.dtype, handle.device))
    except ImportError as e:
        logger.info("fused GPU kernels unavailable (%s); eager small ops", e)
    from octavo.nn.parallel import get_tp_size

    if get_tp_size() > 1:  # all-reduce + RMSNorm (issue 12; it reads OCTAVO_TP_ALLREDUCE_FUSE_NORM / _GEMV_PUSH)
        from octavo.plugins.platforms.cuda_allreduce_fusion import maybe_fuse_all_reduce_norm

        notes["allreduce_norm"] = maybe_fuse_all_reduce_norm(handle, CUDAGraphRunner)
    runner = maybe_capture_cuda_graphs(handle)
    notes["graph_sizes"] = runner.capture_sizes if runner else []
    return PreparedModel(step_runner=runner, notes=notes)


def maybe_capture_cuda_graphs(handle: ModelHandle) -> CUDAGraphRunner | None:
    """A captured :class:`CUDAGraphRunner`, or ``None`` when graphs are off or unsupported.

    Off when ``enforce_eager`` is set or the model has no paged attention; a failed capture is logged and
    never fatal (the engine then runs eagerly).
    """
    if handle.enforce_eager or handle.attn_backend is None:
        return None
    args = (handle.model, handle.attn_backend, handle.device, handle.block_size, handle.max_model_len,
            default_capture_sizes(handle.max_num_seqs))
    if getattr(handle, "spec_verify_shapes", ()):  # speculative decoding: verify steps too (cuda_verify_graphs.py)
        from octavo.plugins.platforms.cuda_verify_graphs import VerifyGraphsMixin

        runner = type("SpecCUDAGraphRunner", (VerifyGraphsMixin, CUDAGraphRunner), {})(
            *args, verify_shapes=handle.spec_verify_shapes)
    else:
        runner = CUDAGraphRunner(*args)
    from octavo.plugins.platforms.cuda_graph_head import make_graph_head

    runner.head = make_graph_head(  # LM head + sampler graphs (issue 17), captured with the body's
        handle.model, handle.device, runner.capture_sizes)
    from octavo.plugins.platforms.cuda_step_graph import make_step_graph

    # batch-1 greedy step in one graph (OCTAVO_GRAPH_STEP); a speculator's steps never take it (core/step_head.py)
    runner.step_graph = make_step_graph(runner, runner.head, speculator=bool(getattr(handle, "spec_verify_shapes", ())))
    try:
        runner.capture()
    except Exception as e:  # an uncapturable model or backend must not stop the engine
        logger.warning("CUDA graph capture failed (%s: %s); running eagerly. Pass --enforce-eager to skip "
                       "the attempt.", type(e).__name__, e)
        return None
    return runner


class CUDAGraphRunner:
    """Captured decode forwards, one per batch size, replayed over padded static inputs."""

    def __init__(self, model, attn_backend_cls, device: torch.device, block_size: int, max_model_len: int,
                 capture_sizes: list[int]) -> None:
        self.model = model
        self.attn_backend_cls = attn_backend_cls
        self.device = device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.capture_sizes = sorted(capture_sizes)
        self.max_size = self.capture_sizes[-1]
        n, width = self.max_size, -(-max_model_len // block_size)
        # static inputs, shared by every captured size (a size uses the leading rows)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)  # one token per row
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.num_computed = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=device)
        self.slot_mapping = torch.zeros(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.metadata: dict[int, object] = {}
        self.pool = None
        self.head = None  # cuda_graph_head.GraphHead: LM head + sampler graphs replayed after the body's
        self.step_graph = None  # cuda_step_graph.StepGraph: inputs + body + greedy head of one row in one graph
        self.num_replays = 0
        self.capture_seconds, self.capture_bytes = 0.0, 0

    # --- capture -------------------------------------------------------------------------------------
    def _layout(self, size: int) -> AttentionLayout:
        return AttentionLayout(
            query_start_loc=self.query_start_loc[: size + 1], seq_lens=self.seq_lens[:size],
            num_computed_tokens=self.num_computed[:size], block_tables=self.block_tables[:size],
            slot_mapping=self.slot_mapping[:size], block_size=self.block_size, max_query_len=1,
            max_seq_len=self.max_model_len, num_decode_reqs=size)

    def _check_graph_safe(self, metadata, layout: AttentionLayout) -> None:
        """Every tensor in the metadata must be one of the static buffers (or a view of one)."""
        static = [self.query_start_loc, self.seq_lens, self.num_computed, self.block_tables, self.slot_mapping]
        spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in static]
        values = ([getattr(metadata, f.name) for f in dataclasses.fields(metadata)]
                  if dataclasses.is_dataclass(metadata) else list(vars(metadata).values()))
        for v in values:
            if isinstance(v, torch.Tensor) and not any(lo <= v.data_ptr() < hi for lo, hi in spans):
                raise RuntimeError(f"attention backend {getattr(self.attn_backend_cls, 'name', '?')} copies its "
                                   "metadata in build_metadata, so a replayed graph would read stale inputs")

    @torch.inference_mode()
    def capture(self) -> None:
        t0 = time.perf_counter()
        torch.cuda.empty_cache()  # torch.cuda.graph() empties the cache too; measure from the same state
        free_before = torch.cuda.mem_get_info(self.device)[0]
        self.pool = torch.cuda.graph_pool_handle()
        for size in sorted(self.capture_sizes, reverse=True):
            layout = self._layout(size)
            metadata = self.attn_backend_cls.build_metadata(layout, self.device)
            self._check_graph_safe(metadata, layout)
            ctx = ForwardContext(attn_metadata=metadata, query_start_loc=layout.query_start_loc)
            ids, pos = self.input_ids[:size], self.positions[:size]
            self.model(ids, pos, ctx)  # warm-up: Triton compiles, cuBLAS picks kernels, outside the graph
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.model(ids, pos, ctx)
            self.graphs[size], self.outputs[size], self.metadata[size] = graph, out, metadata
            if self.head is not None and size <= self.head.max_size:
                try:  # reads ``out``; captured before smaller sizes reuse the pool's memory
                    self.head.capture(size, out, self.pool)
                except Exception as e:  # the head graphs are optional: the eager head stays
                    logger.warning("LM head graph capture failed (%s: %s); eager LM head and sampler",
                                   type(e).__name__, e)
                    self.head = None
        if self.step_graph is not None:
            try:  # last: after the one-row body graph (and the head's greedy graph: their kernels are built)
                self.step_graph.capture(self.pool)
            except Exception as e:  # optional, as the head graphs: the body + head graphs stay
                logger.warning("one-graph batch-1 step capture failed (%s: %s); body and head graphs as before",
                               type(e).__name__, e)
                self.step_graph = None
        torch.cuda.synchronize(self.device)
        self.capture_bytes = free_before - torch.cuda.mem_get_info(self.device)[0]
        self.capture_seconds = time.perf_counter() - t0
        logger.info("Captured CUDA graphs for %d decode batch sizes (1..%d) in %.1f s, %.0f MiB%s",
                    len(self.graphs), self.max_size, self.capture_seconds, self.capture_bytes / 2**20,
                    f"; LM head + sampler graphs up to {self.head.max_size} rows" if self.head else "")

    # --- replay --------------------------------------------------------------------------------------
    def can_run(self, layout: AttentionLayout) -> bool:
        return (layout.max_query_len == 1 and layout.num_reqs <= self.max_size
                and layout.num_tokens == layout.num_reqs and layout.max_seq_len <= self.max_model_len)

    def padded_size(self, n: int) -> int:
        for size in self.capture_sizes:
            if size >= n:
                return size
        raise ValueError(n)

    def maybe_run(self, inputs: StepInputs, ctx: ForwardContext | None = None) -> torch.Tensor | None:
        """Replay the graph for this step if it is a decode-only batch that fits; else ``None``.

        ``inputs`` needs ``input_ids``/``positions`` (device, ``[n]``) and ``layout`` (host tensors).
        Returns ``[n, hidden]``, a view of the graph's output buffer valid until the next replay.
        """
        layout = inputs.layout
        if not self.graphs or not self.can_run(layout):
            return None
        n = layout.num_reqs
        size = self.padded_size(n)
        width = layout.block_tables.shape[1]
        staged = getattr(inputs, "device_layout", None)  # the step's rows already on the device (core/step_staging.py)
        if staged is None:
            self.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)
            self.positions[:n].copy_(inputs.positions, non_blocking=True)
            self.seq_lens[:n].copy_(layout.seq_lens, non_blocking=True)
            self.num_computed[:n].copy_(layout.num_computed_tokens, non_blocking=True)
            self.block_tables[:n, :width].copy_(layout.block_tables, non_blocking=True)
            self.slot_mapping[:n].copy_(layout.slot_mapping, non_blocking=True)
        else:  # device to device: the dense rows in one multi-tensor copy per dtype, last, so the graph follows a
            # kernel rather than a memcpy (s12 b1 trace: ~41 us of GPU idle between a copy and the graph's first kernel)
            self.block_tables[:n, :width].copy_(staged.block_tables, non_blocking=True)
            torch._foreach_copy_([self.seq_lens[:n], self.num_computed[:n]], [staged.seq_lens, staged.num_computed_tokens])
            torch._foreach_copy_([self.input_ids[:n], self.positions[:n], self.slot_mapping[:n]],
                                 [inputs.input_ids, inputs.positions, staged.slot_mapping])
        if size > n:  # padding rows: one token at position 0 of the null block
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.seq_lens[n:size].fill_(1)
            self.num_computed[n:size].zero_()
            self.block_tables[n:size, 0].zero_()
            self.slot_mapping[n:size].zero_()
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size][:n]
