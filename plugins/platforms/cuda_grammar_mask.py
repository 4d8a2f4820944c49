"""The grammar bitmask applied to the logits on the device in one Triton launch: the CUDA platform's answer to
``Platform.make_grammar_mask_apply`` (the core calls it through the platform, never by import).

Why: the torch form (core/grammar_step.py ``apply_packed``: bytes -> ``index_select`` of a 256 x 8 bias table ->
``add_`` / ``index_add_``) takes 4-6 torch calls, 0.19 ms of host time per step on an H100 host at batch 32,
and that time sits on the critical path of a structured step under async scheduling (between the fill and
the sampler's launch, while the device waits). Here one launch reads the packed int32 rows (bit ``t % 32`` of
word ``t // 32`` allows token ``t``) and writes ``-inf`` into the disallowed logits of the given rows, in place.

Grid: (masked rows, column blocks of ``BLOCK``). ``rows`` maps packed row j to its logits row (int32 on the
device), or is absent when packed row j is logits row j.

The device gate (core/grammar_device_gate.py, session 9): :func:`wait_host_flag` queues a one-program kernel that
spins on a word of pinned host memory until the host wrote the step's number there (the grammar fill is done),
so the apply and the sampler are queued right after the forward, without waiting on the host; the apply then
reads the rows written after its launch with volatile loads (no stale cached lines).
"""

from __future__ import annotations

import ctypes
import logging

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch

BLOCK = 4096  # columns per program: 128 words


# reads of the host word before the wait gives up (~1-2 us each over PCIe: ~15-30 s) and records a time-out
MAX_SPINS = 1 << 24
_CHECKED: set[int] = set()  # data pointers of gate words already checked to be pinned host int32
# Session 15, opt-in (OCTAVO_GRAMMAR_GRAPH_DIRECT=1): a step of GatedApplyGraphs.run as three CUDA driver calls made
# through ctypes with the GIL kept (the step number set by cuMemsetD32Async, the logits copied by cuMemcpyDtoDAsync, the
# graph launched by cuGraphLaunch on the current stream) instead of torch's fill_ + copy_ + CUDAGraph.replay. Why:
# the apply cost the runner's thread 0.07-0.17 ms a step on the session's H200 hosts (s15 calls 1, 3, 4) for ~20 us of
# launches: torch's dispatch of two ops, and replay() releases the GIL, so the runner then queues behind the core
# thread's Python to get it back. The runner's thread sets a small model's step (the no-grammar-work floor measured as
# slow as JSON on call 4). The same graph, the same arguments, the same stream: the same bits.
# Session 17: it also makes the chained fill's side stream wait for the previous step's event by a driver call
# (cuStreamWaitEvent, GIL kept) instead of torch's Event.wait (host_fn_after), and launches the lean graph (LEAN).
DIRECT_LAUNCH = env_switch("OCTAVO_GRAMMAR_GRAPH_DIRECT", False)
# Session 17, on by default (OCTAVO_GRAMMAR_GRAPH_LEAN=0: off): a steady step's wait + apply as ONE torch call, the
# replay. The graph applies in place on the logits it was captured over (one graph per logits address seen CAPTURE_AFTER times; others
# take the copying graph), and its wait kernel counts the step number itself (device word + 1 each replay), so the host
# sets that word only when the step numbers of one graph's replays are not consecutive. Why: the runner's apply was
# 0.08-0.09 ms a chained step (session 16, H100), three torch calls (fill_, copy_, replay) on the runner's thread, which
# sets a small model's step. Same kernels, same rows: the same bits (tests/structured/test_apply_device.py). Flipped
# after two H200 calls (24 rotated rounds each, batch 32, same tokens, GPU tests passed): the apply 0.077 -> 0.040 ms a
# step; with no yield after a chained release (structured_output.YIELD_WHEN_CHAINED) -1.3 / -4.7 % at 135M and
# -6.2 / -2.9 % at 1.1B vs the chain without them (docs/performance.md "GPU host path, session 17").
LEAN = env_switch("OCTAVO_GRAMMAR_GRAPH_LEAN", True)
logger = logging.getLogger(__name__)
_DRIVER: dict = {}
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (CUDA builds of torch)


def _driver() -> ctypes.PyDLL | None:
    """libcuda's three entry points through a ctypes.PyDLL handle (the calls keep the GIL: each only queues work);
    None (and the reason in ``_DRIVER["why"]``) where the driver library or a symbol is missing."""
    if "lib" not in _DRIVER:
        try:
            lib = ctypes.PyDLL("libcuda.so.1")
            u64, ptr = ctypes.c_uint64, ctypes.c_void_p
            for name, argtypes in (("cuMemsetD32Async", [u64, ctypes.c_uint, ctypes.c_size_t, ptr]),
                                   ("cuMemcpyDtoDAsync_v2", [u64, u64, ctypes.c_size_t, ptr]),
                                   ("cuGraphLaunch", [ptr, ptr])):
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
            _DRIVER["lib"] = lib
        except (OSError, AttributeError) as e:
            _DRIVER["lib"], _DRIVER["why"] = None, str(e)
    return _DRIVER["lib"]


@triton.jit
def _apply_bitmask_kernel(logits_ptr, stride, packed_ptr, words, rows_ptr, vocab,
                          HAS_ROWS: tl.constexpr, BLOCK: tl.constexpr, VOLATILE: tl.constexpr):
    j = tl.program_id(0)
    b = tl.program_id(1)
    if HAS_ROWS:
        row = tl.load(rows_ptr + j).to(tl.int64)
    else:
        row = j.to(tl.int64)
    w_off = b * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    w = tl.load(packed_ptr + j.to(tl.int64) * words + w_off, mask=w_off < words, other=-1, volatile=VOLATILE)
    bits = (w[:, None] >> tl.arange(0, 32)[None, :]) & 1
    banned = tl.reshape(bits == 0, (BLOCK,))
    cols = b * BLOCK + tl.arange(0, BLOCK)
    tl.store(logits_ptr + row * stride + cols, float("-inf"), mask=banned & (cols < vocab))


def apply_bitmask_(logits: torch.Tensor, packed: torch.Tensor, rows: torch.Tensor | None,
                   volatile: bool = False) -> torch.Tensor:
    """In place: ``logits[rows[j], t] = -inf`` wherever bit t of ``packed[j]`` is clear (``rows`` None: row j).

    ``logits`` [R, V] (last dim contiguous), ``packed`` int32 [n, ceil(V/32)] contiguous, on the device or in pinned
    host memory (the GPU reads it through unified addressing: ``reads_pinned_host`` below); ``rows`` int32 [n] on
    the device or None. ``volatile``: read ``packed`` uncached (host rows written after this launch, behind
    :func:`wait_host_flag`)."""
    n, words = packed.shape
    vocab = logits.shape[-1]
    if n == 0:
        return logits
    assert logits.stride(-1) == 1 and packed.is_contiguous() and words * 32 >= vocab
    grid = (n, triton.cdiv(vocab, BLOCK))
    _apply_bitmask_kernel[grid](logits, logits.stride(0), packed, words, rows if rows is not None else packed,
                                vocab, HAS_ROWS=rows is not None, BLOCK=BLOCK, VOLATILE=volatile)
    return logits


@triton.jit
def _spin_until_opened(words_ptr, seq, max_spins):
    # words[0]: the last step number the host opened; words[1]: the last one a wait gave up on. One body for the
    # three wait kernels below (a host argument, a device word, a device word counted up by the replay)
    v = tl.load(words_ptr, volatile=True)
    i = 0
    while (v < seq) & (i < max_spins):
        v = tl.load(words_ptr, volatile=True)
        i += 1
    if v < seq:
        tl.store(words_ptr + 1, seq)


@triton.jit(do_not_specialize=["seq", "max_spins"])
def _wait_flag_kernel(words_ptr, seq, max_spins):
    _spin_until_opened(words_ptr, seq, max_spins)


def _first_sight(words: torch.Tensor) -> bool:
    """Check a gate buffer (pinned host int32 [2]) the first time it is seen; True then. Once per buffer:
    ``is_pinned()`` is a driver query, on the runner's thread."""
    if words.data_ptr() in _CHECKED:
        return False
    assert words.dtype == torch.int32 and words.numel() >= 2 and words.is_pinned()
    _CHECKED.add(words.data_ptr())
    return True


def wait_host_flag(words: torch.Tensor, seq: int, max_spins: int = MAX_SPINS) -> None:
    """Queue on the current stream: wait until ``words[0] >= seq`` (``words``: pinned host int32 [2] the host
    writes, read through unified addressing); after ``max_spins`` reads give up and write ``seq`` into
    ``words[1]`` (the host then fails the step: core/grammar_device_gate.py). ``seq`` and ``max_spins`` are not
    specialized on, so no step number triggers a compile."""
    if _first_sight(words):
        # the graphs' waits loaded now, before this first wait is queued: a kernel's first launch loads its module
        # (CUDA lazy loading), which waits for the device, i.e. for a queued wait, i.e. for the host's fill (the
        # graphs are captured on a later step, with waits in flight). -1 + 1 = 0 <= words[0]: both pass at once.
        scratch = torch.full((1,), -1, dtype=torch.int32, device=torch.cuda.current_device())
        _wait_inc_kernel[(1,)](words, scratch, MAX_SPINS, num_warps=1)
        _wait_dev_kernel[(1,)](words, scratch, MAX_SPINS, num_warps=1)
    _wait_flag_kernel[(1,)](words, seq, max_spins, num_warps=1)  # one warp: one host read per spin


#: core/grammar_step.py passes the pinned fill buffer itself (no host -> device copy call) to an apply saying so
apply_bitmask_.reads_pinned_host = True
#: and the device gate: the wait on a host word queued before the apply (core/grammar_device_gate.py)
apply_bitmask_.wait_host_flag = wait_host_flag


@triton.jit
def _wait_dev_kernel(words_ptr, seq_ptr, max_spins):
    # _wait_flag_kernel with the step number read from device memory: the form a CUDA graph can replay
    _spin_until_opened(words_ptr, tl.load(seq_ptr), max_spins)


@triton.jit
def _wait_inc_kernel(words_ptr, seq_ptr, max_spins):
    # the lean graph's wait (LEAN): this replay's step number is the device word + 1, kept there for the next replay
    seq = tl.load(seq_ptr) + 1
    tl.store(seq_ptr, seq)
    _spin_until_opened(words_ptr, seq, max_spins)


class GatedApplyGraphs:
    """The device gate's wait + the mask apply as ONE CUDA-graph replay (issue 11, session 12, opt-in
    ``OCTAVO_GRAMMAR_GRAPH=1``: core/grammar_device_gate.py).

    Why: the two Triton launches cost the runner's thread ~50 us a step on a quiet H100 host (s10 probe: apply 33,
    wait 16) and ~0.2 ms on a loaded one (s11), and that thread sets the step of a small model. Here a step costs
    three cheap calls instead: the step number into a device word (``fill_``: the value travels as a kernel
    argument, so no host buffer must outlive the call), the logits into the graph's static buffer (one device
    copy), one replay. Per key (logits shape/dtype/row stride, the pinned rows' address and shape, the gate
    words' address) one graph is captured on the key's CAPTURE_AFTER-th step (thread-local capture mode on a side
    stream: the core and bitmask threads keep using CUDA meanwhile); the step's seq never enters the graph, so steps in flight cannot race on it (a
    host word would: step N's wait may read it after step N+1 wrote it). Exactness: the same two kernels on the
    same rows (the apply on the static copy, which the caller samples from)."""

    MAX_GRAPHS = 8  # keys are few (one per decode batch size seen); beyond this the caller launches eagerly
    # a key is captured on its CAPTURE_AFTER-th step (a batch size that persists, not each size a ragged tail or a
    # changing serving batch passes through once); until then the caller launches the two kernels
    CAPTURE_AFTER = 3

    def __init__(self, max_spins: int = MAX_SPINS) -> None:
        self.max_spins = max_spins
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.seen: dict[tuple, int] = {}
        self.replays = 0
        self.direct = 0  # replays launched through the driver calls (DIRECT_LAUNCH)
        # LEAN: key + logits address -> [graph, seq word, last step number, exec handle, seq word's address]
        self.lean: dict[tuple, list] = {}
        self.lean_replays = self.lean_sets = 0  # replays of lean graphs; of them, those that set the step word
        self._stream: torch.cuda.Stream | None = None

    def _capture(self, key: tuple, logits: torch.Tensor, packed: torch.Tensor, words: torch.Tensor):
        dev = logits.device
        static = torch.empty_like(logits)
        seq = torch.zeros(1, dtype=torch.int32, device=dev)
        n, nwords = packed.shape
        vocab = logits.shape[-1]
        grid = (n, triton.cdiv(vocab, BLOCK))

        def body() -> None:
            _wait_dev_kernel[(1,)](words, seq, self.max_spins, num_warps=1)
            _apply_bitmask_kernel[grid](static, static.stride(0), packed, nwords, packed, vocab, HAS_ROWS=False,
                                        BLOCK=BLOCK, VOLATILE=True)

        body()  # compile both outside the capture; seq 0 passes at once (words[0] >= 0); static is scratch here
        # captured on an idle side stream without torch.cuda.graph's device synchronize, gc and empty_cache (the
        # graph allocates nothing; a synchronize here would wait for the fill of a step in flight)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=dev)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self._stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                body()
            finally:
                graph.capture_end()
        # (for DIRECT_LAUNCH: the graph's exec handle and the device addresses, fixed for the key)
        self.graphs[key] = (graph, static, seq, graph.raw_cuda_graph_exec(), static.data_ptr(), seq.data_ptr(),
                            static.numel() * static.element_size(), static.is_contiguous())
        return self.graphs[key]

    def _capture_due(self, key: tuple, graphs: dict, words: torch.Tensor) -> bool:
        """Count one more sight of ``key``; True when it has been seen :attr:`CAPTURE_AFTER` times and ``graphs`` has
        room (the gate buffer then checked once). The counts are bounded (logits at ever new addresses: a clear only
        delays a capture)."""
        if len(self.seen) > 4096:
            self.seen.clear()
        n = self.seen[key] = self.seen.get(key, 0) + 1
        if n < self.CAPTURE_AFTER or len(graphs) >= self.MAX_GRAPHS:
            return False
        _first_sight(words)
        return True

    def _capture_lean(self, key: tuple, logits: torch.Tensor, packed: torch.Tensor, words: torch.Tensor) -> list:
        n, nwords = packed.shape
        vocab = logits.shape[-1]
        grid = (n, triton.cdiv(vocab, BLOCK))
        seq = torch.full((1,), -1, dtype=torch.int32, device=logits.device)  # (-1 + 1 = 0: the warm call passes)
        scratch = logits.clone()

        def body(out: torch.Tensor) -> None:
            _wait_inc_kernel[(1,)](words, seq, self.max_spins, num_warps=1)
            _apply_bitmask_kernel[grid](out, out.stride(0), packed, nwords, packed, vocab, HAS_ROWS=False,
                                        BLOCK=BLOCK, VOLATILE=True)

        body(scratch)  # compiled outside the capture, on a scratch copy (the rows may not be this step's yet)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=logits.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self._stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                body(logits)  # in place on these logits (the key holds their address)
            finally:
                graph.capture_end()
        entry = self.lean[key] = [graph, seq, None, graph.raw_cuda_graph_exec(), seq.data_ptr()]
        return entry

    def run_lean(self, logits: torch.Tensor, packed: torch.Tensor, words: torch.Tensor, seq: int) -> bool:
        """:data:`LEAN`: queue wait(``words[0] >= seq``) + apply in place on ``logits`` as one replay and return True,
        or False (no lean graph for these logits' address yet: the caller takes :meth:`run`)."""
        if not logits.is_contiguous() or packed.shape[0] != logits.shape[0] or not packed.is_contiguous():
            return False
        key = (tuple(logits.shape), logits.dtype, logits.device.index, logits.data_ptr(), packed.data_ptr(),
               tuple(packed.shape), words.data_ptr())
        entry = self.lean.get(key)
        if entry is None:
            if not self._capture_due(key, self.lean, words):
                return False
            entry = self._capture_lean(key, logits, packed, words)
        lib = _driver() if DIRECT_LAUNCH else None  # (with DIRECT_LAUNCH: one driver call keeping the GIL, no torch)
        if lib is not None:
            raw, dev = _RAW_STREAM, logits.device
            stream = raw(dev.index) if raw is not None else torch.cuda.current_stream(dev).cuda_stream
            rc = ((lib.cuMemsetD32Async(entry[4], seq - 1, 1, stream) if entry[2] != seq - 1 else 0)
                  or lib.cuGraphLaunch(entry[3], stream))
            if rc:  # (the caller launches the two kernels from now on: grammar_device_gate._GRAPH_FAILED)
                raise RuntimeError(f"the lean grammar graph's direct launch failed: CUDA driver error {rc}")
            self.direct += 1
        else:
            if entry[2] != seq - 1:  # (not the step right after this graph's last replay: the word set first)
                entry[1].fill_(seq - 1)
            entry[0].replay()
        self.lean_sets += entry[2] != seq - 1
        entry[2] = seq
        self.lean_replays += 1
        self.replays += 1
        return True

    def run(self, logits: torch.Tensor, packed: torch.Tensor, words: torch.Tensor, seq: int) -> torch.Tensor | None:
        """Queue wait(``words[0] >= seq``) + apply of every row of ``packed`` (row j -> logits row j) on a copy of
        ``logits``; return that copy (masked once the replay ran), or None (no graph for this key: launch eagerly).
        :data:`LEAN`: in place on ``logits`` where a lean graph exists for their address (:meth:`run_lean`)."""
        if LEAN and self.run_lean(logits, packed, words, seq):
            return logits
        if logits.stride(-1) != 1 or packed.shape[0] != logits.shape[0] or not packed.is_contiguous():
            return None
        key = (tuple(logits.shape), logits.dtype, logits.stride(0), logits.device.index, packed.data_ptr(),
               tuple(packed.shape), words.data_ptr())
        entry = self.graphs.get(key)
        if entry is None:
            if not self._capture_due(key, self.graphs, words):
                return None
            entry = self._capture(key, logits, packed, words)
        graph, static, seq_dev, exec_, static_ptr, seq_ptr, nbytes, dense = entry
        lib = _driver() if DIRECT_LAUNCH and dense and logits.is_contiguous() else None
        if DIRECT_LAUNCH and lib is None and "warned" not in _DRIVER:
            _DRIVER["warned"] = True
            logger.warning("OCTAVO_GRAMMAR_GRAPH_DIRECT=1: launching the grammar graph through torch instead (%s)",
                           _DRIVER.get("why", "the logits are not one dense block"))
        if lib is not None:
            raw = _RAW_STREAM  # (the current stream's handle without building a torch Stream object)
            stream = raw(logits.device.index) if raw is not None else torch.cuda.current_stream(logits.device).cuda_stream
            rc = (lib.cuMemsetD32Async(seq_ptr, seq, 1, stream)
                  or lib.cuMemcpyDtoDAsync_v2(static_ptr, logits.data_ptr(), nbytes, stream)
                  or lib.cuGraphLaunch(exec_, stream))
            if rc:  # (the caller launches the two kernels from now on: grammar_device_gate._GRAPH_FAILED)
                raise RuntimeError(f"the grammar graph's direct launch failed: CUDA driver error {rc}")
            self.direct += 1
        else:
            seq_dev.fill_(seq)
            static.copy_(logits)
            graph.replay()
        self.replays += 1
        return static


#: the device gate's wait + apply as one graph replay (core/grammar_device_gate.py GRAPH, opt-in)
apply_bitmask_.gated_graphs = GatedApplyGraphs()
_SIDE: dict = {}  # device -> the side stream; ("raw", device) -> its handle


def host_fn_after(event: torch.Event, fn: int, arg: int) -> None:
    """Session 16 (core/grammar_chain.py): run the C host function ``fn(arg)`` on the CUDA driver's thread once
    ``event`` (the previous step's copy of its sampled ids to pinned host memory) completed: a side stream of the
    current device waits for the event, then ``cuLaunchHostFunc`` (the current stream goes on meanwhile: the next
    step's forward). ``fn`` must not call CUDA. Raises ``RuntimeError`` where the driver call fails."""
    lib = _driver()
    if lib is None:
        raise RuntimeError(f"libcuda cannot be loaded: {_DRIVER.get('why')}")
    launch = _DRIVER.get("host_fn")
    if launch is None:
        launch = _DRIVER["host_fn"] = lib.cuLaunchHostFunc
        launch.argtypes, launch.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    dev = torch.cuda.current_device()
    side = _SIDE.get(dev)
    if side is None:
        side = _SIDE[dev] = torch.cuda.Stream(device=dev)
        _SIDE[("raw", dev)] = side.cuda_stream
    raw_event = getattr(event, "event_id", 0) if DIRECT_LAUNCH else 0
    if raw_event:  # (session 17, with DIRECT_LAUNCH: the wait as one driver call too, GIL kept, no torch call)
        wait = _DRIVER.get("wait_event")
        if wait is None:
            wait = _DRIVER["wait_event"] = lib.cuStreamWaitEvent
            wait.argtypes, wait.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint], ctypes.c_int
        rc = wait(_SIDE[("raw", dev)], raw_event, 0)
        if rc:
            raise RuntimeError(f"cuStreamWaitEvent failed: CUDA driver error {rc}")
    else:
        try:
            event.wait(side)
        except TypeError:  # (a torch whose Event.wait does not take this Stream class)
            side.wait_event(event)
    rc = launch(_SIDE[("raw", dev)], fn, arg)
    if rc:
        raise RuntimeError(f"cuLaunchHostFunc failed: CUDA driver error {rc}")


apply_bitmask_.host_fn_after = host_fn_after
