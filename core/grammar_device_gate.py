"""The device gate of a structured step under async scheduling: the device, not a host thread, waits for the mask.

Why (issue 11, GPU, small models): step N+1's mask needs N's tokens on the host, so until session 8 the runner
parked N+1's sampling on a Python gate and the core thread launched it after the fill. On a ~1-2 ms CUDA-graph
step that put a host chain (N's tokens -> accept -> fill -> apply + sampler launch -> N+2's forward launch) of
Python on three threads between two device steps: +24-54 % per step at batch 32 on the 1.1B and 135M shapes.
Here the runner queues everything of N+1 at once, as in an unconstrained step, with one wait in front of the mask:

    runner (step thread):  forward N+1 ─▶ logits ─▶ wait(words[0] >= seq) ─▶ apply (pinned rows, volatile) ─▶ sample
    core / bitmask thread: N's tokens ─▶ accept ─▶ fill N+1's rows into the pinned buffer ─▶ words[0] = seq

The host writes ``seq`` only after every row is in the buffer (x86 stores are seen in order, and the device
reads the rows in a later kernel than the word). The device spins on one SM while the host is late; after
``MAX_SPINS`` reads (~15-30 s) it gives up and writes ``seq`` into ``words[1]``, and the host fails that step
(:meth:`DeviceGate.check`), so a lost release costs a failed step, never a hang or a silently unmasked token.
NOTE: step N+2's fill starts in the engine core's next ``step()`` (when N+1's tokens are accepted). A caller that
leaves an engine with steps in flight and then waits on the same device (a ``torch.cuda.synchronize()``, or a
second engine on the same stream driven alone) waits for that time-out: drive the engine until it is idle
(``LLM.generate``, the server's loop and ``wait_idle`` all do), as benchmarks/structured_ab.py does.
Rows stay where :meth:`StructuredOutputManager.prepare` put them (no dropping of open or finished rows: the
launch already chose them). The fill buffer is reused safely: N+2's fill starts after N+1's tokens reached the
host, i.e. after N+1's apply ran. Requirements: the in-process executor, a pinned fill buffer, and a platform
apply offering ``wait_host_flag`` (CUDA's: plugins/platforms/cuda_grammar_mask.py); else the Python gate (park).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)


# On where the runner's platform apply can wait on a host word (CUDA); False: the runner parks its sampling on the
# Python gate as in sessions 6-8 (benchmarks/structured_outputs.py: json_async_devgate vs json_async_park). On by
# default since session 10: faster than the Python gate on both GPUs measured, same greedy tokens (batch 32, random
# weights, ms per step): H200 (s9) 135M shape 1.98 vs 2.28, 1.1B 1.90 vs 2.18; H100 (s10) 135M 1.70 vs 1.94,
# 1.1B 1.64 vs 2.11 (docs/performance.md). OCTAVO_GRAMMAR_DEVICE_GATE=0 turns it off.
DEVICE_GATE = env_switch("OCTAVO_GRAMMAR_DEVICE_GATE", True)
# Session 12: the wait + apply as ONE CUDA-graph replay where the platform's apply offers it (``gated_graphs``:
# plugins/platforms/cuda_grammar_mask.py GatedApplyGraphs), on the usual decode step (every row in order); the
# sampler then reads the graph's masked copy of the logits. On by default since session 12's batch 1 (H100, lane with
# neighbours, batch 32, ms per step, same greedy tokens): 135M json 2.16 -> 1.92 (free 1.60), the no-grammar-work
# floor 2.01 -> 1.64; 1.1B json 2.28 -> 2.12 (free 1.62). OCTAVO_GRAMMAR_GRAPH=0 launches the two kernels instead.
GRAPH = env_switch("OCTAVO_GRAMMAR_GRAPH", True)
# Session 14: a device-gated fill runs through the backend's ``fill_open`` (xgrammar's: plugins/structured_output/
# xgrammar_native.py): at the accept on the core thread (async_gate.NATIVE_OPEN_INLINE), in C over 4 threads, and the
# word opened from C right after it; no bitmask thread. On by default since the end of session 14: it beat the Python
# fill in all three GPU A/Bs (batch 32, same tokens; ms per step, as shipped -> native): H100 135M 1.993 -> 1.609
# (free async 1.635), H200 135M 2.051 -> 1.954 (1.667), H200 1.1B 1.992 -> 1.940 (1.678). Where it cannot run (a
# backend without ``fill_open``, no C compiler, another tvm_ffi) the default falls back to the Python fill with a
# warning (:func:`native_open_or_fallback`); OCTAVO_GRAMMAR_NATIVE_OPEN=1 set explicitly refuses there instead, =0 is
# the Python fill on the bitmask thread (benchmark mode json_async_pyfill).
NATIVE_OPEN = env_switch("OCTAVO_GRAMMAR_NATIVE_OPEN", True)
NATIVE_OPEN_EXPLICIT = bool(os.environ.get("OCTAVO_GRAMMAR_NATIVE_OPEN", "").strip())  # set: refuse, never fall back
# Session 15, opt-in: with NATIVE_OPEN at the accept, the core thread hands N+1's fill to the shim's C threads and does
# not wait for it (``fill_open_start``): it goes on to update N and schedule N+2 while C fills and opens the word (the
# device waits on the word, not the host). The fill is joined before the matchers move again and before the core
# thread waits for that step's tokens (GrammarStep.settle). Benchmark mode json_async_start.
NATIVE_START = env_switch("OCTAVO_GRAMMAR_NATIVE_START", False)
# Session 15, opt-in: N's accept inside that native call (row j accepts its token, then fills), so the core thread's
# Python accept (0.10 ms a step, session 15 call 1) leaves the step's path too (core/grammar_accept.py). Modes
# json_async_naccept (the fill waited for), json_async_start_naccept (not waited for).
NATIVE_ACCEPT = env_switch("OCTAVO_GRAMMAR_NATIVE_ACCEPT", False)
# (set to 1 explicitly: refused by name where the native fill does not run; their defaults just follow it)
NATIVE_START_ACCEPT_EXPLICIT = any(os.environ.get(n, "").strip() == "1"
                                   for n in ("OCTAVO_GRAMMAR_NATIVE_START", "OCTAVO_GRAMMAR_NATIVE_ACCEPT"))
if NATIVE_START_ACCEPT_EXPLICIT and not NATIVE_OPEN:
    raise ValueError("OCTAVO_GRAMMAR_NATIVE_START / OCTAVO_GRAMMAR_NATIVE_ACCEPT=1 work on the native fill, which "
                     "OCTAVO_GRAMMAR_NATIVE_OPEN=0 turns off: unset them or it")
# The benchmark's probe: time each device wait with two device events (read after the step's tokens arrived,
# core/structured_output.py stats "device_wait_s": how long the device idled for the fill; around the graph's replay
# since session 14, so the wait plus the apply). Off in the engine.
TIME_WAIT = False
_FAILED: dict[str, bool] = {}  # "wait": the wait kernel failed to launch in this process (the host waits instead)
_GRAPH_FAILED: list[str] = []  # why the wait + apply graph failed in this process (the two launches are used instead)
# (row index or not, logits dtype, row words, vocab, row stride) of the apply launched once before any wait was queued: a kernel's first launch loads
# its module (CUDA lazy loading), which waits for the device, i.e. for a queued wait, i.e. for the host's fill: a
# first apply behind a wait stalls the runner until the fill (a test that fills after the call: until the give-up)
_PREBUILT: set = set()


def check_native_open(backend: Any, name: str) -> None:
    """With :data:`NATIVE_OPEN` on: refuse, naming the switch, a backend without ``fill_open`` or whose native part
    cannot run here (xgrammar's: the C shim must build and tvm_ffi's library load)."""
    check = getattr(backend, "check_fill_open", None)
    if check is None:
        raise ValueError(f"OCTAVO_GRAMMAR_NATIVE_OPEN=1: the structured-output backend {name!r} has no native fill; "
                         "unset it or use 'xgrammar'")
    try:
        check()
    except (OSError, RuntimeError) as e:
        raise ValueError(f"OCTAVO_GRAMMAR_NATIVE_OPEN=1: the native fill cannot run here ({e}); unset it") from None


def native_open_or_fallback(backend: Any, name: str) -> bool:
    """The default :data:`NATIVE_OPEN` (not set explicitly), when an engine's device gate is first made: True when
    ``backend``'s native fill runs here; else a warning saying why, the backend's ``fill_open`` hidden (its steps take
    the Python fill on the bitmask thread), and False."""
    check = getattr(backend, "check_fill_open", None)
    if check is not None:  # (a backend with no native fill, e.g. guidance: the Python fill, nothing to say)
        try:
            check()
            return True
        except (OSError, RuntimeError) as e:
            if NATIVE_START_ACCEPT_EXPLICIT:  # (they need the native fill: refused by name)
                raise ValueError(f"OCTAVO_GRAMMAR_NATIVE_START / OCTAVO_GRAMMAR_NATIVE_ACCEPT=1: the {name} backend's "
                                 f"native fill cannot run here ({e}); unset them") from None
            logger.warning("structured outputs: the %s backend's native fill cannot run here (%s); using the Python "
                           "fill (OCTAVO_GRAMMAR_NATIVE_OPEN=0 chooses it without this check)", name, e)
    try:
        backend.fill_open = None
    except AttributeError:
        pass
    return False


def fill_gated(step: Any, accept: Any = None) -> None:
    """A device-gated ``GrammarStep``'s fill (core/grammar_step.py ``_fill``): the rows where the runner's launch put
    them, then the word opened: by a grammar worker process (``post_fill``), from C (:data:`NATIVE_OPEN`; started and
    not waited for with :data:`NATIVE_START`, joined in :func:`settle`), or here after the Python fill. ``accept``
    (core/grammar_accept.py): the previous step's accept, taken by the native call or run first."""
    post, posted = getattr(step.backend, "post_fill", None), False  # (a worker process opens the word)
    native = getattr(step.backend, "fill_open", None) if NATIVE_OPEN and post is None else None
    if accept is not None and native is None:
        accept()
    try:
        if post is not None:
            post(step.matchers, step.bitmask, step.seq)
            posted = True
        elif native is not None:  # filled and opened from C: no GIL between the two
            words = step.device_gate.words
            if NATIVE_START:  # handed to C's threads
                step._job = step.backend.fill_open_start(step.matchers, step.bitmask, words, step.seq, accept)
            posted = step._job is not None or native(step.matchers, step.bitmask, words, step.seq, accept)
        else:
            step._fill_rows()
    finally:  # open the device's wait even if the fill failed (the error fails the step on the host)
        step.t_fill1 = time.perf_counter()
        if not posted:
            step.device_gate.open(step.seq)
        elif native is not None and step._job is None:  # (the word opened at ``posted``; this thread's GIL after)
            step.open_lag_s, step.t_fill1 = step.t_fill1 - posted, posted
    step.fill_s = step.t_fill1 - step.t_fill0


def settle(step: Any) -> None:
    """``step``'s started native fill joined (GIL released only while it still runs); after a failed native call (C
    left the word closed) the job filled again in Python and the word is opened here, the error kept for the step."""
    job = step._job
    try:
        t_end = job.join()
    except BaseException as e:  # noqa: BLE001 - raised again by the step's wait()
        step._error, t_end = e, 0.0
    if not t_end:
        step.device_gate.open(step.seq)
    step._job = None
    step.t_fill1 = t_end or time.perf_counter()
    step.fill_s = step.t_fill1 - step.t_fill0


class DeviceGate:
    """Two pinned host int32 words the device reads: ``[0]`` the last step number opened, ``[1]`` the last one a
    device wait gave up on. One per engine core; step numbers rise by one per structured async step."""

    def __init__(self, pin: bool = True, words: Any = None, graphs: bool = True) -> None:
        import torch

        self.graphs = graphs  # False (the engine runs eagerly: enforce_eager): no grammar graph either (GRAPH)
        # ``words``: given by a grammar worker process (its shared block, plugins/structured_output/xgrammar_worker.py)
        self.words = torch.zeros(2, dtype=torch.int32, pin_memory=pin) if words is None else words
        self._np = self.words.numpy()
        self.seq = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def open(self, seq: int) -> None:
        """Let the device's waits for ``seq`` (and earlier) go on; called after the rows are written."""
        if self._np[0] < seq:
            self._np[0] = seq

    def check(self, seq: int, why: Any = None) -> None:
        """Raise if the device gave up waiting for ``seq`` (its sampling ran on an unfilled mask). ``why()``: the
        filler's own last error, if it keeps one (the grammar worker process: ``last_error``)."""
        if self._np[1] >= seq > 0:
            detail = why() if why is not None else ""
            raise RuntimeError(f"structured outputs: the device waited too long for step {seq}'s grammar masks and "
                               "sampled without them; the step's tokens are not valid (the host side was stalled "
                               "or failed before the fill, or the grammar worker process failed the fill)"
                               + (f"; the grammar worker's last error: {detail}" if detail else ""))


def apply_gated(logits: Any, grammar: Any, sample_req_ids: list[str], logits_rows: Any, kernel: Any) -> Any:
    """The runner's side: queue the wait for this step's number, then the apply of every grammar row from the
    pinned buffer (read uncached), without waiting on the host. ``grammar``: the step's ``GatedGrammarStep``."""
    import torch

    t0 = time.perf_counter()
    step = grammar.inner
    rids = step.request_ids
    if logits.shape[0] == len(rids) and rids == sample_req_ids:  # the usual decode step: every row, in order
        rows = None  # (one row per request, so the logits rows are the requests' positions: no index)
    else:
        pos = {rid: i for i, rid in enumerate(sample_req_ids)}
        rows = logits_rows([pos[r] for r in rids])
    packed = step.bitmask  # [len(rows), words], pinned, filled (later) by the host in place
    events = None
    if TIME_WAIT and logits.device.type != "cpu":
        events = tuple(torch.Event(device=logits.device.type, enable_timing=True) for _ in range(2))
        events[0].record()
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    index = None  # every logits row in order (the usual decode step): no index
    if rows is not None and (len(rows) != logits.shape[0] or rows != list(range(len(rows)))):
        index = torch.tensor(rows, dtype=torch.int32)
        if logits.device.type != "cpu":  # through pinned memory: no stream sync (core/grammar_step.py _to_device)
            index = index.pin_memory().to(logits.device, non_blocking=True)
    built = (index is None, logits.dtype, packed.shape[-1], logits.shape[-1], logits.stride(0))  # (Triton's variants)
    if built not in _PREBUILT and logits.device.type != "cpu":
        kernel(logits.clone(), packed, index, volatile=True)  # (built and loaded on a scratch copy, no wait queued)
        _PREBUILT.add(built)
    graphs = (getattr(kernel, "gated_graphs", None) if GRAPH and step.device_gate.graphs and index is None
              else None)
    if graphs is not None and not _GRAPH_FAILED:
        try:
            out = graphs.run(logits, packed, step.device_gate.words, step.seq)
        except Exception as e:  # noqa: BLE001 - e.g. the capture fails here: the two launches from now on
            logger.warning("grammar mask: the wait + apply graph failed (%s); launching them eagerly from now on", e)
            _GRAPH_FAILED.append(repr(e))
            out = None
        if out is not None:
            if events is not None:  # (the probe around the replay: the wait plus the apply's few microseconds)
                events[1].record()
                step.wait_events = events
            grammar.apply_s = time.perf_counter() - t0
            return out
    try:
        kernel.wait_host_flag(step.device_gate.words, step.seq)
    except Exception as e:  # noqa: BLE001 - e.g. the wait kernel does not build here: wait on the host instead
        logger.warning("grammar mask: the device wait failed (%s); the runner waits for the fill from now on", e)
        _FAILED["wait"] = True
        grammar.wait()  # the gate opens after the fill, on the core thread (the old, blocking form)
    if events is not None:
        events[1].record()
        step.wait_events = events
    kernel(logits, packed, index, volatile=True)
    grammar.apply_s = time.perf_counter() - t0
    return logits
