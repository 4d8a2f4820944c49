"""One step's grammar bitmasks: filled on a host thread while the model runs, applied to the logits in one op.

Why a separate object: the fill is the only per-step cost of structured outputs that grows with the batch
(~0.2-0.5 ms per request in a JSON string on a CPU core), so it must not sit serially in front of the forward
pass. The engine core builds a :class:`GrammarStep` after scheduling and hands it to the executor:

    in-process executor:  step.start()  ──(host thread, GIL released)──▶ fill rows ─┐
                          runner: forward ─▶ logits ─▶ step.wait() ◀────────────────┘ ─▶ apply ─▶ sample
    other executors:      step.attach(batch): fill now, ship the rows as bytes (ScheduledRequestData)

On a GPU the forward is asynchronous anyway, so the fill also overlaps it on the host. Rows the grammar
leaves fully open (the matcher allows every token) are dropped after the fill: no mask is applied to them.
The bitmask buffer is allocated once per engine and reused (the runner consumes it inside the step).

Runner side (:func:`mask_logits`, :func:`apply_packed`): no grammar state, just the packed int32 rows
(bit ``t % 32`` of word ``t // 32`` allows token ``t``), turned into 0/-inf biases by a byte lookup table and
added to the rows that need them (one ``index_select`` and one add over the batch).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from octavo.core import grammar_chain, grammar_device_gate

logger = logging.getLogger(__name__)
_TABLES: dict[Any, Any] = {}  # (device, dtype) -> the byte -> 8 biases table
_CPU_DTYPES = ("float32", "float64", "bfloat16", "float16")  # torch dtypes, compared by name (no torch import)

# Under async scheduling the gate of step N+1 opens on the core thread right after N's tokens advanced the matchers;
# True: the fill then runs right there (rows split over the chunk threads), so the step thread waiting for it resumes
# at once. False: queued on the bitmask thread, one more hand-off (GIL) on the critical path (json_async_pool).
INLINE_AFTER_GATE = True
MIN_ROWS_PER_CHUNK = 8  # a row fills in ~10-40 us; a pool hand-off costs ~20-50 us (wake-up, GIL)
# On an accelerator, after the gate opened with the rows ready, the core thread blocks up to this long until the
# runner's thread took them (:meth:`GrammarStep.handoff`): else the woken runner waits for the GIL until the core
# thread blocks (~1 ms) or Python's 5 ms switch interval, while the device idles for the sampler. 0: off.
HANDOFF_WAIT_S = 0.002
# Where the platform has its own apply (``Platform.make_grammar_mask_apply``, handed in as ``kernel``; CUDA: one
# Triton launch, plugins/platforms/cuda_grammar_mask.py; CPU: one C pass over the packed words,
# plugins/platforms/cpu_grammar_mask.py) it runs; False: the core's own apply below, the byte-table add on an
# accelerator, numpy AND/OR on a CPU (the benchmark's json_async_table / overlap_numpy modes compare them).
PLATFORM_APPLY = True
# Where the platform's apply says it can (``reads_pinned_host`` on the callable: CUDA's), it reads the packed rows
# straight from the pinned fill buffer (UVA), not through a host -> device copy: session 8 (H100, random 1.1B) found
# the runner's thread in that copy call ~10% of a batch-1 JSON step. Safe as the buffer's reuse is (:func:`_to_device`):
# the next fill into it starts after this step's tokens, sampled after this kernel, reached the host. False: copy
# first (json_async_copy). A launch that fails falls back to the copy.
HOST_READ_APPLY = True


def fill_threads() -> int:
    """Threads a step's fill is split over: half the cores this process may use, at most 8 (the 2-vCPU VM: 1,
    i.e. no split; an H100 host's 16 cores per GPU: 8). ``OCTAVO_GRAMMAR_FILL_THREADS`` overrides it."""
    env = os.environ.get("OCTAVO_GRAMMAR_FILL_THREADS")
    if env:
        n = int(env) if env.strip().isdigit() else 0
        if n < 1:
            raise ValueError(f"OCTAVO_GRAMMAR_FILL_THREADS={env!r}: must be an integer >= 1")
        return n
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(8, cores // 2))


class GrammarStep:
    """The grammar rows of one step.

    Args:
        backend: the engine's ``StructuredOutputBackend`` (its ``fill_bitmasks`` fills many rows in one call).
        positions: index in ``batch.scheduled`` of each request that samples under a grammar.
        request_ids: those requests' ids, same order.
        matchers: their ``GrammarMatcher`` objects, same order.
        bitmask: a host int32 tensor with at least ``len(matchers)`` rows (reused across steps).
        pool: the one-thread executor the fill runs on when started early.
        chunks: ``(threads, pool)``: the fill is split into up to ``threads`` contiguous row ranges, all but the
            first filled on ``pool`` (``threads - 1`` workers); ``None``: one call for all rows.
    """

    __slots__ = ("backend", "positions", "request_ids", "matchers", "bitmask", "pool", "chunks", "_future",
                 "_rows", "_error", "fill_s", "wait_s", "apply_s", "t_start", "t_fill0", "t_fill1", "t_resume",
                 "handoff_wait_s", "_resumed", "cpu_hint", "cpu_pre", "parked", "device_gate", "seq", "wait_events",
                 "open_lag_s", "_job", "chain", "chain_next")

    def __init__(self, backend: Any, positions: list[int], request_ids: list[str], matchers: list[Any],
                 bitmask: Any, pool: ThreadPoolExecutor, chunks: tuple[int, ThreadPoolExecutor] | None = None) -> None:
        self.backend = backend
        self.positions = positions
        self.request_ids = request_ids
        self.matchers = matchers
        self.bitmask = bitmask[:len(matchers)]
        self.pool = pool
        self.chunks = chunks
        self._future: Future | None = None
        self._rows: tuple[list[str], list[int], Any] | None = None
        self._error: BaseException | None = None
        self.chain = self.chain_next = None  # this step's chained fill, and the next step's (core/grammar_chain.py)
        # seconds: filling (on whichever thread), blocked in wait() (the part not hidden by the forward),
        # applying the mask to the logits (host time; read by benchmarks/structured_outputs.py)
        self.fill_s = self.wait_s = self.apply_s = self.open_lag_s = 0.0  # open_lag_s: NATIVE_OPEN's word -> GIL back
        # perf_counter stamps (0: not reached): start() called, fill began / ended, the waiter resumed with the
        # rows; the manager sums the hand-offs between them (stats "start_lag_s", "resume_lag_s")
        self.t_start = self.t_fill0 = self.t_fill1 = self.t_resume = 0.0
        self.handoff_wait_s = 0.0  # set by the manager on an accelerator (HANDOFF_WAIT_S)
        self._resumed: threading.Event | None = None
        # the manager's shared {"device"[, "dtype", "vocab"]} from the runner's applies: the logits' device type, and
        # for the CPU numpy apply its dtype, so the fill builds its operands (grammar_mask_cpu.py) -> cpu_pre
        self.cpu_hint: dict | None = None
        self.cpu_pre: Any = None
        self.parked = False  # async: the runner's sampling was parked on the gate and ran on the releasing thread
        # the device gate (core/grammar_device_gate.py): the manager's DeviceGate where the runner can wait on the
        # device, and this step's number there (0: no device wait; set by the async loop's GatedGrammarStep)
        self.device_gate: Any = None
        self.seq, self.wait_events = 0, None  # wait_events: device events around the wait (the benchmark's probe)
        self._job: Any = None  # a native fill started and not waited for (grammar_device_gate.NATIVE_START): settle()

    def subset(self, keep: list[int]) -> GrammarStep:
        """A not yet started step of rows ``keep`` only (same buffer, pools and settings)."""
        g = GrammarStep(self.backend, [self.positions[j] for j in keep], [self.request_ids[j] for j in keep],
                        [self.matchers[j] for j in keep], self.bitmask, self.pool, self.chunks)
        g.handoff_wait_s, g.cpu_hint, g.device_gate = self.handoff_wait_s, self.cpu_hint, self.device_gate
        return g

    def _fill_rows(self) -> None:
        """All rows, split over the chunk threads when there are enough rows (the libraries release the GIL
        while they fill, so the chunks run in parallel; the first one on this thread)."""
        n = len(self.matchers)
        threads, pool = self.chunks if self.chunks is not None else (1, None)
        k = min(threads, n // MIN_ROWS_PER_CHUNK)
        if k <= 1:
            self.backend.fill_bitmasks(self.matchers, self.bitmask)
            return
        cuts = [n * i // k for i in range(k + 1)]
        futures = [pool.submit(self.backend.fill_bitmasks, self.matchers[a:b], self.bitmask[a:b])
                   for a, b in zip(cuts[1:-1], cuts[2:])]
        try:
            self.backend.fill_bitmasks(self.matchers[:cuts[1]], self.bitmask[:cuts[1]])
        finally:
            for f in futures:  # every chunk is over before the rows are read (or the step fails)
                f.result()

    def _fill(self, accept: Any = None) -> tuple[list[str], list[int], Any]:
        """``accept`` (core/grammar_accept.py): the previous step's accept, which a native fill may take; else run first."""
        t0 = self.t_fill0 = time.perf_counter()
        if self.seq:  # the device waits for these rows where the runner's launch put them (no compaction)
            grammar_device_gate.fill_gated(self, accept)
            return self.request_ids, self.positions, self.bitmask
        accept() if accept is not None else None
        self._fill_rows()
        # NOTE: numpy, not torch: `(t != -1).any(dim=1)` on [32, 1536] int32: 28-48 ms on the CPU torch, numpy 0.01
        words = self.bitmask.numpy()
        keep = np.flatnonzero((words != -1).any(axis=1))  # a row of all ones: every token allowed, no mask
        if len(keep) == len(words):
            rows = self.request_ids, self.positions, self.bitmask
        else:  # the kept rows move to the front of the same (reused) buffer
            words[:len(keep)] = words[keep]
            rows = ([self.request_ids[j] for j in keep], [self.positions[j] for j in keep],
                    self.bitmask[:len(keep)])
        hint = self.cpu_hint
        if hint and "dtype" in hint and len(rows[0]):
            from octavo.core.grammar_mask_cpu import mask_operands

            self.cpu_pre = (mask_operands(rows[2].numpy(), hint["vocab"], hint["dtype"], hint.setdefault("bufs", {})),
                            hint["dtype"])
        self.t_fill1 = time.perf_counter()
        self.fill_s = self.t_fill1 - t0
        return rows

    def start(self, gated: bool = False, accept: Any = None) -> None:
        """Begin filling: on the bitmask thread (the libraries release the GIL while they fill), or, when a gate opens
        (``gated``) and :data:`INLINE_AFTER_GATE`, on this thread (an error is kept and raised by :meth:`wait`).
        ``accept``: see :meth:`_fill` (run here first where this step does not fill on this thread)."""
        if self._future is not None or self._rows is not None or self._error is not None:
            accept() if accept is not None else None
            return
        if self.chain is not None and not grammar_chain.core_takes(self):  # the driver fills them (grammar_chain.py)
            self._rows = self.request_ids, self.positions, self.bitmask
            return
        self.t_start = time.perf_counter()
        if gated and INLINE_AFTER_GATE:
            if self.handoff_wait_s > 0:
                self._resumed = threading.Event()
            try:
                self._rows = self._fill(accept)
            except BaseException as e:  # noqa: BLE001 - raised again in wait(), on the runner's thread
                self._error = e
        else:
            accept() if accept is not None else None
            self._future = self.pool.submit(self._fill)

    def settle(self) -> None:
        """A native fill started and not waited for (grammar_device_gate.NATIVE_START) is over (joined; a failed call
        filled again in Python, the word opened here, the error kept for :meth:`wait`). Called before the matchers move
        and before the host waits for this step's tokens."""
        if self._job is not None:
            grammar_device_gate.settle(self)
        if self.chain is not None:
            grammar_chain.settle(self)

    def start_on_pool(self, started_wait_s: float = 0.0, before: Any = None) -> None:
        """Fill on the bitmask thread in one call (no row chunks: they would wait for the GIL the caller keeps); block up
        to ``started_wait_s`` until that thread runs (it takes the GIL now). :meth:`wait` collects the rows."""
        if self._future is not None or self._rows is not None or self._error is not None:
            return
        self.chunks = None
        self.t_start = time.perf_counter()
        started = threading.Event()

        def run():
            started.set()
            try:  # the previous step's accept first (core/structured_output.py ACCEPT_ON_FILL_THREAD)
                if before is not None:
                    before()
            finally:  # the fill runs even after a failed accept (a device may wait for it); that error then rises
                rows = self._fill()
            return rows

        self._future = self.pool.submit(run)
        if started_wait_s > 0:
            started.wait(started_wait_s)

    def wait(self) -> tuple[list[str], list[int], Any]:
        """``(request ids, their positions in batch.scheduled, packed rows [n, words])`` of the rows to mask;
        fills now if ``start`` was not called. Safe to call more than once."""
        if self._job is not None or self.chain is not None:
            self.settle()
        if self._error is not None:
            raise self._error
        if self._rows is None:
            t0 = time.perf_counter()
            self._rows = self._future.result() if self._future is not None else self._fill()
            self._future = None
            self.t_resume = time.perf_counter()
            self.wait_s = self.t_resume - t0
        elif not self.t_resume:
            self.t_resume = time.perf_counter()
        if self._resumed is not None:
            self._resumed.set()
        return self._rows

    def handoff(self) -> None:
        """After an inline fill, on the gate's thread: block (GIL released) at most ``handoff_wait_s`` until the
        runner's thread has the rows, so it applies and samples now, not when this thread next blocks."""
        if self.handoff_wait_s > 0 and self._rows is not None and not self.t_resume:
            self._resumed.wait(self.handoff_wait_s)

    def attach(self, batch: Any) -> None:
        """Fill now; each masked row into its ``ScheduledRequestData.grammar_bitmask`` (bytes, crosses processes)."""
        self.cpu_hint = None  # the runner applies from the bytes: no operands to build
        _, positions, rows = self.wait()
        data = rows.numpy()
        for j, i in enumerate(positions):
            batch.scheduled[i].grammar_bitmask = data[j].tobytes()


def _bias_table(device: Any, dtype: Any) -> Any:
    """``[256, 8]``: row ``b`` holds, for each bit k of byte b, 0 if set (allowed) and -inf if clear."""
    import torch

    table = _TABLES.get((device, dtype))
    if table is None:
        rows = [[0.0 if (b >> k) & 1 else float("-inf") for k in range(8)] for b in range(256)]
        table = _TABLES[(device, dtype)] = torch.tensor(rows, dtype=dtype, device=device)
    return table


def apply_packed(logits: Any, rows: list[int], packed: Any, pre: Any = None, kernel: Any = None) -> Any:
    """Set disallowed logits to ``-inf`` on ``rows`` (logits row indices) from packed int32 ``[len(rows), W]``.

    On an accelerator: the packed words are read as bytes (little-endian, byte j holds tokens 8j..8j+7), each byte
    looks up its 8 additive biases (0 or -inf) in a 256-row table, the ``[n, V]`` bias is added to the rows (or
    ``kernel``, the platform's apply: on CUDA one Triton launch, ``Platform.make_grammar_mask_apply``). On a CPU:
    numpy integer AND/OR, in place (:func:`_apply_packed_numpy`, ``pre`` its operands built by the fill).
    NOTE: both replaced shifts + ``masked_fill_``: ~90 ms at batch 32 x 49152 on this CPU torch (table add ~2 ms).
    """
    import torch

    device = logits.device
    n, vocab = len(rows), logits.shape[-1]
    whole = n == logits.shape[0] and rows == list(range(n))
    index = None if whole else torch.tensor(rows, dtype=torch.int32)
    if platform_apply_on(kernel) and logits.stride(-1) == 1:
        # one pass instead of the core's several (CUDA: one Triton launch instead of the table's 4-6 torch calls;
        # CPU: one C pass over the packed words instead of numpy's operands + two passes)
        on_host = device.type == "cpu"
        if (whole and HOST_READ_APPLY and getattr(kernel, "reads_pinned_host", False) and not on_host
                and not _TABLES.get("host_read_failed")
                and packed.is_contiguous() and packed.is_pinned()):
            try:
                out = kernel(logits, packed, None)  # the device reads the pinned rows itself: no copy call
            except Exception as e:  # noqa: BLE001 - e.g. a pointer the launcher refuses: copy first from now on
                logger.warning("grammar mask: reading the pinned rows from the device failed (%s); copying first", e)
                _TABLES["host_read_failed"] = True
            else:
                _TABLES["host_read_ok"] = True
                return out
        dev_packed = packed.contiguous() if on_host else _to_device(packed.contiguous(), device)
        try:
            out = kernel(logits, dev_packed, index if whole or on_host else _to_device(index, device))
        except Exception as e:  # noqa: BLE001 - a kernel that cannot build/compile here: the core's apply, same bits
            if _TABLES.get("kernel_ok"):
                raise
            logger.warning("grammar mask: the platform's apply failed (%s); using the core's own apply", e)
            _TABLES["kernel_failed"] = True
        else:
            _TABLES["kernel_ok"] = True
            return out
    if device.type == "cpu" and str(logits.dtype).removeprefix("torch.") in _CPU_DTYPES:
        return _apply_packed_numpy(logits, rows, packed, pre)
    if device.type != "cpu":
        packed = _to_device(packed.contiguous(), device)
        index = None if whole else _to_device(index, device)
    idx = packed.contiguous().view(torch.uint8).view(-1).to(torch.int32)
    bias = _bias_table(device, logits.dtype).index_select(0, idx).view(n, -1)[:, :vocab]
    if whole:
        return logits.add_(bias)
    return logits.index_add_(0, index, bias)


def platform_apply_on(kernel: Any) -> bool:
    """True when the platform's own apply ``kernel`` is to run (given, :data:`PLATFORM_APPLY`, and it has not
    failed in this process)."""
    return kernel is not None and PLATFORM_APPLY and not _TABLES.get("kernel_failed")


def _apply_packed_numpy(logits: Any, rows: list[int], packed: Any, pre: Any = None) -> Any:
    from octavo.core.grammar_mask_cpu import apply_packed_numpy  # (the CPU apply, there since session 16)

    return apply_packed_numpy(logits, rows, packed, pre)


def _to_device(t: Any, device: Any) -> Any:
    """Host -> device without a stream sync: through pinned memory (torch's caching host allocator keeps the staging
    block alive until the copy is done), so the host goes on queuing the sampler while the forward still runs (a
    copy from pageable memory would first wait for the whole stream). NOTE: on CUDA the reused fill buffer is itself
    pinned and copied from directly; safe, as the next fill into it starts only after this step's tokens (copied
    back after this copy, same stream) reached the host; under async scheduling N+1's fill waits for N's tokens."""
    if t.device.type != "cpu":
        return t.to(device)
    if not t.is_pinned():
        try:
            t = t.pin_memory()
        except RuntimeError:  # no pinned memory on this accelerator: a plain (synchronizing) copy is still right
            pass
    return t.to(device, non_blocking=True)


def mask_logits(logits: Any, batch: Any, sample_req_ids: list[str], logits_rows: Any, grammar: Any = None,
                kernel: Any = None) -> Any:
    """The runner's one call: apply this step's grammar masks, from ``grammar`` (a :class:`GrammarStep`
    passed in-process, waited for here, after the forward) or from the bytes in ``batch.scheduled``.

    ``logits_rows(rows)`` maps request positions in ``sample_req_ids`` to logits rows (a request with k
    speculative drafts owns k + 1 rows; see ``core/spec_decode.py``). ``kernel``: the platform's own apply
    (``Platform.make_grammar_mask_apply``) or None.
    """
    import numpy as np
    import torch

    if getattr(grammar, "seq", 0):  # async, the device waits for the fill (core/grammar_device_gate.py)
        return grammar_device_gate.apply_gated(logits, grammar, sample_req_ids, logits_rows, kernel)
    pos = {rid: i for i, rid in enumerate(sample_req_ids)}
    if grammar is not None:
        rids, _, packed = grammar.wait()
        if not rids:
            return logits
        t0 = time.perf_counter()
        step = getattr(grammar, "inner", grammar)  # (async: the GatedGrammarStep's GrammarStep)
        hint = getattr(step, "cpu_hint", None)
        if hint is not None:
            hint["device"] = logits.device.type  # the manager pins its fill buffer for an accelerator's copies
            if logits.device.type == "cpu" and not platform_apply_on(kernel):
                # the numpy apply: later fills build its operands (a platform kernel reads the packed words itself)
                hint["dtype"], hint["vocab"] = logits.dtype, logits.shape[-1]
            else:
                hint.pop("dtype", None)  # no operands to build
            if logits.device.type != "cpu" and "device_wait" not in hint:  # later async steps: the device gate
                hint["device_wait"] = platform_apply_on(kernel) and hasattr(kernel, "wait_host_flag")
        out = apply_packed(logits, logits_rows([pos[r] for r in rids]), packed, getattr(step, "cpu_pre", None),
                           kernel)
        grammar.apply_s = time.perf_counter() - t0
        return out
    masks = [(pos[s.request_id], s.grammar_bitmask) for s in batch.scheduled
             if s.grammar_bitmask is not None and s.request_id in pos]
    if not masks:
        return logits
    rows = [r for r, _ in masks]
    packed = torch.from_numpy(np.frombuffer(b"".join(m for _, m in masks), dtype=np.int32)
                              .reshape(len(masks), -1).copy())
    return apply_packed(logits, logits_rows(rows), packed, kernel=kernel)
