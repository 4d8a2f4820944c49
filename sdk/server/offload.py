"""Run front-end CPU work (chat-template rendering, tokenization) off the event loop, with a time bound.

A chat template is a program: a request that may bring its own (``--trust-request-chat-template``)
can ask for a very long loop, and a big prompt takes a while to tokenize. On the event loop either one
stalls every other request and ``/health``. Here each job runs in its own daemon thread; the loop only
awaits its result. At the deadline the caller gets ``InputError`` at once, and the thread is stopped by
raising an exception inside it (``PyThreadState_SetAsyncExc``): Jinja templates are Python code, so a
runaway render ends at its next bytecode. Native code (the Rust tokenizer) cannot be interrupted, which
is why prompts are size-bounded before tokenizing (``InputProcessor.max_prompt_chars``).
At most ``MAX_CONCURRENT`` jobs run at once; the rest wait their turn (counted in their deadline).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from octavo.errors import InputError

T = TypeVar("T")

MAX_CONCURRENT = 4
# While a worker thread holds the GIL, the event loop waits up to this long for it: 1 ms instead of Python's
# 5 ms default keeps a request's many small hand-offs short (set once, when the server imports this module).
sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
_slots: dict[int, asyncio.Semaphore] = {}  # one semaphore per event loop


class _Deadline(BaseException):
    """Raised inside a job's thread when its deadline passed (BaseException: templates cannot catch it)."""


async def run_bounded(fn: Callable[[], T], *, timeout_s: float, what: str, param: str | None) -> T:
    """``fn()`` in a worker thread; ``InputError(param=param)`` if it takes longer than ``timeout_s``."""
    loop = asyncio.get_running_loop()
    slots = _slots.setdefault(id(loop), asyncio.Semaphore(MAX_CONCURRENT))
    deadline = loop.time() + timeout_s
    try:
        await asyncio.wait_for(slots.acquire(), timeout_s)
    except asyncio.TimeoutError:
        raise InputError(f"the server is busy {what}; retry.", param) from None
    fut: asyncio.Future = loop.create_future()
    lock = threading.Lock()
    state: dict[str, Any] = {"ident": None, "done": False}

    def deliver(result: Any, error: BaseException | None) -> None:
        if not fut.done():
            fut.set_exception(error) if error is not None else fut.set_result(result)

    def work() -> None:
        with lock:
            state["ident"] = threading.get_ident()
        _lower_priority()
        try:
            result, error = fn(), None
        except _Deadline:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        finally:
            with lock:
                state["done"] = True
        if not loop.is_closed():
            loop.call_soon_threadsafe(deliver, result, error)

    thread = threading.Thread(target=work, name="octavo-offload", daemon=True)
    try:
        thread.start()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise InputError(f"{what} took longer than {timeout_s:g} s; it was stopped.", param) from None
    finally:
        _stop(state, lock)
        slots.release()


def _lower_priority() -> None:
    """Nice this worker thread (Linux schedules threads one by one): the event loop thread wins the CPU, and
    with it the GIL, whenever both want it, so /health and small requests stay fast during a long job."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not permitted: only latency suffers
        pass


def _stop(state: dict, lock: threading.Lock) -> None:
    """Interrupt the job's thread if it is still running (no-op once it finished)."""
    with lock:
        if state["ident"] is not None and not state["done"]:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(state["ident"]), ctypes.py_object(_Deadline))
