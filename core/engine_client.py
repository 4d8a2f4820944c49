"""The front end's handle on the engine core: in its own process over ZeroMQ, or in a thread in-process.

Both clients have one surface, used by ``AsyncLLM`` from its event loop:

    client = make_engine_core_client(settings)      # starts the core (a process loads the model meanwhile)
    info = client.wait_ready()                       # blocks until the model is loaded -> ModelInfo
    client.add_requests([...]); client.abort_requests([...])
    outputs = await client.get_output()             # EngineCoreOutputs, or raises EngineDeadError
    stats = await client.call_utility("get_stats")
    client.shutdown()

The multiprocess client watches the core's process sentinel on the event loop, so a core that dies
(killed, crashed, out of memory) is noticed at once: ``get_output`` raises ``EngineDeadError`` with the
reason (the core's traceback when it could send one, else its exit code).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import multiprocessing
import os
import tempfile
import time
from typing import Any

import msgspec

from octavo.core.engine_core_proc import (
    ABORT,
    ADD,
    FATAL,
    OUTPUTS,
    READY,
    SHUTDOWN,
    UTILITY,
    UTILITY_METHODS,
    ThreadEngineCoreLoop,
    UtilityCall,
    UtilityResult,
    run_engine_core,
)
from octavo.core.messages import EngineCoreOutputs, EngineCoreRequest, ModelInfo
from octavo.errors import EngineDeadError, EngineStartError  # noqa: F401 - public home; old path kept one release

logger = logging.getLogger("octavo.engine_client")


class EngineCoreClient:
    """Common part: the output queue the event loop awaits, pending utility calls, the dead flag."""

    def __init__(self) -> None:
        self.model_info: ModelInfo | None = None
        self.dead_reason: str | None = None
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: dict[int, asyncio.Future] = {}
        self._call_types: dict[int, Any] = {}
        self._call_ids = itertools.count()
        self._dead_callbacks: list[Any] = []

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    def on_dead(self, callback: Any) -> None:
        """Call ``callback(reason)`` (on the event loop) when the core dies."""
        self._dead_callbacks.append(callback)

    def _ensure_loop(self) -> None:
        """Bind to the running event loop on first use (the client may be built before the loop exists)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            self._attach()

    def wait_ready(self) -> ModelInfo:
        """Block until the engine core is built; returns its ``ModelInfo``."""
        return self.model_info

    def _attach(self) -> None:
        """Start the transport-specific readers on ``self._loop``."""

    async def get_output(self) -> EngineCoreOutputs:
        self._ensure_loop()
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)  # every later call raises too
            raise item
        return item

    async def call_utility(self, method: str, *args: Any) -> Any:
        """Run ``method`` on the core between steps; returns its result (decoded with its declared type)."""
        self._ensure_loop()
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        call_id = next(self._call_ids)
        fut = self._loop.create_future()
        self._calls[call_id] = fut
        self._call_types[call_id] = UTILITY_METHODS.get(method, Any)
        self._send(UTILITY, UtilityCall(call_id, method, list(args)))
        return await fut

    def _on_utility_result(self, res: UtilityResult) -> None:
        fut = self._calls.pop(res.call_id, None)
        if fut is not None and res.error is not None:
            self._call_types.pop(res.call_id, None)
        if fut is None or fut.done():
            return
        if res.error is not None:
            fut.set_exception(RuntimeError(res.error))
        else:
            fut.set_result(msgspec.msgpack.decode(res.result, type=self._call_types.pop(res.call_id, Any)))

    def _mark_dead(self, reason: str) -> None:
        if self.is_dead:
            return
        self.dead_reason = reason
        logger.error("engine core died: %s", reason.strip().splitlines()[0] if reason.strip() else reason)
        err = EngineDeadError(reason)
        if self._queue is not None:
            self._queue.put_nowait(err)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(EngineDeadError(reason))
        self._calls.clear()
        for cb in self._dead_callbacks:
            try:
                cb(reason)
            except Exception:  # noqa: BLE001 - one observer must not stop the others
                logger.exception("engine-dead callback failed")

    # -- transport ---------------------------------------------------------------------------------------
    def _send(self, kind: bytes, obj: Any) -> None:
        raise NotImplementedError

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        for req in requests:
            self._send(ADD, req)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids and not self.is_dead:
            self._send(ABORT, list(request_ids))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        raise NotImplementedError


class MPEngineCoreClient(EngineCoreClient):
    """The core in a child process (multiprocessing spawn), talking msgpack over ZeroMQ ipc sockets."""

    def __init__(self, settings: Any, *, start_timeout_s: float = 600.0, adaptive_threads: bool = False):
        super().__init__()
        import zmq

        self._zmq = zmq
        self._tmpdir = tempfile.mkdtemp(prefix="octavo-")
        in_addr, out_addr = f"ipc://{self._tmpdir}/input", f"ipc://{self._tmpdir}/output"
        self._ctx = zmq.Context()
        self._in = self._ctx.socket(zmq.PUSH)
        self._in.setsockopt(zmq.SNDHWM, 0)  # never block the event loop on a send
        self._in.setsockopt(zmq.LINGER, 0)
        self._in.bind(in_addr)
        self._out = self._ctx.socket(zmq.PULL)
        self._out.setsockopt(zmq.RCVHWM, 0)
        self._out.setsockopt(zmq.LINGER, 0)
        self._out.bind(out_addr)
        self._enc = msgspec.msgpack.Encoder()
        self._dec_outputs = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._dec_utility = msgspec.msgpack.Decoder(UtilityResult)
        self._aout = None
        self._closed = False
        ctx = multiprocessing.get_context("spawn")
        settings_json = json.dumps(settings.model_dump(mode="json"))
        args = (settings_json, in_addr, out_addr, os.getpid(), adaptive_threads)
        from octavo.core.engine_prestart import take

        self.proc = take(args)  # `octavo serve` spawned it before parsing its settings (core/engine_prestart.py)
        if self.proc is None:
            self.proc = ctx.Process(target=run_engine_core, name="octavo-engine-core", daemon=True, args=args)
            self.proc.start()
        self._start_timeout_s = start_timeout_s

    def wait_ready(self) -> ModelInfo:
        """Block until the core has loaded the model; raises ``EngineStartError`` with its real reason."""
        if self.model_info is None:
            try:
                self.model_info = self._handshake(self._start_timeout_s)
            except BaseException:
                self._kill()
                raise
        return self.model_info

    def _handshake(self, timeout_s: float) -> ModelInfo:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._out.poll(100):
                kind, payload = self._out.recv_multipart()
                if kind == READY:
                    return msgspec.msgpack.decode(payload, type=ModelInfo)
                if kind == FATAL:
                    raise EngineStartError(msgspec.msgpack.decode(payload, type=str))
                continue
            if not self.proc.is_alive():
                raise EngineStartError(f"the engine core process exited with code {self.proc.exitcode} while "
                                       "loading the model (see its log above).")
        raise EngineStartError(f"the engine core did not become ready within {timeout_s:.0f} s.")

    def _attach(self) -> None:
        import zmq.asyncio

        self._aout = zmq.asyncio.Socket.from_socket(self._out)
        self._reader = self._loop.create_task(self._read_outputs(), name="octavo-core-reader")
        # The sentinel becomes readable when the process ends: death is noticed without polling.
        self._loop.add_reader(self.proc.sentinel, self._on_sentinel)
        if not self.proc.is_alive():
            self._loop.call_soon(self._on_sentinel)

    async def _read_outputs(self) -> None:
        while True:
            kind, payload = await self._aout.recv_multipart(copy=False)
            kind = bytes(kind.buffer)
            if kind == OUTPUTS:
                self._queue.put_nowait(self._dec_outputs.decode(payload.buffer))
            elif kind == UTILITY:
                self._on_utility_result(self._dec_utility.decode(payload.buffer))
            elif kind == FATAL:
                self._mark_dead(msgspec.msgpack.decode(payload.buffer, type=str))

    def _on_sentinel(self) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_reader(self.proc.sentinel)
            except (ValueError, OSError):
                pass
        if self._closed:
            return
        # Give the reader a moment to deliver a FATAL message that carries the real reason.
        self._loop.call_later(0.05, self._mark_dead_exit)

    def _mark_dead_exit(self) -> None:
        self.proc.join(0.1)
        self._mark_dead(f"the engine core process (pid {self.proc.pid}) died with exit code {self.proc.exitcode}.")

    def _send(self, kind: bytes, obj: Any) -> None:
        self._in.send_multipart([kind, self._enc.encode(obj)], copy=False)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Ask the core to stop, wait for it, then terminate (and kill) it if it doesn't: no orphan."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self.proc.sentinel)
            except (ValueError, OSError, RuntimeError):
                pass
        if self.proc.is_alive():
            try:
                self._in.send_multipart([SHUTDOWN, b""], flags=self._zmq.NOBLOCK)
            except self._zmq.ZMQError:
                pass
            self.proc.join(timeout_s)
        self._kill()

    def _kill(self) -> None:
        self._closed = True
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(2.0)
        for sock in (self._in, self._out):
            sock.close(linger=0)
        self._ctx.term()
        for name in ("input", "output"):
            try:
                os.unlink(os.path.join(self._tmpdir, name))
            except OSError:
                pass
        try:
            os.rmdir(self._tmpdir)
        except OSError:
            pass


class InprocEngineCoreClient(EngineCoreClient):
    """The core in a thread of this process: no serialization, but its steps share the GIL with HTTP work."""

    def __init__(self, settings: Any):
        super().__init__()
        from octavo.core.engine_core import EngineCore

        try:
            self.core = EngineCore(settings)
        except Exception as e:
            raise EngineStartError(f"engine core failed to start: {type(e).__name__}: {e}") from e
        self.model_info = self.core.model_info
        self._loopthread = ThreadEngineCoreLoop(self.core, self._emit)
        self._closed = False

    def _attach(self) -> None:
        self._loopthread.thread.start()

    def _emit(self, kind: bytes, obj: Any) -> None:
        """Called from the core thread; hands the message to the event loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if kind == OUTPUTS:
            loop.call_soon_threadsafe(self._queue.put_nowait, obj)
        elif kind == UTILITY:
            loop.call_soon_threadsafe(self._on_utility_result, obj)
        elif kind == FATAL:
            loop.call_soon_threadsafe(self._mark_dead, obj)

    def _send(self, kind: bytes, obj: Any) -> None:
        self._loopthread.put(kind, obj)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loopthread.thread.is_alive():
            self._loopthread.put(SHUTDOWN)
            self._loopthread.thread.join(timeout_s)
        else:
            self._loopthread._close_core()


def make_engine_core_client(settings: Any, *, adaptive_threads: bool = False) -> EngineCoreClient:
    """The client ``settings.server.disable_frontend_multiprocessing`` asks for (default: separate process).
    ``adaptive_threads``: the core process may choose its CPU thread count (core/cpu_threads.py)."""
    if settings.server.disable_frontend_multiprocessing:
        return InprocEngineCoreClient(settings)
    return MPEngineCoreClient(settings, adaptive_threads=adaptive_threads)
