"""The LM head and the sampler of a decode step inside CUDA graphs (issue 17 item 2).

Why: at batch 1 on the Llama-3-8B shape the captured decode graph is the model body only; the LM head (one
1.05 GB GEMM), the sampler and their launches ran eagerly after it, ~0.45 ms of a 3.73 ms fp8 token
(docs/performance.md). Here, for each captured batch size up to ``OCTAVO_GRAPH_HEAD_MAX_SIZE`` (default 16), two
more graphs (four with Triton) are captured on the body graph's output buffer, in the same memory pool:

    greedy : logits = model.compute_logits(hidden); sampled = argmax_rows(logits)   (cuda_argmax.py: torch.argmax's
             answers, ties to the lowest index, NaN first, in two launches instead of torch's one-block reduction)
             (TP > 1: each rank takes max + argmax of its vocabulary shard and the (value, index) pairs are
             all-gathered, :func:`shard_argmax`; the full logits are never gathered)
    random : logits = model.compute_logits(hidden); sampled = fused_sample(logits, T, keys)   (cuda_sampler.py)
    logits + filtered : the same in two graphs, for rows with top-k / top-p / min-p: the core computes the eager
             sampler's per-row thresholds (core/sampler.py filter_thresholds) from the first graph's logits
             between the two replays; the second samples with them (fused_sample's ``thresholds``)

The random graph reads each row's temperature and Philox key from static device buffers that the host fills per
step with exactly the keys the eager fused sampler would derive (``unseeded_base`` from torch's CPU generator,
``seeded_key`` of a seeded request's seed and draw count, advancing its generator the same way), so the tokens are
the eager fused sampler's, and the RNG state lives on the host side of that contract, correct across replays.

Exactness: the core (``core/step_head.py``) replays a head graph only when the eager path it replaces would compute
the same bits: the body graph ran at exactly the step's size (:meth:`GraphHead.ready`; no padding rows, so the head
GEMM has the eager path's shape), every scheduled request samples one row in order, and no request needs logprobs,
penalties, logit bias, allowed tokens, min_tokens bans, a grammar mask, LoRA or a speculator; random rows also need
the fused sampler to be the eager sampler's choice for the step (``Sampler.uses_fused``: e.g. not top-p without a
top-k). Anything else runs the eager head on the body graph's hidden states, as before. ``OCTAVO_GRAPH_HEAD=1`` /
``0``: captured or not (default :data:`DEFAULT_ON`); :attr:`GraphHead.active` switches it at run time (the
benchmarks' same-process A/B).
"""

from __future__ import annotations

import logging
import os

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)

DEFAULT_ON = False  # opt-in (OCTAVO_GRAPH_HEAD=1) until the GPU A/B shows it wins and stays exact
KEY_BASE = 1 << 32  # the base argument the random graph is captured with (ignored: keys are read); int64-typed


def head_max_size() -> int:
    raw = os.environ.get("OCTAVO_GRAPH_HEAD_MAX_SIZE", "16").strip()
    if not raw.isdigit():
        raise ValueError(f"OCTAVO_GRAPH_HEAD_MAX_SIZE={raw!r}: a batch size (0 = no head graphs)")
    return int(raw)


def shard_argmax(local_logits: torch.Tensor, vocab_start: int, gather, argmax=None) -> torch.Tensor:
    """``torch.argmax`` of the full logits row from this rank's vocabulary shard: ``local_logits`` ``[n, w]`` are
    this rank's columns ``[vocab_start, vocab_start + w)`` (padding columns cut), ``gather(x)`` concatenates an
    ``[n, 2]`` tensor of every rank along the last dim in rank order. Each rank's first maximum and its global
    index travel as an fp32 pair (indices < 2**24 are exact); the first rank holding the maximum wins, which is
    the lowest global index among equal maxima (shards are in rank order), and a NaN wins as in torch.argmax.
    ``argmax``: a function with ``torch.argmax(x, dim=-1)``'s answers (default: that)."""
    idx = (local_logits.argmax(dim=-1) if argmax is None else argmax(local_logits)).unsqueeze(-1)
    val = local_logits.gather(-1, idx).float()
    pair = torch.cat([val, (idx + vocab_start).float()], dim=-1)
    pairs = gather(pair)  # [n, 2 * world]
    winner = pairs[:, 0::2].argmax(dim=-1, keepdim=True)
    return pairs[:, 1::2].gather(-1, winner).squeeze(-1).long()


def _shard_head(model):
    """The vocabulary-parallel head whose shards a TP > 1 greedy step can reduce, or None (then the greedy
    graph computes the gathered logits, as the eager path)."""
    from octavo.nn.embedding import ParallelLMHead
    from octavo.nn.parallel import get_tp_size

    head = getattr(model, "lm_head", None)
    if get_tp_size() == 1 or not isinstance(head, ParallelLMHead):
        return None
    if head.num_embeddings >= 1 << 24 or head.num_embeddings - head.shard_size * (head.tp_size - 1) <= 0:
        return None  # fp32 indices inexact / the last rank holds padding only
    return head


class GraphHead:
    """Head graphs per captured size (see the module docstring); built and captured by ``CUDAGraphRunner``."""

    def __init__(self, model, device: torch.device, max_size: int) -> None:
        self.model = model
        self.device = device
        self.max_size = max_size
        self.active = True
        self.temperature = torch.zeros(max_size, dtype=torch.float32, device=device)
        self.keys = torch.zeros(max_size, dtype=torch.int64, device=device)
        self.thresholds = torch.full((max_size,), float("-inf"), dtype=torch.float32, device=device)
        # every head graph's last kernel copies its ids here, outside the graphs' pool: memory of the pool that a
        # graph frees may back another graph's temporaries, and the ids must outlive later replays until the next
        # step's input copy and the host copy (both queued before the next replay) have read them
        self.sampled = torch.zeros(max_size, dtype=torch.int64, device=device)
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, str], torch.Tensor] = {}
        self.body_outputs: dict[int, torch.Tensor] = {}  # size -> the body graph's output buffer the head reads
        self.modes = ["greedy"]
        try:
            from octavo.plugins.platforms.cuda_sampler import fused_sample

            self._fused_sample = fused_sample
            self.modes += ["random", "filtered"]
        except ImportError:  # no Triton: greedy steps only
            self._fused_sample = None
        self._argmax = lambda x: x.argmax(dim=-1)
        if device.type != "cpu" or os.environ.get("TRITON_INTERPRET") == "1":
            try:  # torch.argmax's answers in two launches over the GPU (torch: one block per row, 28 us at 128k)
                from octavo.plugins.platforms.cuda_argmax import argmax_rows

                self._argmax = argmax_rows
            except ImportError:
                pass
        self.shard = None
        self.agrees = False  # greedy ids are bitwise the same on every rank (shard path): no broadcast needed
        self.num_replays = {"greedy": 0, "random": 0, "filtered": 0}

    def setup(self) -> None:
        """Collective under TP (every rank at once): decide whether greedy steps reduce vocabulary shards. The
        shard path needs ``model.compute_logits`` to be the head's plain logits (no soft-capping, no scaling):
        checked on random rows, bitwise, and agreed on by every rank."""
        head = _shard_head(self.model)
        if head is None:
            return
        import torch.distributed as dist

        from octavo.nn.parallel import get_tp_group

        gen = torch.Generator(device=self.device).manual_seed(0)  # same rows on every rank
        h = torch.randn(2, head.embedding_dim, generator=gen, device=self.device).to(head.weight.dtype)
        same = torch.equal(self.model.compute_logits(h), head.compute_logits(h))
        ok = torch.tensor([1 if same else 0], device=self.device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=get_tp_group())
        self.shard = head if ok.item() == 1 else None
        self.agrees = self.shard is not None

    def _greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.shard
        if head is None:
            return self._argmax(self.model.compute_logits(hidden))
        from octavo.nn.parallel import tp_all_gather

        w = min(head.shard_size, head.num_embeddings - head.vocab_start)  # the last rank's padding columns cut
        if head.logits_method is not None:  # what ParallelLMHead.compute_logits computes before its all-gather
            local = head.logits_method.apply(head, hidden, head.bias)
        else:
            local = torch.nn.functional.linear(hidden, head.weight, head.bias)
        return shard_argmax(local[:, :w], head.vocab_start, lambda x: tp_all_gather(x, dim=-1), self._argmax)

    def _random(self, hidden: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        logits = self.model.compute_logits(hidden)
        return self._fused_sample(logits, self.temperature[:n], self.keys[:n], KEY_BASE, None)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)

    def _filtered(self, logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        return self._fused_sample(logits, self.temperature[:n], self.keys[:n], KEY_BASE, self.thresholds[:n])

    def _capture_one(self, size: int, mode: str, fn, arg, pool) -> None:
        fn(arg)  # warm-up outside the graph (Triton builds, cuBLAS picks its kernel)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = fn(arg)
            if mode != "logits":
                out = self.sampled[:size].copy_(out)
        self.graphs[(size, mode)], self.outputs[(size, mode)] = graph, out

    @torch.inference_mode()
    def capture(self, size: int, hidden: torch.Tensor, pool) -> None:
        """Capture both head graphs on ``hidden`` (the body graph's ``[size, dim]`` output buffer)."""
        self._capture_one(size, "greedy", self._greedy, hidden, pool)
        if "random" in self.modes:
            self._capture_one(size, "random", self._random, hidden, pool)
            # filtered rows: the logits into a kept buffer, thresholds computed eagerly by the core, then the sampler
            self._capture_one(size, "logits", self._logits, hidden, pool)
            self._capture_one(size, "filtered", self._filtered, self.outputs[(size, "logits")], pool)
        self.body_outputs[size] = hidden

    def ready(self, hidden: torch.Tensor) -> bool:
        """Whether ``hidden`` is the output buffer of the body graph of exactly its row count (it just ran: an
        eager forward's output is never in the graphs' private pool) and head graphs exist for that size."""
        n = hidden.shape[0]
        body = self.body_outputs.get(n)
        return self.active and body is not None and (n, "greedy") in self.graphs and \
            hidden.data_ptr() == body.data_ptr()

    def set_keys(self, size: int, sampling) -> None:
        """Each row's temperature and Philox key into the static buffers: the keys ``sample_rows`` (the eager fused
        sampler) derives, from the same draws in the same order (torch's CPU generator, each seeded request's
        generator), so the random graphs give the eager tokens."""
        from octavo.plugins.platforms.cuda_sampler import draw_index, row_keys, seeded_key, unseeded_base

        base = unseeded_base()
        seeded = {row: seeded_key(gen.initial_seed(), draw_index(gen)) for row, gen in sampling.generators.items()}
        self.keys[:size].copy_(row_keys(base, size, seeded), non_blocking=True)
        self.temperature[:size].copy_(sampling.temperature)

    def logits(self, size: int) -> torch.Tensor:
        """Replay the head alone: the ``[size, vocab]`` float32 logits (a buffer the next replay overwrites), for
        the thresholds of a ``"filtered"`` :meth:`sample`."""
        self.graphs[(size, "logits")].replay()
        return self.outputs[(size, "logits")]

    def sample(self, mode: str, size: int, sampling=None, thresholds: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the ``mode`` head graph of ``size`` rows (the body graph of that size just ran): ``"greedy"``,
        ``"random"`` or ``"filtered"`` (after :meth:`logits`; ``thresholds`` ``[size]`` fp32, the eager sampler's
        ``filter_thresholds`` of those logits). ``sampling``: the step's ``SamplingBatch`` (random modes), whose
        temperatures and generators give the keys."""
        if mode == "filtered":
            self.thresholds[:size].copy_(thresholds)
        if mode != "greedy":
            self.set_keys(size, sampling)
        self.graphs[(size, mode)].replay()
        self.num_replays[mode] += 1
        return self.outputs[(size, mode)]


def make_graph_head(model, device: torch.device, capture_sizes: list[int]) -> GraphHead | None:
    """A :class:`GraphHead` for the sizes it will capture, or None (off, a pipeline stage without the head, or
    a model without ``compute_logits``). Collective under TP (:meth:`GraphHead.setup`)."""
    from octavo.nn.pipeline import get_pp_size

    limit = head_max_size()
    sizes = [s for s in capture_sizes if s <= limit]
    if not env_switch("OCTAVO_GRAPH_HEAD", default=DEFAULT_ON) or not sizes or get_pp_size() > 1 \
            or not hasattr(model, "compute_logits"):
        return None
    head = GraphHead(model, device, max(sizes))
    head.setup()
    return head


def graph_head_state(worker, active: bool | None = None) -> dict:
    """A ``collective_rpc`` target (``"octavo.plugins.platforms.cuda_graph_head:graph_head_state"``): switch this
    rank's head graphs on or off (``active``; None: leave) and say what it holds and how often each replayed."""
    head = getattr(getattr(worker.runner, "graph_runner", None), "head", None)
    if head is None:
        return {"captured": False}
    if active is not None:
        head.active = bool(active)
    return {"captured": True, "active": head.active, "sizes": sorted({s for s, _ in head.graphs}),
            "modes": head.modes, "shard_argmax": head.shard is not None, "replays": dict(head.num_replays)}
