"""The xgrammar backend in a worker PROCESS (session 11, opt-in: ``OCTAVO_GRAMMAR_WORKER=1``).

Why (issue 11, GPU, small models): a structured step's grammar work (N's accept, N+1's fill, the glue around them)
ran on the engine core's thread and a bitmask thread that share one GIL with the runner's thread, and the runner's
Python is the step on a ~1.5 ms CUDA-graph step; session 10 measured that a no-op fill + accept costs as much as the
real one: the cost is the hand-offs, not the grammar. Here a spawned process owns every matcher:

    engine core: accept_tokens / matcher replays ──ops (queued, no I/O)──┐
                 N+1's fill ──one pipe message (the queued ops + "fill")─┴─▶ worker: accept, fill the rows into
                 shared memory, then write the step's number into the gate word (the device's wait opens)

The rows and the two gate words live in one shared-memory block, registered with CUDA (``pin``), so the device
reads them as it read the in-process pinned buffer (core/grammar_device_gate.py). A fill the host itself waits for
(no device gate: the first step of a burst, the serial path) gets a reply on the pipe. The engine's side keeps no
matcher state: its matchers are ids; "terminated" is known from the stop tokens it forwards (an xgrammar matcher
terminates only by accepting one, and a masked step samples only allowed tokens). Refused tokens are logged by the
worker. A worker error fails the step: a device-gated fill marks its step given-up (``words[1]``, the host's check
fails it), a host fill raises.

Status (session 12): experimental. CPU tests pass (tests/structured/test_grammar_worker.py); on an H100 the structured
benchmark ran with it and gave the in-process tokens (session 11), but tests/structured/test_grammar_worker_gpu.py
failed in sessions 11-12: not the worker but the apply's first launch loading its module behind the queued wait (a
~20 s stall, then the give-up; fixed in core/grammar_device_gate.py, session 12). Not for GPU serving until that test
passes on a GPU.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import subprocess
import sys
import threading
from typing import Any

from octavo.plugins.structured_output.xgrammar_match import _batch_accept, _Matcher, fill_rows
from octavo.structured_outputs import GrammarMatcher, StructuredOutputBackend

logger = logging.getLogger(__name__)
# int32 words before the rows (64-byte aligned): [0] the last step opened, [1] the last step given up on, [2] 1 once the
# worker has imported its libraries and read the tokenizer info (wait_ready: a slow start told from a hang), [3] the
# byte length of the worker's last error text, kept in words [16, 16 + _ERR_WORDS) (last_error: a device-gated fill
# that failed is reported on no pipe, only by the given-up word)
_ERR_WORDS = 256
_HEAD = 16 + _ERR_WORDS


class _RemoteMatcher(GrammarMatcher):
    """A matcher that lives in the worker: ``mid`` names it there."""

    __slots__ = ("owner", "mid", "_stop", "terminated")

    def __init__(self, owner: XGrammarWorkerBackend, mid: int) -> None:
        self.owner, self.mid, self._stop, self.terminated = owner, mid, owner.stop_ids, False

    def accept_token(self, token_id: int) -> bool:
        self.owner.accept_tokens([self], [token_id])
        return True

    def fill_bitmask(self, bitmask: Any, row: int) -> None:
        self.owner.fill_bitmasks([self], bitmask[row:row + 1])

    def is_terminated(self) -> bool:
        return self.terminated

    def reset(self) -> None:
        self.owner._queue(("reset", self.mid))
        self.terminated = False

    def __del__(self) -> None:  # (any thread, any time: a list append only; sent with the next message)
        try:
            self.owner._dead.append(self.mid)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


class XGrammarWorkerBackend(StructuredOutputBackend):
    """The xgrammar backend with its matchers in a worker process. ``rows``: the most rows a step fills."""

    name = "xgrammar"
    opens_gate = True  # core/grammar_step.py: a device-gated fill is posted (post_fill), the worker opens the word

    def __init__(self, inner: Any, rows: int) -> None:
        import multiprocessing as mp
        from multiprocessing.shared_memory import SharedMemory

        import torch

        super().__init__(inner.tokenizer, inner.vocab_size)
        self.inner = inner
        self.num_words = (inner.vocab_size + 31) // 32
        self.stop_ids = frozenset(inner.info.stop_token_ids)
        self.shm = SharedMemory(create=True, size=(_HEAD + rows * self.num_words) * 4)
        buf = torch.frombuffer(self.shm.buf, dtype=torch.int32)
        self._buf = buf
        buf[:_HEAD].zero_()
        self.words = buf[:2]
        self.rows = buf[_HEAD:_HEAD + rows * self.num_words].view(rows, self.num_words)
        self.rows.fill_(-1)
        self.pinned = False
        self._lock = threading.Lock()
        self._ops: list = []
        self._dead: list[int] = []
        self._ids = itertools.count(1)
        self._grammars: dict[int, tuple[Any, int]] = {}  # id(compiled) -> (compiled, its id in the worker)
        self._ticket = 0
        # a fresh interpreter (not multiprocessing's spawn, which re-imports the caller's __main__: a script
        # without a main guard would start its engine again in the worker)
        self._conn, child = mp.Pipe()
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, str(child.fileno()), self.shm.name,
                                       str(rows), str(self.num_words)], pass_fds=(child.fileno(),))
        child.close()
        # the tokenizer info (MBs) is sent by a thread holding the pipe: the worker reads it once torch and xgrammar
        # imported (seconds); meanwhile ops queue up and only the first fill waits
        self._send_lock = threading.Lock()
        self._send_lock.acquire()
        atexit.register(self.close)  # (an engine not shut down: the worker stops, the block is unlinked)
        threading.Thread(target=self._send_info, args=(inner.info.serialize_json(),), daemon=True,
                         name="octavo-grammar-worker-start").start()

    # ---- the backend interface (``inner``: the XGrammarBackend; the front end validates with the registry's class)
    def compile(self, params: Any) -> Any:
        return self.inner.compile(params)

    def matcher(self, compiled: Any) -> GrammarMatcher:
        with self._lock:
            known = self._grammars.get(id(compiled))
            if known is None or known[0] is not compiled:
                known = self._grammars[id(compiled)] = (compiled, next(self._ids))
                self._ops.append(("grammar", known[1], compiled.serialize_json()))
            mid = next(self._ids)
            self._ops.append(("new", mid, known[1]))
        return _RemoteMatcher(self, mid)

    def accept_tokens(self, matchers: list[GrammarMatcher], tokens: list[int]) -> list[bool]:
        """Queued (sent with the next fill); the worker logs a refused token. Answers True for every row."""
        self._queue(("acc", [m.mid for m in matchers], list(tokens)))
        stop = self.stop_ids
        for m, t in zip(matchers, tokens):
            if t in stop:
                m.terminated = True
        return [True] * len(matchers)

    def fill_bitmasks(self, matchers: list[GrammarMatcher], bitmask: Any) -> None:
        """The host waits: the worker fills the rows (in the shared block) and answers on the pipe."""
        row0 = self._row0(bitmask, len(matchers))
        with self._send_lock:
            self._ticket += 1
            ticket = self._ticket
            self._send_locked(("fill", [m.mid for m in matchers], row0, 0, ticket))
            reply = self._conn.recv()
        if reply[0] != "done" or reply[1] != ticket:
            raise RuntimeError(f"structured outputs: the grammar worker failed a fill: {reply[2:]}")

    def post_fill(self, matchers: list[GrammarMatcher], bitmask: Any, seq: int) -> None:
        """The device waits (core/grammar_device_gate.py): the worker fills the rows, then opens step ``seq``."""
        row0 = self._row0(bitmask, len(matchers))
        with self._send_lock:
            self._send_locked(("fill", [m.mid for m in matchers], row0, seq, 0))

    # ---- the rest -----------------------------------------------------------------------------------------------
    def last_error(self) -> str:
        """The worker's last error (a failed op or fill, repr'd, cut at 1 KiB), or "" if none."""
        n = int(self._buf[3]) if self._buf is not None else 0
        return self._buf[16:_HEAD].numpy().view("uint8")[:n].tobytes().decode("utf-8", "replace") if n else ""

    def wait_ready(self, timeout_s: float) -> float:
        """Block until the worker has started (imports done, tokenizer info read): the seconds waited. Raises,
        naming which, if the worker exited or is still starting after ``timeout_s`` (the engine never needs this:
        its first fill waits on the pipe; tests and benchmarks call it so a slow start is not taken for a hang)."""
        import time

        t0 = time.perf_counter()
        while self._buf[2].item() != 1:
            rc = self._proc.poll()
            if rc is not None:
                raise RuntimeError(f"grammar worker: the process exited with code {rc} before it was ready")
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"grammar worker: not ready after {timeout_s:.0f} s (still importing torch and "
                                   "xgrammar, or blocked before reading the tokenizer info); process alive")
            time.sleep(0.01)
        return time.perf_counter() - t0

    def pin(self) -> bool:
        """Register the shared block with CUDA (the device then reads the rows and the gate words directly)."""
        if not self.pinned:
            import torch

            cudart = torch.cuda.cudart()
            err = cudart.cudaHostRegister(self._buf.data_ptr(), self._buf.numel() * 4, 0)
            self.pinned = int(err) == 0 and self.rows.is_pinned()
            if not self.pinned:
                logger.warning("grammar worker: cudaHostRegister of the shared rows failed (%s); the device gate "
                               "stays off", err)
        return self.pinned

    def _row0(self, bitmask: Any, n: int) -> int:
        off = bitmask.data_ptr() - self.rows.data_ptr()
        row0, rem = divmod(off, self.num_words * 4)
        if rem or row0 < 0 or row0 + n > self.rows.shape[0] or (n > 1 and bitmask.stride(0) != self.num_words):
            raise ValueError("grammar worker: a fill must target rows of its shared buffer (StructuredOutputManager "
                             "allocates the step's bitmask there)")
        return row0

    def _send_info(self, info: str) -> None:
        try:
            self._conn.send(info)
        except (OSError, EOFError) as e:
            logger.warning("grammar worker: it did not start (%s)", e)
        finally:
            self._send_lock.release()

    def _queue(self, op: tuple) -> None:
        with self._lock:
            self._ops.append(op)

    def _send_locked(self, op: tuple) -> None:
        """Send the queued ops and ``op`` as one message (the caller holds ``_send_lock``)."""
        with self._lock:
            ops, self._ops = self._ops, []
        if self._dead:
            dead, self._dead = self._dead, []
            ops.append(("del", dead))
        ops.append(op)
        try:
            self._conn.send(ops)
        except (OSError, EOFError) as e:  # the worker died: nothing will open a device wait
            raise RuntimeError(f"structured outputs: the grammar worker is gone ({e})") from None

    def close(self) -> None:
        if self._buf is None:
            return
        try:
            if self._send_lock.acquire(timeout=5):
                self._conn.send([("stop",)])
        except (OSError, EOFError):
            pass
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        if self.pinned:
            import torch

            torch.cuda.cudart().cudaHostUnregister(self._buf.data_ptr())
        self.rows = self.words = self._buf = None
        try:
            self.shm.close()
            self.shm.unlink()
        except (BufferError, FileNotFoundError):  # a view still exported: the OS frees it with the process
            pass


def _keep_error(buf: Any, text: str) -> None:
    """The worker's side of :meth:`XGrammarWorkerBackend.last_error` (text first, then its length)."""
    import numpy as np

    data = text.encode("utf-8", "replace")[:_ERR_WORDS * 4]
    buf[16:_HEAD].numpy().view(np.uint8)[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    buf[3] = len(data)


def _main(conn: Any, shm_name: str, rows: int, num_words: int) -> None:
    """The worker process: apply each message's ops in order; a fill writes rows, then opens its step."""
    from multiprocessing import resource_tracker
    from multiprocessing.shared_memory import SharedMemory

    import torch
    import xgrammar as xgr

    shm = SharedMemory(name=shm_name)
    try:  # the engine's process owns (and unlinks) the block
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001
    except Exception:  # noqa: BLE001, S110
        pass
    buf = torch.frombuffer(shm.buf, dtype=torch.int32)
    gate = buf[:2].numpy()
    table = buf[_HEAD:_HEAD + rows * num_words].view(rows, num_words)
    info = xgr.TokenizerInfo.deserialize_json(conn.recv())
    buf[2] = 1  # ready (XGrammarWorkerBackend.wait_ready)
    grammars: dict[int, Any] = {}
    matchers: dict[int, _Matcher] = {}
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    failed: str | None = None  # an op that failed: the next fill fails with it
    while True:
        try:
            ops = conn.recv()
        except (EOFError, OSError):
            return
        for op in ops:
            kind = op[0]
            try:
                if kind == "fill":
                    _, mids, row0, seq, ticket = op
                    if failed is not None:
                        raise RuntimeError(failed)
                    fill_rows(xgr, batch, [matchers[i] for i in mids], table[row0:row0 + len(mids)])
                    if seq and gate[0] < seq:
                        gate[0] = seq  # after the rows (x86 stores are seen in order)
                    if ticket:
                        conn.send(("done", ticket))
                elif kind == "acc":
                    ms = [matchers[i] for i in op[1]]
                    live = [j for j, m in enumerate(ms) if not m.is_terminated()]
                    if live:
                        ok = _batch_accept(xgr, [ms[j].m for j in live], [op[2][j] for j in live])
                        for j, accepted in zip(live, ok):
                            m, tok = ms[j], op[2][j]
                            if tok in m._stop:
                                m.terminated = m.m.is_terminated()
                            if not accepted:
                                logger.warning("grammar worker: token %d breaks its grammar", tok)
                elif kind == "new":
                    matchers[op[1]] = _Matcher(xgr.GrammarMatcher(grammars[op[2]]))
                elif kind == "grammar":
                    grammars[op[1]] = xgr.CompiledGrammar.deserialize_json(op[2], info)
                elif kind == "reset":
                    matchers[op[1]].reset()
                elif kind == "del":
                    for i in op[1]:
                        matchers.pop(i, None)
                elif kind == "stop":
                    return
            except Exception as e:  # noqa: BLE001 - reported to the engine through the step it fails
                _keep_error(buf, f"{kind}: {e!r}")
                if kind != "fill":
                    failed = failed or f"{kind}: {e!r}"
                    continue
                _, _, _, seq, ticket = op
                if seq:
                    gate[1] = max(int(gate[1]), seq)  # the host's check fails this step
                    gate[0] = max(int(gate[0]), seq)  # and the device goes on now (nothing masked is used)
                if ticket:
                    conn.send(("err", ticket, repr(e)))


if __name__ == "__main__":  # started by XGrammarWorkerBackend: python -m <this module> FD SHM ROWS WORDS
    from multiprocessing.connection import Connection

    _main(Connection(int(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
