"""The engine core's busy loop, run in its own process (``AsyncLLM``'s default) or in a thread (in-process).

The loop owns one ``EngineCore``. It drains every pending input message (add, abort, utility call,
shutdown), runs one ``step()`` while any request is unfinished, and pushes the step's
``EngineCoreOutputs`` to the front end. When nothing is running it sleeps on its input (waking once a
second to check that its parent is still alive), so an idle server costs no CPU.

Wire format (ZeroMQ, two sockets, the front end binds both, the core connects)::

    front end  --PUSH-->  input  --PULL-->  core      frames: [kind, msgpack payload]
    front end  <--PULL--  output <--PUSH--  core

    input kinds:  b"A" EngineCoreRequest   b"X" list[str] (abort)   b"U" UtilityCall   b"S" shutdown
    output kinds: b"R" ModelInfo (ready, once)   b"O" EngineCoreOutputs   b"U" UtilityResult
                  b"E" str (fatal: startup or step failure, with traceback; the process then exits 1)

Settings travel as the JSON of ``settings.model_dump()``; nothing is pickled on the wire.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from typing import Any

import msgspec

from octavo.core.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    ModelInfo,
    SchedulerStats,
)

logger = logging.getLogger("octavo.engine_core")

# Message kinds (one byte each, first frame of every message); re-exported for older imports.
from octavo.core.engine_core_wire import ABORT, ADD, FATAL, OUTPUTS, READY, SHUTDOWN, UTILITY  # noqa: E402,F401

PARENT_CHECK_S = 1.0  # how often an orphaned core notices that its parent died


class UtilityCall(msgspec.Struct, array_like=True):
    call_id: int
    method: str
    args: list[Any] = []


class UtilityResult(msgspec.Struct, array_like=True):
    call_id: int
    result: msgspec.Raw = msgspec.Raw(b"\xc0")  # msgpack nil
    error: str | None = None


# Utility methods the front end may call, and what each returns (decoded with this type on the front end).
UTILITY_METHODS: dict[str, Any] = {"get_stats": SchedulerStats, "ping": str, "reset_prefix_cache": bool,
                                   "sleep": dict, "wake_up": Any, "is_sleeping": bool, "collective_rpc": list}


def reset_prefix_cache(core: Any) -> bool:
    """Forget every cached prefix block; False (nothing changed) while any request still holds blocks."""
    method = getattr(core, "reset_prefix_cache", None)
    return bool(method()) if method is not None else core.kv.pool.reset_prefix_cache()


class EngineCoreLoop:
    """The transport-independent loop. Subclasses provide ``_recv`` (blocking up to a timeout) and ``_send``."""

    def __init__(self, core: Any, settings: Any = None):
        self.core = core
        self.settings = settings
        self._shutdown = False
        self.governor: Any = None  # core/cpu_threads.py ThreadGovernor: picks torch threads per step (CPU server)
        self._prev_counts: tuple[int, int] | None = None

    # -- transport -------------------------------------------------------------------------------------
    def _recv(self, timeout_s: float | None) -> list[tuple[bytes, Any]]:
        """Every pending (kind, decoded message); waits up to ``timeout_s`` for the first (None: don't wait)."""
        raise NotImplementedError

    def _send(self, kind: bytes, obj: Any) -> None:
        raise NotImplementedError

    def _parent_alive(self) -> bool:
        return True

    # -- loop --------------------------------------------------------------------------------------------
    def run(self) -> None:
        from octavo.core.gc_heap import frozen_heap
        from octavo.core.start_gc import end_startup_freeze

        end_startup_freeze()  # the start-up imports' freeze (core/start_gc.py) becomes part of the heap frozen here
        with frozen_heap():  # full GC passes skip the start-up heap while serving (core/gc_heap.py)
            self._run()

    def _run(self) -> None:
        core = self.core
        last_check = time.monotonic()
        while not self._shutdown:
            busy = core.has_unfinished_requests()
            # Idle: sleep on the input (the front end wakes us). Busy: only drain what is already there.
            for kind, msg in self._recv(None if busy else PARENT_CHECK_S):
                self._handle(kind, msg)
            if self._shutdown:
                break
            if core.has_unfinished_requests():
                self._send(OUTPUTS, core.step() if self.governor is None else self._governed_step())
            now = time.monotonic()
            if now - last_check > PARENT_CHECK_S:
                last_check = now
                if not self._parent_alive():
                    logger.warning("engine core: parent process is gone; exiting")
                    break
                check_health = getattr(core, "check_health", None)
                if check_health is not None:
                    check_health()  # a dead worker raises: the step-failure path reports it and exits 1
        self._close_core()

    def _governed_step(self) -> Any:
        """One step at the thread count the governor picks; it learns from the step's time and work."""
        gov = self.governor
        gov.before_step()
        t0 = time.perf_counter()
        out = self.core.step()
        seconds = time.perf_counter() - t0
        stats = out.stats
        counts = None if stats is None else (stats.num_prompt_tokens, stats.num_generation_tokens)
        prev, self._prev_counts = self._prev_counts, counts
        key = None if counts is None or prev is None else (counts[0] - prev[0], counts[1] - prev[1])
        gov.after_step(seconds, key)
        return out

    def _handle(self, kind: bytes, msg: Any) -> None:
        core = self.core
        if kind == ADD:
            try:
                core.add_request(msg)
            except ValueError as e:  # a request that can never run: fail it alone, keep serving the rest
                out = EngineCoreOutput(request_id=msg.request_id, new_token_ids=[],
                                       finish_reason=FinishReason.ERROR, error=str(e))
                self._send(OUTPUTS, EngineCoreOutputs(outputs=[out], timestamp=time.monotonic()))
        elif kind == ABORT:
            core.abort_requests(msg)
            if not core.has_unfinished_requests():
                # No step will follow to report the freed blocks, so report them now (KV-usage metric -> 0).
                self._send(OUTPUTS, EngineCoreOutputs(outputs=[], stats=core.get_stats(),
                                                    timestamp=time.monotonic()))
        elif kind == UTILITY:
            self._send(UTILITY, self._call_utility(msg))
        elif kind == SHUTDOWN:
            self._shutdown = True

    def _call_utility(self, call: UtilityCall) -> UtilityResult:
        if call.method not in UTILITY_METHODS:
            return UtilityResult(call.call_id, error=f"unknown utility method {call.method!r}")
        try:
            if call.method == "ping":
                result: Any = "pong"
            elif call.method == "reset_prefix_cache":
                result = reset_prefix_cache(self.core)
            else:
                result = getattr(self.core, call.method)(*call.args)
            return UtilityResult(call.call_id, result=msgspec.Raw(msgspec.msgpack.encode(result)))
        except Exception as e:  # noqa: BLE001 - a failed utility call is reported to its caller only
            return UtilityResult(call.call_id, error=f"{type(e).__name__}: {e}")

    def _close_core(self) -> None:
        try:
            self.core.shutdown()
        except Exception:  # noqa: BLE001 - shutting down anyway
            logger.exception("engine core: error during shutdown")


# ------------------------------------------------------------------------------------------------------
# Separate process over ZeroMQ
# ------------------------------------------------------------------------------------------------------

class ZmqEngineCoreLoop(EngineCoreLoop):
    def __init__(self, core: Any, in_sock: Any, out_sock: Any, parent_pid: int):
        super().__init__(core)
        import zmq

        self._zmq = zmq
        self.in_sock, self.out_sock, self.parent_pid = in_sock, out_sock, parent_pid
        self._enc = msgspec.msgpack.Encoder()
        self._dec = {ADD: msgspec.msgpack.Decoder(EngineCoreRequest), ABORT: msgspec.msgpack.Decoder(list[str]),
                     UTILITY: msgspec.msgpack.Decoder(UtilityCall)}

    def _recv(self, timeout_s: float | None) -> list[tuple[bytes, Any]]:
        zmq = self._zmq
        if timeout_s is not None and not self.in_sock.poll(int(timeout_s * 1000)):
            return []
        msgs = []
        while True:
            try:
                kind, payload = self.in_sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return msgs
            kind = bytes(kind.buffer)
            dec = self._dec.get(kind)
            msgs.append((kind, dec.decode(payload.buffer) if dec else None))

    def _send(self, kind: bytes, obj: Any) -> None:
        self.out_sock.send_multipart([kind, self._enc.encode(obj)], copy=False)

    def _parent_alive(self) -> bool:
        return os.getppid() == self.parent_pid


def run_engine_core(settings_json: str, input_addr: str, output_addr: str, parent_pid: int,
                    adaptive_threads: bool = False) -> None:
    """Entry point of the engine-core process (``multiprocessing`` spawn target).

    Builds ``EngineCore`` from the settings, sends ``ModelInfo`` (or the startup error, with its
    traceback), then runs the loop until told to shut down or until the parent disappears.
    ``adaptive_threads``: the front end reserved a CPU for itself (``num_threads`` = its ``cpus - 1``
    default), so on a CPU the core may measure whether all CPUs serve it better (core/cpu_threads.py).
    """
    # Ctrl-C in a terminal reaches the whole process group; the front end decides how to stop us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s [core] %(name)s: %(message)s")
    import zmq

    ctx = zmq.Context()
    in_sock = ctx.socket(zmq.PULL)
    in_sock.connect(input_addr)
    out_sock = ctx.socket(zmq.PUSH)
    out_sock.setsockopt(zmq.LINGER, 2000)  # let the last message (e.g. a fatal error) reach the front end
    out_sock.connect(output_addr)
    enc = msgspec.msgpack.Encoder()
    exit_code = 0
    try:
        try:
            settings_dict = json.loads(settings_json)
            from octavo.core.loader.weights_cache import prefetch_for_model

            prefetch_for_model(settings_dict.get("model", {}).get("model"))  # hashed while torch imports
            from octavo.config import OctavoSettings
            from octavo.core.engine_core import EngineCore

            settings = OctavoSettings(**settings_dict)
            core = EngineCore(settings)
            info: ModelInfo = core.model_info
            governor = None
            if adaptive_threads:
                from octavo.core.cpu_threads import make_governor

                governor = make_governor(core, settings)
        except BaseException as e:  # noqa: BLE001 - any startup failure is reported with its real reason
            out_sock.send_multipart([FATAL, enc.encode(_describe(e, "engine core failed to start"))])
            exit_code = 1
            return
        out_sock.send_multipart([READY, enc.encode(info)])
        loop = ZmqEngineCoreLoop(core, in_sock, out_sock, parent_pid)
        loop.governor = governor
        try:
            loop.run()
        except BaseException as e:  # noqa: BLE001 - a failed step kills the core; the front end fails requests
            if not isinstance(e, SystemExit):
                logger.exception("engine core: step failed")
                out_sock.send_multipart([FATAL, enc.encode(_describe(e, "engine core step failed"))])
                exit_code = 1
            loop._close_core()
    finally:
        in_sock.close(linger=0)
        out_sock.close()
        ctx.term()
        # Skip the interpreter's teardown of torch and the model (seconds, for nothing): the OS frees it all.
        from multiprocessing import util

        util._exit_function()  # multiprocessing's own cleanup (unlinks semaphores, e.g. tqdm's lock)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


def _describe(e: BaseException, what: str) -> str:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return f"{what}: {type(e).__name__}: {e}\n{tb}"


# ------------------------------------------------------------------------------------------------------
# In-process: the same loop in a thread, fed by a queue
# ------------------------------------------------------------------------------------------------------

class ThreadEngineCoreLoop(EngineCoreLoop):
    """The loop in a daemon thread of the front-end process (``--disable-frontend-multiprocessing``).

    ``put(kind, obj)`` feeds it from any thread; ``emit(kind, obj)`` is called from the loop thread with
    each output (the client hands it to its event loop with ``call_soon_threadsafe``).
    """

    def __init__(self, core: Any, emit: Any):
        super().__init__(core)
        self.inbox: queue.SimpleQueue[tuple[bytes, Any]] = queue.SimpleQueue()
        self.emit = emit
        self.thread = threading.Thread(target=self._run_safely, name="octavo-engine-core", daemon=True)
        self.error: str | None = None

    def put(self, kind: bytes, obj: Any = None) -> None:
        self.inbox.put((kind, obj))

    def _recv(self, timeout_s: float | None) -> list[tuple[bytes, Any]]:
        msgs = []
        try:
            msgs.append(self.inbox.get(timeout=timeout_s) if timeout_s is not None else self.inbox.get_nowait())
            while True:
                msgs.append(self.inbox.get_nowait())
        except queue.Empty:
            return msgs

    def _send(self, kind: bytes, obj: Any) -> None:
        self.emit(kind, obj)

    def _run_safely(self) -> None:
        try:
            self.run()
        except BaseException as e:  # noqa: BLE001 - reported to the front end like a dead core process
            logger.exception("engine core thread: step failed")
            self.error = _describe(e, "engine core step failed")
            self.emit(FATAL, self.error)
            self._close_core()
