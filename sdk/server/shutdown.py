"""Graceful shutdown on SIGTERM / SIGINT: drain, then end what is left with a proper error, then exit 0.

    signal -> draining: every new request gets 503 + Retry-After (the Guard), /health too
           -> wait until no request is in flight, at most --shutdown-timeout seconds
           -> requests still running end with ServerShuttingDown: a stream gets an error event and
              [DONE], a non-streaming request a JSON 503 (AsyncLLM.fail_all)
           -> uvicorn stops (closes the listener, waits for the last bytes) and the engine core stops

A second signal while draining skips the wait. uvicorn's own handling would close the listener at once
and cut streams mid-way without an error event, which is what this replaces.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn

from octavo.server.errors import ServerShuttingDown
from octavo.server.guard import ServerState

logger = logging.getLogger("octavo.server")

FLUSH_S = 5.0  # after failing the rest, how long their handlers get to write the error out


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` whose exit signal drains the engine first (see the module docstring).

    Args:
        config: the uvicorn config.
        engine: the ``AsyncLLM`` (``num_unfinished``, ``fail_all``).
        state: the app's ``ServerState`` (``draining``, ``inflight``).
        timeout_s: how long running requests get to finish (``--shutdown-timeout``).
    """

    def __init__(self, config: uvicorn.Config, *, engine: Any, state: ServerState, timeout_s: float) -> None:
        super().__init__(config)
        self.engine, self.state, self.timeout_s = engine, state, timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._skip_wait = asyncio.Event()

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._captured_signals.append(sig)
        if self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        if self.state.draining:  # a second signal: stop waiting
            self._loop.call_soon_threadsafe(self._skip_wait.set)
            return
        self.state.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = self._loop.create_task(self._drain(), name="octavo-drain")

    async def _drain(self) -> None:
        t0 = self._loop.time()
        logger.info("shutting down: new requests get 503; %d in flight get up to %.0f s to finish",
                    self.state.inflight, self.timeout_s)
        await self._wait_idle(self.timeout_s)
        if self.state.inflight or self.engine.num_unfinished:
            n = self.engine.fail_all(ServerShuttingDown(f"the request was still running after the shutdown "
                                                        f"timeout ({self.timeout_s:g} s)"))
            logger.warning("shutdown timeout: ended %d running requests with an error", n)
            self._skip_wait.clear()
            await self._wait_idle(FLUSH_S)
        logger.info("drained in %.1f s", self._loop.time() - t0)
        self.should_exit = True

    async def _wait_idle(self, timeout_s: float) -> None:
        deadline = self._loop.time() + timeout_s
        while (self.state.inflight or self.engine.num_unfinished) and self._loop.time() < deadline \
                and not self._skip_wait.is_set():
            await asyncio.sleep(0.05)
