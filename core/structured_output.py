"""Structured outputs on the engine-core side: compile grammars off the step loop, keep one matcher per
request, and fill each step's token bitmask on the host (vLLM V1's split: the scheduler's process owns all
grammar state and ships a packed bitmask with the step, so workers hold none).

    add_request ──submit──▶ compile thread (cached by (kind, spec)) ──▶ Future[compiled]
    schedule(): a waiting request is admitted only once its grammar is ready (nothing else waits)
    after schedule: prepare() -> GrammarStep (rows sampling under a grammar) ──▶ executor: filled on a host
                    thread while the forward runs (in-process) or shipped as bytes in the StepBatch (others)
    update(): every matcher advances by its request's token (one batched call)

A preempted request keeps its matcher (its output tokens are kept too, so the state stays right). With a
reasoning parser, a request's grammar starts after the reasoning end marker (``</think>``) appears in its
prompt or output; the matcher then replays the output after the marker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from octavo.core import grammar_chain, grammar_device_gate, grammar_stats, grammar_step
from octavo.core.grammar_accept import RowsAccept
from octavo.core.grammar_reasoning import grammar_start
from octavo.core.grammar_rows import StepRows
from octavo.core.grammar_step import GrammarStep, apply_packed, fill_threads
from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)
# Async: accept N's tokens (and fill N+1) before Scheduler.update (accept_sampled); False: after it (json_async_late).
EARLY_ACCEPT = True
# With the device gate and an early fill on the bitmask thread: N's tokens accepted in the job that then fills N+1, not
# on this thread, which goes on to update N and schedule N+2 (json_async_devgate_poolaccept). False: here.
ACCEPT_ON_FILL_THREAD = False
# After releasing N+1's fill: ``time.sleep(0)``, so a bitmask thread takes the GIL now. Session 11 measured the GIL wait
# after it (``release_s``) at ~1.05 ms per step on the H100 with no fill thread (the no-grammar-work floor): the yield
# can hand the GIL to the runner's thread instead, and this thread (update N, schedule N+2: the next step's critical
# path) waits for it. Session 12 A/B: False = no yield (json_async_noyield, _postonly_noyield).
YIELD_AFTER_RELEASE = True
# Session 17: the same yield after a chained step's release (core/grammar_chain.py: the runner's C job accepts and
# fills, no bitmask thread waits for the GIL; the yield only lets the runner's thread run first). False (the default
# since session 17): none there; two H200 calls with the lean graph, vs the chain with the yield: 135M -1.3 / -4.7 %,
# 1.1B -6.2 / -2.9 % (docs/performance.md); the release 0.084 -> 0.013 ms. YIELD_AFTER_RELEASE = False: no yield at all.
YIELD_WHEN_CHAINED = False

# Session 11, opt-in: the backend's matchers in a worker process (the backend's ``out_of_process``: xgrammar's,
# plugins/structured_output/xgrammar_worker.py), so accept + fill + their glue leave this process's GIL; a backend
# without one is refused by name. OCTAVO_GRAMMAR_WORKER=1 turns it on (benchmark mode json_async_worker).
GRAMMAR_WORKER = env_switch("OCTAVO_GRAMMAR_WORKER", default=False)


class RequestGrammar:
    """One request's grammar: the compile future, its matcher once built, where the grammar starts."""

    __slots__ = ("future", "matcher", "start", "failed", "prompt_open")

    def __init__(self, future: Future) -> None:
        self.future = future
        self.matcher = None
        self.start: int | None = None  # index in output_token_ids where the grammar begins (None: not yet)
        self.failed: str | None = None
        self.prompt_open: bool | None = None  # with a reasoning parser: the prompt leaves the reasoning open


class StructuredOutputManager:
    """Owns the backend, the compile thread and the compiled-grammar cache of one engine core.

    Args:
        settings: engine settings (``structured_outputs_backend``, ``reasoning_parser``, the model's tokenizer).
        vocab_size: the logits width (bitmask columns).
        eos_token_ids: the model's end-of-sequence ids (allowed once a grammar is complete).
    """

    def __init__(self, settings: Any, vocab_size: int, eos_token_ids: list[int], platform: Any = None) -> None:
        self.settings = settings
        # the engine's Platform (None: a CPU's defaults): whether host memory can be pinned for async copies
        self._can_pin = bool(platform is not None and platform.capabilities().pinned_memory)
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.backend_name = settings.scheduler.structured_outputs_backend
        self._backend = None
        self._backend_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._cache: dict[tuple[str, str], Future] = {}
        self._reasoning_end: list[int] | None = None
        self._reasoning_markers: tuple[str, str] = ("", "")
        self._reasoning_name = settings.server.reasoning_parser
        self._num_words = (vocab_size + 31) // 32
        self._bitmask = None  # host int32 [max_num_seqs, words], allocated on first use, reused every step
        self._pinned = False  # whether _bitmask is pinned
        self._fill_pool: ThreadPoolExecutor | None = None  # the bitmask fills (one thread)
        self.fill_threads = fill_threads()  # a step's rows are split over this many threads (grammar_step.py)
        self._chunk_pool: ThreadPoolExecutor | None = None  # fill_threads - 1 workers for the other chunks
        self._inflight: GrammarStep | None = None
        # set by the async step loop (core/async_engine.py): releases step N+1's gated fill once N's tokens are
        # in the matchers (it needs nothing else from the step), instead of after N's outputs are built
        self.after_accept: Any = None
        # {"device"[, "dtype", "vocab"]} of the logits, set by this process's runner when it applies (grammar_step.py)
        self._cpu_hint: dict = {}
        self._early: Any = ()  # requests whose token accept_sampled already accepted this step
        self._rows = StepRows()  # each step's grammar rows, reused by the steady decode step (core/grammar_rows.py)
        self._device_gate = None  # core/grammar_device_gate.DeviceGate, made once the runner said it can wait
        self._last_step: GrammarStep | None = None  # the last prepared step while in flight (grammar_chain.attach)
        self.stats = grammar_stats.new()  # host seconds summed over steps with grammar rows (grammar_stats.py)
        from octavo.core.plugin_manager import get_plugin_manager

        pm = get_plugin_manager()  # unknown names fail at start (the registry lookup imports nothing)
        pm.registration("structured_output_backends", self.backend_name)
        if self._reasoning_name:
            pm.registration("reasoning_parsers", self._reasoning_name)

    # ---- compile -------------------------------------------------------------------------------
    def _get_backend(self):
        with self._backend_lock:
            if self._backend is None:
                from octavo.core.loader import load_tokenizer
                from octavo.core.plugin_manager import get_plugin_manager

                tokenizer = load_tokenizer(self.settings.model)
                if tokenizer is None:
                    raise ValueError("structured outputs need a tokenizer; this engine has skip_tokenizer_init=True")
                pm = get_plugin_manager()
                cls = pm.resolve("structured_output_backends", self.backend_name)
                if not cls.is_available():
                    raise ValueError(f"structured-output backend {self.backend_name!r} is not installed here; "
                                     "pip install octavo[structured]")
                if self._reasoning_name:
                    parser = pm.resolve("reasoning_parsers", self._reasoning_name)
                    self._reasoning_end = list(tokenizer(parser.end_token, add_special_tokens=False).input_ids)
                    self._reasoning_markers = (parser.start_token, parser.end_token)
                backend = cls(tokenizer, self.vocab_size)
                if GRAMMAR_WORKER:
                    make = getattr(backend, "out_of_process", None)
                    if make is None:
                        raise ValueError(f"OCTAVO_GRAMMAR_WORKER=1: the structured-output backend "
                                         f"{self.backend_name!r} has no worker process; unset it or use 'xgrammar'")
                    backend = make(self.settings.scheduler.max_num_seqs)
                elif grammar_device_gate.NATIVE_OPEN and grammar_device_gate.NATIVE_OPEN_EXPLICIT:  # (else: below)
                    grammar_device_gate.check_native_open(backend, self.backend_name)
                grammar_chain.check_backend(backend, self.backend_name)
                self._backend = backend
            return self._backend

    def _compile(self, params: Any) -> Any:
        return self._get_backend().compile(params)

    def add_request(self, req: Any) -> None:
        """Check the request's grammar now (a ``ValueError`` naming the field fails only this request) and
        start compiling it on the grammar thread (cached by spec); no-op without structured outputs."""
        params = req.sampling_params.structured_outputs
        if params is None:
            return
        key = params.key()
        fut = self._cache.get(key)
        if fut is None or (fut.done() and fut.exception() is not None):
            from octavo.core.plugin_manager import get_plugin_manager

            get_plugin_manager().resolve("structured_output_backends", self.backend_name).validate(params)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="octavo-grammar")
            fut = self._cache[key] = self._pool.submit(self._compile, params)
        req.grammar = RequestGrammar(fut)

    def pop_failed(self, reqs: list[Any]) -> list[tuple[Any, str]]:
        """Waiting requests whose grammar failed to compile, with the reason (the engine fails them)."""
        out = []
        for req in reqs:
            g = req.grammar
            if g is not None and g.failed is None and g.future.done() and g.future.exception() is not None:
                e = g.future.exception()
                g.failed = f"structured_outputs.{req.sampling_params.structured_outputs.kind}: {e}"
                out.append((req, g.failed))
        return out

    # ---- per step --------------------------------------------------------------------------------
    def _active(self, req: Any):
        """The request's matcher if its grammar applies at this point of the output, else None."""
        g = req.grammar
        if g is None or g.failed is not None or not g.future.done():
            return None
        if g.start is None:
            if self._reasoning_name:  # after the reasoning ends (core/grammar_reasoning.py)
                backend = self._get_backend()  # (resolves the reasoning end marker)
                start = grammar_start(req, g, self._reasoning_end, self._reasoning_markers, backend.tokenizer.decode)
                if start is None:
                    return None
                g.start = start
            else:
                g.start = 0
        if g.matcher is None:
            g.matcher = self._get_backend().matcher(g.future.result())
            for tok in req.output_token_ids[g.start:]:
                g.matcher.accept_token(tok)
        return g.matcher

    def prepare(self, sched_out: Any) -> GrammarStep | None:
        """This step's grammar work: every request that samples under an active grammar, as a
        :class:`GrammarStep` the executor fills (overlapped with the forward where it can); None if none.
        ``batch.scheduled`` is in ``sched_out.scheduled``'s order."""
        t0 = time.perf_counter()
        positions, rids, matchers = self._rows.build(sched_out, self._active)
        if not matchers:
            self._last_step = None
            return None
        # reused every step; pinned once this process's runner applied masks on an accelerator whose platform can
        # pin host memory (the in-process executor), so the runner's host -> device copy of the rows needs no
        # staging copy (core/grammar_step.py _to_device); a CPU, or a core whose workers are other processes: not
        # (whether the buffer is pinned is kept, not asked: torch's is_pinned() is a CUDA driver query per call,
        # 8 % of the core thread's samples at batch 32 on an H200 host, session 10)
        pin = self._can_pin and self._cpu_hint.get("device", "cpu") != "cpu"
        backend = self._backend if self._backend is not None else self._get_backend()  # (no lock once built)
        if getattr(backend, "opens_gate", False):  # a worker process: its shared rows, registered with the device
            if self._bitmask is None:
                self._bitmask = backend.rows
            if pin > self._pinned:
                self._pinned = backend.pin()
        elif self._bitmask is None or self._bitmask.shape[0] < len(matchers) or pin > self._pinned:
            import torch

            rows = max(len(matchers), self.settings.scheduler.max_num_seqs)
            self._bitmask = torch.full((rows, self._num_words), -1, dtype=torch.int32, pin_memory=pin)
            self._pinned = self._bitmask.is_pinned()
        self._inflight = GrammarStep(backend, positions, rids, matchers, self._bitmask, self._pool_for_fills(),
                                     self._chunks())
        # the runner's apply tells the hint its logits' device (and the CPU numpy apply its dtype: later fills
        # then build that apply's operands)
        self._inflight.cpu_hint = self._cpu_hint
        if self._pinned:  # this process drives an accelerator: its forward runs asynchronously
            self._inflight.handoff_wait_s = grammar_step.HANDOFF_WAIT_S
        if self._cpu_hint.get("device_wait"):  # the runner's apply can wait on the device (used by async steps)
            if self._device_gate is None:
                if grammar_device_gate.NATIVE_OPEN and not grammar_device_gate.NATIVE_OPEN_EXPLICIT:
                    grammar_device_gate.native_open_or_fallback(backend, self.backend_name)  # (the default)
                self._device_gate = grammar_device_gate.DeviceGate(
                    pin=self._pinned, words=getattr(backend, "words", None),
                    graphs=not self.settings.device.enforce_eager)  # (no graphs: none)
            self._inflight.device_gate = self._device_gate
            if grammar_chain.CHAIN:  # session 16: N+1's accept + fill queued by the runner (core/grammar_chain.py)
                grammar_chain.attach(self._inflight, self._last_step, self._rows.reqs_of(sched_out))
        self._last_step = self._inflight
        self.stats["prepare_s"] += time.perf_counter() - t0
        return self._inflight

    def attach_bitmasks(self, sched_out: Any, batch: Any) -> None:
        """Fill now and put the bitmasks into ``batch`` (the serial path; executors use :meth:`prepare`)."""
        step = self.prepare(sched_out)
        if step is not None:
            step.attach(batch)

    def accept_tokens(self, updates: list[tuple[Any, int | None]]) -> None:
        """Advance each request's matcher by the token it just got (``Scheduler.update``'s result): one batched
        call (xgrammar ``batch_accept_token``) on this thread.

        NOTE (H100 host, batch 32, async): as a job on the bitmask thread it took 0.69 ms per step (0.04 alone): it
        waited for the GIL while this thread scheduled (session 15: opt-in in C, OCTAVO_GRAMMAR_NATIVE_ACCEPT)."""
        t0 = time.perf_counter()
        self._close_inflight()
        matchers, tokens, rids = [], [], []
        early, self._early = self._early, ()
        if early and early.issuperset([u[0] for u in updates]):  # the usual async step: accept_sampled took all
            updates = ()
        for req, token in updates:
            g = req.grammar
            if g is None or token is None or req in early:  # (already advanced by accept_sampled)
                continue
            if g.matcher is None:
                if g.start is None and self._reasoning_name:
                    self._active(req)  # the grammar starts right after the token that ended the reasoning
                continue
            matchers.append(g.matcher)
            tokens.append(token)
            rids.append(req.request_id)
        self._advance(matchers, tokens, rids, t0)

    def _close_inflight(self) -> None:
        """The in-flight step's fill is over (waited for), its device wait checked, its stats summed."""
        step, self._inflight = self._inflight, None
        if step is not None:  # the step's fill must be over before any matcher moves
            if step is self._last_step:  # (no longer in flight: the next step's rows cannot chain to it)
                self._last_step = None
            step.wait()
            if step.seq:  # its sampling waited for the fill on the device: fail it if that wait gave up
                step.device_gate.check(step.seq, getattr(step.backend, "last_error", None))
            grammar_stats.add(self.stats, step)

    def _advance(self, matchers: list[Any], tokens: list[int], rids: list[str], t0: float,
                 chained: bool = False) -> None:
        """Move ``matchers`` by ``tokens`` (here or, ACCEPT_ON_FILL_THREAD, in the next fill's job), then run the
        async loop's ``after_accept`` hook (N+1's fill). ``t0``: when the accept began (stats); ``chained``: the
        runner's job does the accept and the fill (:data:`YIELD_WHEN_CHAINED`)."""
        hook, self.after_accept = self.after_accept, None
        before = None
        if matchers and ACCEPT_ON_FILL_THREAD and hook is not None:  # the gate decides where it runs (async_gate)
            before = functools.partial(self._accept, matchers, tokens, rids)
        elif matchers and grammar_device_gate.NATIVE_ACCEPT and hook is not None:  # (N+1's native fill may take it)
            before = RowsAccept(self, matchers, tokens, rids)
        elif matchers:
            self._accept(matchers, tokens, rids)
        t1 = time.perf_counter()
        self.stats["accept_s"] += t1 - t0
        if hook is not None:
            # N+1's gate: its fill runs now, on this thread (grammar_step.INLINE_AFTER_GATE), or is queued on the
            # bitmask thread and the yield lets that thread take the GIL now (else: when this one blocks, or 5 ms).
            hook(before) if before is not None else hook()
            if not getattr(before, "done", True):  # (a RowsAccept no fill took: accepted here)
                before()
            if YIELD_AFTER_RELEASE and (YIELD_WHEN_CHAINED or not chained):
                time.sleep(0)
            self.stats["release_s"] += time.perf_counter() - t1

    def accept_sampled(self, sched_out: Any, result: Any) -> None:
        """Async scheduling: advance the matchers by step N's sampled tokens straight from the runner's result,
        before ``Scheduler.update``, and open N+1's gate (``after_accept``), so the next fill does not wait for
        the update (~0.1-0.3 ms of Python at batch 32). The async scheduler's ``update`` appends exactly these
        tokens: one per sampling request that was not finished before it (core/async_scheduler.py), and a
        failed request (``result.failed``) gets none. A request whose matcher does not exist yet (reasoning not
        over) is left to :meth:`accept_tokens`, which skips the ones advanced here. ``EARLY_ACCEPT = False``:
        a no-op (everything happens in :meth:`accept_tokens`)."""
        if not EARLY_ACCEPT:
            return
        # (one pass builds the accept's rows: no (request, token) list walked again by accept_tokens; per-row Python
        # on this thread is host time of a host-bound GPU step)
        t0 = time.perf_counter()
        nxt = self._inflight.chain_next if self._inflight is not None else None
        self._close_inflight()
        if nxt is not None and not grammar_chain.core_takes(nxt):  # the runner queued N's accept + N+1's fill
            self._rows.drop(sched_out)
            self._early = nxt.chain.reqs  # (accept_tokens skips them; N+1's gate below has nothing to fill)
            self.stats["chained"] += 1
            return self._advance([], [], [], t0, chained=True)
        sampled, failed = result.sampled, result.failed
        prev, self._early = self._early, ()  # (accept_tokens consumed it after the last update; else skip those)
        rows = self._rows.sampled(sched_out, sampled, failed, prev)  # the usual step: the rows prepare made
        if rows is not None:
            self._advance(*rows[:3], t0)
            self._early = set(rows[3])
            return
        matchers, tokens, rids, done = [], [], [], set()
        for s in sched_out.scheduled:
            req = s.req
            g = req.grammar
            if g is None or g.matcher is None or not s.samples or req.is_finished or req.request_id in failed \
                    or req in prev:
                continue
            tok = sampled.get(req.request_id)
            if isinstance(tok, list):
                tok = tok[-1] if tok else None
            if tok is not None:
                matchers.append(g.matcher)
                tokens.append(tok)
                rids.append(req.request_id)
                done.add(req)
        self._advance(matchers, tokens, rids, t0)
        self._early = done

    def _accept(self, matchers: list[Any], tokens: list[int], rids: list[str]) -> None:
        """Advance the matchers (a terminated grammar takes no more tokens)."""
        t0 = time.perf_counter()
        if any([m.is_terminated() for m in matchers]):
            live = [j for j, m in enumerate(matchers) if not m.is_terminated()]
            matchers, tokens, rids = [matchers[j] for j in live], [tokens[j] for j in live], [rids[j] for j in live]
        ok = self._get_backend().accept_tokens(matchers, tokens)
        for j in [j for j, accepted in enumerate(ok) if not accepted]:
            logger.warning("request %s: token %d breaks its grammar", rids[j], tokens[j])
        self.stats["accept_thread_s"] += time.perf_counter() - t0

    def _pool_for_fills(self) -> ThreadPoolExecutor:
        if self._fill_pool is None:
            self._fill_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="octavo-bitmask")
        return self._fill_pool

    def _chunks(self) -> tuple[int, ThreadPoolExecutor] | None:
        if self.fill_threads <= 1:
            return None
        if self._chunk_pool is None:
            self._chunk_pool = ThreadPoolExecutor(max_workers=self.fill_threads - 1,
                                                  thread_name_prefix="octavo-bitmask-chunk")
        return self.fill_threads, self._chunk_pool

    def shutdown(self) -> None:
        for pool in (self._pool, self._fill_pool, self._chunk_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        if self._backend is not None and hasattr(self._backend, "close"):  # a worker process; a started native fill
            self._backend.close()


def apply_bitmask(logits: Any, rows: list[int], masks: list[bytes]) -> Any:
    """Set the logits of disallowed tokens to -inf on the given rows (worker side; no grammar state).

    ``masks[i]`` is row ``rows[i]``'s packed int32 bitmask: bit ``t % 32`` of word ``t // 32`` allows token ``t``.
    """
    import numpy as np
    import torch

    packed = torch.from_numpy(np.frombuffer(b"".join(masks), dtype=np.int32).reshape(len(masks), -1).copy())
    return apply_packed(logits, list(rows), packed)
