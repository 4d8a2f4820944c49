"""The runner's half of async scheduling: placeholders filled on the device, outputs read by the host later.

Under ``async_scheduling`` the engine core sends step N+1 before it knows step N's tokens, so a decoding
request's input token in N+1 is :data:`octavo.step.PLACEHOLDER`. This object, owned by the
:class:`~octavo.core.model_runner.ModelRunner` (``runner.async_steps``), closes the loop on the device:

    execute(N):   ... sample ─▶ sampled ids [R] stay on the device (``prev_sampled``)
                  ─▶ non-blocking copies to the host + an event ─▶ :class:`DeferredOutput` (no wait)
    execute(N+1): build inputs (placeholders are -1) ─▶ :meth:`prepare` writes ``prev_sampled[row]`` into the
                  placeholder rows of ``input_ids`` (one device index_put, stream-ordered after N)
    core:         DeferredOutput.result() ─▶ waits for N's event only (not for N+1) ─▶ RunnerOutput
    execute(N+2): :meth:`prepare` first patches the runner's own copy of each sequence with N's now-known
                  tokens (penalties and min_tokens read it), then fills N+1's placeholders

Penalties read the output so far: for a row whose last token is still a placeholder, the count and the
"seen" mask get that token on the device (:meth:`complete_penalties`). ``result()`` runs on the engine core's
thread while the runner may already be in a later step, so a deferred output reads only what it captured
(sampling parameters, row order), never the runner's live state.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from octavo.step import PLACEHOLDER, RunnerOutput

# How the engine core's thread waits for a step's tokens (DeferredOutput.result): CUDA's default event spins a CPU
# for the whole wait, beside the step thread that launches the next step's kernels (in nano-vllm's 8k-token prefill
# steps that launch paces the GPU: 37 ms in the run vs 17-22 ms alone, session 10). True (cudaEventBlockingSync):
# the waiting thread sleeps instead. OCTAVO_ASYNC_EVENT_BLOCKING=1/0; None: read it on first use. Opt-in: nano-vllm on
# an H100 (session 11 batch 1, same engine alternating) 17,661 / 17,643 / 16,054 tok/s off vs 17,704 / 16,767 / 16,695
# on, no gain; kept for batch-1 host-gap A/Bs (benchmarks/moe_host.py --host-ab)
EVENT_BLOCKING: bool | None = None


def _event_blocking() -> bool:
    global EVENT_BLOCKING
    if EVENT_BLOCKING is None:
        from octavo.env_flags import env_switch

        EVENT_BLOCKING = env_switch("OCTAVO_ASYNC_EVENT_BLOCKING", False)
    return EVENT_BLOCKING


class DeferredOutput:
    """One step's output whose host copies are in flight: :meth:`result` waits for them and builds the
    :class:`RunnerOutput` (once; later calls return the same object)."""

    __slots__ = ("_result", "_host", "_inputs", "_reqs", "_event", "_synchronize", "_done", "tokens",
                 "sample_req_ids", "positions")

    def __init__(self, result: RunnerOutput, host: dict, inputs: Any, reqs: dict, event: Any, synchronize,
                 positions: list[int]) -> None:
        self._result, self._host, self._inputs, self._reqs = result, host, inputs, reqs
        self._event, self._synchronize, self._done = event, synchronize, False
        self.sample_req_ids = inputs.sample_req_ids
        self.positions = positions  # where each sampled token lands in its request's sequence
        self.tokens: list[int] | None = None  # set by result(): the runner patches its sequences from it

    def result(self) -> RunnerOutput:
        if not self._done:
            from octavo.core.model_runner import fill_result

            if self._event is not None:
                self._event.synchronize()  # this step's copies only; later steps keep running
            else:
                self._synchronize()
            fill_result(self._result, self._host, self._inputs, self._reqs)
            self.tokens = [self._result.sampled[rid][0] for rid in self.sample_req_ids]
            self._done = True
            self._host = self._reqs = None
        return self._result


class AsyncRunnerSteps:
    """Runner-side state between steps under async scheduling (see the module docstring)."""

    def __init__(self, device: torch.device, synchronize) -> None:
        self.device = device
        self.synchronize = synchronize
        self.prev_sampled: torch.Tensor | None = None  # the last step's sampled ids, on the device
        self.prev_rows: dict[str, int] = {}  # request id -> row in prev_sampled
        self.unpatched: list[DeferredOutput] = []  # steps whose tokens the runner's sequences still lack
        self._filled: tuple[list[str], torch.Tensor] | None = None  # this step's placeholder ids (device)
        self.ranks_agree = False  # this step's sampled ids are bitwise equal on every TP rank (core/step_head.py)
        # the last step's (host sampled ids, copy event, sample request ids), taken by the next step's chained grammar
        # fill (core/grammar_chain.py launch); cleared at each step's start (only the step right before counts)
        self.last_copy: tuple | None = None

    def prepare(self, batch: Any, inputs: Any, reqs: dict, fill: bool = True) -> None:
        """Patch known tokens into the runner's sequences, then write this step's placeholders on the device (not with
        ``fill=False``: the platform's one-graph step reads its placeholder's id on the device, core/step_head.py)."""
        keep = []
        for h in self.unpatched:
            if h.tokens is None:
                keep.append(h)
                continue
            for rid, pos, tok in zip(h.sample_req_ids, h.positions, h.tokens):
                st = reqs.get(rid)
                if st is not None and pos < len(st.all_token_ids) and st.all_token_ids[pos] == PLACEHOLDER:
                    st.all_token_ids[pos] = tok
        self.unpatched = keep
        if not fill:
            self._filled = None
            self.prev_sampled, self.prev_rows = None, {}
            return
        flat, rows, rids = [], [], []
        off = 0
        for s in batch.scheduled:
            n = len(s.token_ids)
            if n and s.token_ids[-1] == PLACEHOLDER:
                row = self.prev_rows.get(s.request_id)
                if row is None or self.prev_sampled is None:
                    raise RuntimeError(f"request {s.request_id}: its input token is a placeholder but the previous "
                                       "step did not sample it (async scheduling lost a step)")
                flat.append(off + n - 1)
                rows.append(row)
                rids.append(s.request_id)
            off += n + len(s.spec_token_ids)
        self._filled = None
        if flat:
            dev = self.device
            k = len(flat)
            if flat == rows == list(range(k)):  # the usual decode step: same rows, same order, one device copy
                src = self.prev_sampled[:k].to(inputs.input_ids.dtype)
                inputs.input_ids[:k].copy_(src)
            else:
                src = self.prev_sampled.index_select(0, torch.tensor(rows, dtype=torch.int64).to(dev, non_blocking=True))
                src = src.to(inputs.input_ids.dtype)
                inputs.input_ids.index_copy_(0, torch.tensor(flat, dtype=torch.int64).to(dev, non_blocking=True), src)
            self._filled = (rids, src)
        self.prev_sampled, self.prev_rows = None, {}

    def complete_penalties(self, sampling: Any, sample_reqs: list) -> None:
        """Add this step's placeholder tokens (values on the device) to the penalty counts / seen masks."""
        if self._filled is None or (sampling.output_counts is None and sampling.seen_mask is None):
            return
        rids, src = self._filled
        row_of = {r.request_id: i for i, r in enumerate(sample_reqs)}
        pick = [(row_of[rid], j) for j, rid in enumerate(rids) if rid in row_of]
        if not pick:
            return
        rows = torch.tensor([i for i, _ in pick], dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.tensor([j for _, j in pick], dtype=torch.int64).to(self.device, non_blocking=True)
        toks = src.index_select(0, pos).long()  # no host sync: the previous step may still be running
        if sampling.output_counts is not None:
            sampling.output_counts.index_put_((rows, toks), torch.ones_like(toks, dtype=sampling.output_counts.dtype),
                                              accumulate=True)
        if sampling.seen_mask is not None:
            sampling.seen_mask[rows, toks] = True

    def defer(self, result: RunnerOutput, pending: dict, inputs: Any, reqs: dict, on_host: dict | None = None) \
            -> DeferredOutput:
        """Keep the sampled ids on the device for the next step, start the host copies, return without waiting.
        ``on_host``: results the device writes into host memory itself (not copied; read after the step's event)."""
        sampled = pending.get("sampled")
        if sampled is not None:
            self.prev_sampled = sampled
            self.prev_rows = {rid: i for i, rid in enumerate(inputs.sample_req_ids)}
        host = {k: on_host[k] if on_host and k in on_host else _copy(v) for k, v in pending.items()}
        event = None
        if self.device.type != "cpu":  # CPU work is already done when we get here
            event = torch.Event(device=self.device.type, blocking=_event_blocking())
            event.record()
        # the sampled token lands right after the tokens this step ran (the runner's sequence ends there now)
        positions = [reqs[rid].num_tokens for rid in inputs.sample_req_ids]
        snapshot = {rid: reqs[rid] for rid in (*inputs.sample_req_ids, *inputs.prompt_lp_rows)}
        out = DeferredOutput(result, host, inputs, snapshot, event, self.synchronize, positions)
        self.last_copy = (host.get("sampled"), event, inputs.sample_req_ids)
        if "sampled" in pending:
            self.unpatched.append(out)
        return out


class PendingOutput:
    """A structured step's answer while its masked sampling waits for the grammar gate (in-process executor).

    The runner's thread launches the forward and the logits, then parks the rest of the step (mask, sampler,
    host copies) on the step's ``GatedGrammarStep`` and returns this at once (core/async_engine.py): whoever
    opens the gate runs it, so the sampler is launched right after the fill, with no thread hand-off, and the
    runner's thread is free for the next step. :func:`resolve` waits for it."""

    __slots__ = ("_done", "_value", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self, finish) -> None:
        """Run the parked rest of the step (once) and keep its answer or its error."""
        try:
            self._value = finish()
        except BaseException as e:  # noqa: BLE001 - raised again by get(), on the thread that waits for the step
            self._error = e
        finally:
            self._done.set()

    def get(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


def _copy(x):
    if isinstance(x, tuple):
        return tuple(_copy(t) for t in x)
    return x.to("cpu", non_blocking=True)


def resolve(out: Any) -> RunnerOutput:
    """A runner's answer under async scheduling: a :class:`DeferredOutput`, or a plain :class:`RunnerOutput`
    for a step with nothing to sample (pooling only, prefill chunks, an empty batch); either possibly behind a
    :class:`PendingOutput` (a structured step whose sampling was parked on its grammar gate)."""
    if isinstance(out, PendingOutput):
        out = out.get()
    return out.result() if isinstance(out, DeferredOutput) else out
