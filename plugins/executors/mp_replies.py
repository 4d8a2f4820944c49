"""A worker rank's replies to the engine core, in step order, without tying the rank's main thread to the device.

Under async scheduling the runner returns a *deferred* output (its device-to-host copies are still in flight).
Waiting for it on the main thread would keep the rank from receiving and preparing step N+1 while the device
runs step N, which is the point of async scheduling. So deferred outputs go to one reply thread that waits for
each (on every rank: waiting is what lets the runner patch its own copy of the sequences) and sends rank 0's;
a plain output (synchronous steps, a step with nothing to sample) is sent by the main thread once every
earlier reply is out. ZeroMQ sockets are not thread-safe, so one lock serialises every send on the socket.

A failure on the reply thread is sent to the engine core at once (its ``ExecutorError`` names the rank and
carries the traceback) and re-raised on the main thread at its next call, which ends the process.
"""

from __future__ import annotations

import queue
import threading
import traceback

import msgspec

from octavo.plugins.executors.mp import ERROR, OUTPUT
from octavo.step import RunnerOutput


def error_frames(tag: bytes, e: BaseException) -> list[bytes]:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return [ERROR, tag, f"{type(e).__name__}: {e}\n{text}".encode()]


class Replies:
    """Sends this rank's step outputs (``returns_output``: tp rank 0 of the last stage) in step order."""

    def __init__(self, sock, tag: bytes, returns_output: bool, bind_device=None) -> None:
        self._sock, self._tag, self.returns_output = sock, tag, returns_output
        self._bind_device = bind_device
        self._lock = threading.Lock()
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._thread_enc = msgspec.msgpack.Encoder()  # msgspec encoders are not shared across threads
        self._enc = msgspec.msgpack.Encoder()
        self.error: BaseException | None = None

    def send(self, frames: list[bytes]) -> None:
        with self._lock:
            self._sock.send_multipart(frames)

    def output(self, out) -> None:
        """One step's answer: a :class:`RunnerOutput`, or a deferred one (``result()`` waits for the device)."""
        self.check()
        if isinstance(out, RunnerOutput):
            self.drain()
            if self.returns_output:
                self.send([OUTPUT, self._tag, self._enc.encode(out)])
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="octavo-mp-replies", daemon=True)
            self._thread.start()
        self._q.put(out)

    def drain(self) -> None:
        """Wait until every earlier reply is sent (before a plain output or a collective_rpc answer)."""
        if self._thread is not None:
            self._q.join()
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError("the reply thread failed (its traceback went to the engine core)") from self.error

    def _run(self) -> None:
        if self._bind_device is not None:
            self._bind_device()
        while True:
            out = self._q.get()
            try:
                if out is None:
                    return
                if self.error is None:
                    res = out.result()
                    if self.returns_output:
                        self.send([OUTPUT, self._tag, self._thread_enc.encode(res)])
            except BaseException as e:  # noqa: BLE001 - reported to the engine core, then ends the rank
                self.error = e
                try:
                    self.send(error_frames(self._tag, e))
                except Exception:  # noqa: BLE001 - the socket is gone: the core sees the process exit instead
                    pass
            finally:
                self._q.task_done()

    def close(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=5)
            self._thread = None
