"""A batch-1 greedy decode step as ONE CUDA graph: the step's inputs, the body, the LM head and the argmax (session 16,
issue 9's ``decode_bs1_strict_fraction_of_roofline``; ``OCTAVO_GRAPH_STEP=1``; with or without the head graphs,
``OCTAVO_GRAPH_HEAD``: it uses a ``GraphHead``'s greedy path and id buffer, the runner's or its own).

Why: at batch 1 a token outside the body graph was the LM head's GEMV (0.333 ms of 1.05 GB, at the copy rate) plus
~20 small device ops, each a few us on the GPU's timeline with a gap before the next (c0 of session 16: 12 pageable
host-to-device copies, ~16 copy kernels, a gather, the float cast, the argmax, one device-to-host copy; ~0.06-0.13 ms a
token). Here a step is one pinned host-to-device copy of a packed row, one graph replay, and the copy of the id back:

    stage row (int64): use_prev, host id, position, seq_len, num_computed, slot, n blocks, block ids...
    graph: _fill_step_kernel (stage row -> the body graph's static inputs; the input id is the previous step's
           sampled id, read on the device from GraphHead.sampled, or the host's) -> model -> logits -> argmax_rows
           -> GraphHead.sampled[0]

The same bits as the body graph + the greedy head graph of size 1 (same kernels, same static buffers, same order; the
fill writes what the body graph's copies write). Which steps take it is the core's decision (core/step_head.py
``step_graph_source``: one request, one token, greedy without logprobs / penalties / grammar / LoRA, the input id from
the host or from row 0 of the previous step's ids in ``GraphHead.sampled``); every other step runs as before.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_choice, env_switch

logger = logging.getLogger(__name__)

# On by default since session 16's call 1 (H100, 8B fp8 + fp8 KV, the headline's engine, benchmarks/head16_ab.py, 4
# alternating pairs): the device step 3.315 -> 3.254 ms (-60 us: outside the body graph 384 -> 348 us of ops, idle
# 37 -> 15 us), greedy tokens equal in every measure, its GPU tests passed. OCTAVO_GRAPH_STEP=0 turns it off.
DEFAULT_ON = True
# OCTAVO_GRAPH_STEP_RAW_ARGMAX (session 17): on by default since its call 2 (H200, the headline's engine, 4 alternating
# pairs, benchmarks/head16_ab.py step / step_raw): device step -0.7 / -2.2 / -2.8 / -8.1 us (ops outside the body graph
# 244.6 -> 241.0 us: the cast 3.9 and the copy node 1.4 gone, the argmax over 16-bit values 1.6 us slower), greedy
# tokens equal in every measure, its GPU test passed. By default it acts only where it can (compute_logits is exactly
# the float cast of the head's 16-bit logits, checked at start); an explicit 1 elsewhere is refused; 0 turns it off.
RAW_ARGMAX_DEFAULT = True
FIXED = 7  # the stage row's fixed fields (module docstring), then the block ids
SLOTS = 4  # pinned host rows (and zero-copy graphs), used in turn: reused only after their last use ran (its event)


@triton.jit
def _fill_step_kernel(stage_ptr, prev_ptr, ids_ptr, pos_ptr, seq_ptr, nc_ptr, slot_ptr, bt_ptr, W,
                      BLOCK: tl.constexpr):
    """One program: the stage row into the body graph's static inputs of row 0 (block ids 0..n-1 of its table row;
    the rest keep what they held, as the plain path's copy of the step's columns leaves them)."""
    use_prev = tl.load(stage_ptr)
    host_id = tl.load(stage_ptr + 1)
    prev = tl.load(prev_ptr)
    tl.store(ids_ptr, tl.where(use_prev != 0, prev, host_id))
    tl.store(pos_ptr, tl.load(stage_ptr + 2))
    tl.store(seq_ptr, tl.load(stage_ptr + 3).to(tl.int32))
    tl.store(nc_ptr, tl.load(stage_ptr + 4).to(tl.int32))
    tl.store(slot_ptr, tl.load(stage_ptr + 5))
    nb = tl.load(stage_ptr + 6)
    for start in range(0, W, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < nb
        tl.store(bt_ptr + offs, tl.load(stage_ptr + 7 + offs, mask=m, other=0).to(tl.int32), mask=m)


def fill_step_torch(stage, prev, ids, pos, seq, nc, slot, bt) -> None:
    """What :func:`_fill_step_kernel` writes, in torch (the CPU proxy's fill; the kernel's reference in tests)."""
    row = stage.tolist()
    ids[0] = prev[0] if row[0] != 0 else row[1]
    pos[0], seq[0], nc[0], slot[0] = row[2], row[3], row[4], row[5]
    nb = row[6]
    bt[0, :nb] = stage[FIXED:FIXED + nb].to(bt.dtype)


@triton.jit
def _publish_kernel(src_ptr, dst_ptr):
    """The step's id into its slot of pinned host memory (zero-copy: no device-to-host copy node)."""
    tl.store(dst_ptr, tl.load(src_ptr))


class StepGraph:
    """The one-graph batch-1 step over a ``CUDAGraphRunner``'s static buffers and a ``GraphHead``'s greedy path.

    Zero-copy mode (``OCTAVO_GRAPH_STEP_ZERO_COPY=1``, opt-in): :data:`SLOTS` graphs, graph k's fill reading the stage
    row straight from pinned host row k and its last kernel writing the id into pinned host slot k, so a step is one
    replay and nothing else on the stream; a row or slot is reused only after its graph's previous replay finished
    (its event), and a slot's id is read by the host (the step's ``DeferredOutput``) before the step SLOTS later
    (under async scheduling the core completes step N before N + 2 runs). These graphs also take the argmax of the
    head's 16-bit logits where ``compute_logits`` is exactly their float cast (checked on random rows; the argmax
    converts each value to fp32 as it loads it: the same answer) and write it into the id buffer directly: no cast
    kernel, no copy node (session 16 call 1: 3.9 + 1.3 us and their gaps)."""

    def __init__(self, runner, head) -> None:
        self.runner, self.head = runner, head
        self.device = runner.device
        self.width = runner.block_tables.shape[1]
        self.max_model_len = runner.max_model_len
        n = FIXED + self.width
        self.stage = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.stage[3] = self.stage[6] = 1  # seq_len 1, one block: the null block 0 (the warm-up's row)
        pin = self.device.type == "cuda"
        self.rows = [torch.zeros(n, dtype=torch.int64, pin_memory=pin) for _ in range(SLOTS)]
        for row in self.rows:
            row[3] = row[6] = 1
        self.ids_host = torch.zeros(SLOTS, dtype=torch.int64, pin_memory=pin)
        self.events: list = [None] * SLOTS
        self.next = 0
        self.graph = None
        self.hidden: torch.Tensor | None = None
        self.zc = env_switch("OCTAVO_GRAPH_STEP_ZERO_COPY", default=False)  # capture the zero-copy graphs too
        self.zc_graphs: list = []
        self.zc_hidden: list = []
        self.zero_copy = True  # use them when captured (benchmarks switch it)
        # the copy graph too takes the argmax of the head's 16-bit logits into the id buffer (no cast kernel, no copy
        # node), as the zero-copy graphs do (OCTAVO_GRAPH_STEP_RAW_ARGMAX, :data:`RAW_ARGMAX_DEFAULT`; make_step_graph
        # turns it off where it cannot act)
        self.raw = raw_argmax_setting()[0]
        self.raw_logits = None  # the head's 16-bit logits method, where compute_logits = its cast (zero-copy / raw)
        self.active = True
        self.replays = 0
        self.from_prev = 0  # replays whose input id was the previous step's, read on the device

    def holds(self, ids: torch.Tensor) -> bool:
        """Whether ``ids`` (a step's sampled ids) is row 0 on of ``GraphHead.sampled`` (the graph reads it there)."""
        return ids.device == self.head.sampled.device and ids.data_ptr() == self.head.sampled.data_ptr()

    def fill(self, row: torch.Tensor) -> None:
        r = self.runner
        args = (row, self.head.sampled, r.input_ids, r.positions, r.seq_lens, r.num_computed, r.slot_mapping,
                r.block_tables)
        if self.device.type == "cuda":  # (a pinned host row is read through its mapped address)
            _fill_step_kernel[(1,)](*args, self.width, BLOCK=256, num_warps=1)
        else:
            fill_step_torch(*args)

    def step(self, k: int | None = None) -> torch.Tensor:
        """The captured function: fill (from the device stage row, or pinned row ``k``), the body at one row, the
        greedy head into ``GraphHead.sampled[0]`` (and, zero-copy, into pinned slot ``k``)."""
        self.fill(self.stage if k is None else self.rows[k])
        if k is None or self.raw_logits is None:
            out = self.body_head()
        else:
            from octavo.model import ForwardContext

            r = self.runner
            ctx = ForwardContext(attn_metadata=r.metadata[1], query_start_loc=r.query_start_loc[:2])
            out = r.model(r.input_ids[:1], r.positions[:1], ctx)
            self.head._argmax(self.raw_logits(out), out=self.head.sampled[:1])
        if k is not None:
            if self.device.type == "cuda":
                _publish_kernel[(1,)](self.head.sampled, self.ids_host[k:], num_warps=1)
            else:
                self.ids_host[k] = self.head.sampled[0]
        return out

    def body_head(self) -> torch.Tensor:
        from octavo.model import ForwardContext

        r = self.runner
        ctx = ForwardContext(attn_metadata=r.metadata[1], query_start_loc=r.query_start_loc[:2])
        out = r.model(r.input_ids[:1], r.positions[:1], ctx)
        if self.raw and self.raw_logits is not None:  # the same id: the argmax reads each 16-bit value as fp32
            self.head._argmax(self.raw_logits(out), out=self.head.sampled[:1])
        else:
            self.head.sampled[:1].copy_(self.head._greedy(out))
        return out

    def _capture_one(self, fn, pool):
        """``(graph, output)`` of ``fn`` captured in ``pool`` after one warm-up run outside the graph."""
        fn()  # warm-up (the fill kernel builds; the null-block row)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
        return graph, out

    def _raw_logits(self):
        """The head's 16-bit logits as a function of the hidden row, where ``compute_logits`` is exactly its fp32 cast
        (random rows, bitwise) and the argmax takes an ``out``; else None (the zero-copy graphs then run
        :meth:`body_head`)."""
        import inspect

        head = getattr(self.runner.model, "lm_head", None)
        method = getattr(head, "logits_method", None)
        if head is None or getattr(head, "bias", None) is not None or "out" not in inspect.signature(
                self.head._argmax).parameters:
            return None
        vocab = head.num_embeddings

        def raw(h):
            y = method.apply(head, h, None) if method is not None else torch.nn.functional.linear(h, head.weight)
            return y[..., :vocab]

        gen = torch.Generator(device=self.device).manual_seed(0)
        for _ in range(2):
            h = torch.randn(1, head.embedding_dim, generator=gen, device=self.device).to(head.weight.dtype)
            if not torch.equal(self.runner.model.compute_logits(h), raw(h).float()):
                return None
        return raw

    @torch.inference_mode()
    def capture(self, pool) -> None:
        """The copy graph (and the zero-copy graphs); again after ``raw`` is switched (benchmarks)."""
        self.raw_logits = self._raw_logits() if self.zc or self.raw else None
        if self.raw and self.raw_logits is None:
            raise ValueError("OCTAVO_GRAPH_STEP_RAW_ARGMAX=1: this model's compute_logits is not the float cast of its "
                             "LM head's logits (or the argmax takes no out=); unset it")
        self.graph, self.hidden = self._capture_one(self.step, pool)
        self.zc_graphs, self.zc_hidden = [], []
        if self.zc:
            for k in range(SLOTS):
                g, out = self._capture_one(lambda k=k: self.step(k), pool)
                self.zc_graphs.append(g)
                self.zc_hidden.append(out)

    def run(self, layout, host_id: int | None, prev: torch.Tensor | None = None):
        """Stage the step's row (``layout``: its host tensors, one request of one token; ``host_id`` None: the id is
        the previous step's, on the device: in ``GraphHead.sampled[0]``, or in ``prev`` (one element), copied there
        first), replay; ``(hidden [1, dim], sampled ids [1] on the device, the ids on the host or None)`` (views the
        next replays overwrite; zero-copy: the host ids are valid once the step's work is done)."""
        if host_id is None and prev is not None:
            self.head.sampled[:1].copy_(prev)  # the previous step sampled eagerly (a prefill's last chunk, say)
        zc = self.zero_copy and bool(self.zc_graphs)
        k = self.next
        self.next = (k + 1) % SLOTS
        if self.events[k] is not None:
            self.events[k].synchronize()  # this row's copy / graph SLOTS steps ago (normally long done)
        row = self.rows[k].numpy()
        nb = layout.block_tables.shape[1]
        nc = int(layout.num_computed_tokens[0])
        row[:FIXED] = (host_id is None, 0 if host_id is None else host_id, nc, int(layout.seq_lens[0]), nc,
                       int(layout.slot_mapping[0]), nb)
        row[FIXED:FIXED + nb] = layout.block_tables[0].numpy()
        if not zc:
            self.stage[:FIXED + nb].copy_(self.rows[k][:FIXED + nb], non_blocking=True)
        (self.zc_graphs[k] if zc else self.graph).replay()
        if self.device.type == "cuda":
            self.events[k] = torch.cuda.Event()
            self.events[k].record()
        self.replays += 1
        self.from_prev += host_id is None
        self.runner.num_replays += 1
        if zc:
            return self.zc_hidden[k], self.head.sampled[:1], self.ids_host[k:k + 1]
        return self.hidden, self.head.sampled[:1], None


def make_step_graph(runner, head, speculator: bool = False) -> StepGraph | None:
    """A :class:`StepGraph` for ``runner`` when ``OCTAVO_GRAPH_STEP`` (default :data:`DEFAULT_ON`) is on, one row is
    a captured size, the model has an LM head, runs on one rank and one pipeline stage and has no speculator; else
    None (an explicit ``OCTAVO_GRAPH_STEP=1`` there is refused by name). ``head``: the
    runner's ``GraphHead`` (the head graphs), else the step graph gets its own (its greedy path and id buffer only:
    no head graphs are captured for it)."""
    from octavo.nn.parallel import get_tp_size
    from octavo.nn.pipeline import get_pp_size

    zero_copy = env_switch("OCTAVO_GRAPH_STEP_ZERO_COPY", default=False)
    raw, raw_asked = raw_argmax_setting()
    if not env_switch("OCTAVO_GRAPH_STEP", default=DEFAULT_ON):
        for name, on in (("OCTAVO_GRAPH_STEP_ZERO_COPY", zero_copy), ("OCTAVO_GRAPH_STEP_RAW_ARGMAX", raw_asked)):
            if on:
                raise ValueError(f"{name}=1 is a mode of the one-graph batch-1 step, which OCTAVO_GRAPH_STEP=0 turns "
                                 "off; set one of them differently")
        return None
    why = ("speculative decoding" if speculator else "no one-row graph" if 1 not in runner.capture_sizes else
           "TP > 1" if get_tp_size() > 1 else
           "pipeline stages" if get_pp_size() > 1 else "no LM head" if not hasattr(runner.model, "compute_logits")
           else None)
    if why is not None:
        if zero_copy or raw_asked or env_choice("OCTAVO_GRAPH_STEP", ("0", "1", "unset"), "unset") == "1":  # asked
            raise ValueError(f"OCTAVO_GRAPH_STEP=1 / OCTAVO_GRAPH_STEP_RAW_ARGMAX=1 / OCTAVO_GRAPH_STEP_ZERO_COPY=1: this "
                             f"engine cannot take the one-graph batch-1 step ({why}); unset them (the step is on "
                             "wherever it can act)")
        logger.info("OCTAVO_GRAPH_STEP: no one-graph batch-1 step (%s)", why)
        return None
    if head is None:
        from octavo.plugins.platforms.cuda_graph_head import GraphHead

        head = GraphHead(runner.model, runner.device, 1)
    sg = StepGraph(runner, head)
    if raw and sg._raw_logits() is None:  # refused at start, not at capture (whose failure only drops the step graph)
        if raw_asked:
            raise ValueError("OCTAVO_GRAPH_STEP_RAW_ARGMAX=1: this model's compute_logits is not the float cast of its "
                             "LM head's logits (or the head's argmax takes no out=); unset it")
        sg.raw = False  # the default acts only where it can: the float cast + copy, as before
    return sg


def raw_argmax_setting() -> tuple[bool, bool]:
    """``(on, asked)``: whether the copy graph takes the argmax of the head's 16-bit logits (OCTAVO_GRAPH_STEP_RAW_ARGMAX,
    default :data:`RAW_ARGMAX_DEFAULT`), and whether an explicit 1 asked for it (then refused where it cannot act)."""
    v = env_choice("OCTAVO_GRAPH_STEP_RAW_ARGMAX", ("0", "1", "unset"), "unset")
    return (RAW_ARGMAX_DEFAULT if v == "unset" else v == "1"), v == "1"


def step_graph_state(worker, active: bool | None = None) -> dict:
    """A ``collective_rpc`` target: switch the one-graph step on or off (``active``; None: leave), say what it did."""
    sg = getattr(getattr(worker.runner, "graph_runner", None), "step_graph", None)
    if sg is None:
        return {"captured": False}
    if active is not None:
        sg.active = bool(active)
    return {"captured": sg.graph is not None, "active": sg.active, "replays": sg.replays, "from_prev": sg.from_prev}
