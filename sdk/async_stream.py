"""``RequestStream``: the outputs of one request submitted to :class:`octavo.AsyncLLM`, as an async iterator.

The engine's output loop puts each ``RequestOutput`` (or the exception that ends the request) into the
request's queue; the stream hands them to the caller and, when the request ends or the caller stops early
(``close``), tells the engine to forget it and abort it in the core, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from octavo.async_llm import AsyncLLM
    from octavo.outputs import RequestOutput


class RequestStream:
    """The outputs of one submitted request, as an async iterator (from :meth:`AsyncLLM.add_request`).

    ``request_id`` is the caller's id (echoed in every output); ``internal_id`` is the engine's own.
    """

    def __init__(self, engine: AsyncLLM, request_id: str, queue: asyncio.Queue, internal_id: str | None = None):
        self.engine, self.request_id, self._queue = engine, request_id, queue
        self.internal_id = internal_id or request_id
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        q = self._queue
        out = q.get_nowait() if not q.empty() else await q.get()
        if isinstance(out, BaseException):
            self.finished = True
            self.engine._forget(self.internal_id)
            raise out
        if out.finished:
            self.finished = True
            self.engine._forget(self.internal_id)
        return out

    def close(self) -> None:
        """Abort the request if it is still running (frees its KV blocks); safe to call twice."""
        if not self.finished:
            self.finished = True
            self.engine._abort_internal([self.internal_id])
            self.engine._forget(self.internal_id)
