"""The outermost guard around the app (a plain ASGI middleware): body size, draining, and the last net.

- ``--max-request-body-bytes``: a declared ``Content-Length`` over the limit is answered 413 before a
  byte of the body is read; a chunked body is counted as it arrives and cut at the limit (413 too).
- While the server drains after SIGTERM, every new request gets 503 with ``Retry-After`` and
  ``Connection: close``; ``inflight`` counts the requests still being answered (streams until their
  last byte), which is what the shutdown waits for.
- Any exception no handler took becomes an OpenAI-shaped JSON error (one traceback in the log for a
  genuine 5xx) and is *not* re-raised, so uvicorn keeps the keep-alive connection open for the next
  request instead of dropping it without ``Connection: close``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.exceptions import HTTPException

from octavo.server.errors import classify, error_body

logger = logging.getLogger("octavo.server")

DRAIN_LIMIT_BYTES = 64 << 20  # an oversized body up to this size is read and dropped before the 413


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a body outgrows the limit; FastAPI re-raises HTTP exceptions as they are."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"The request body is larger than the server's limit of {limit} bytes "
                              "(--max-request-body-bytes).", headers={"Connection": "close"})


class ServerState:
    """Shared between the guard, the routes and the graceful shutdown."""

    def __init__(self) -> None:
        self.draining = False
        self.inflight = 0


class Guard:
    def __init__(self, app: Any, *, max_body_bytes: int, state: ServerState) -> None:
        self.app, self.max_body_bytes, self.state = app, max_body_bytes, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        if self.state.draining:
            await _send_json(send, 503, error_body(503, "The server is shutting down; retry on another instance "
                                                        "or later."),
                             [(b"retry-after", b"5"), (b"connection", b"close")])
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            # Discard the body without keeping it (bounded), so the client, still uploading, reads the 413
            # instead of a reset connection; nothing is parsed or stored.
            if declared <= DRAIN_LIMIT_BYTES:
                await _discard_body(receive)
            e = BodyTooLarge(limit)
            logger.info("answered 413 (param None): %s", e.detail)
            await _send_json(send, 413, error_body(413, e.detail), [(b"connection", b"close")])
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        self.state.inflight += 1
        try:
            await self.app(scope, limited_receive, tracking_send)
        except Exception as e:  # noqa: BLE001 - the last net: answer in OpenAI's shape, keep the connection
            status, message, param = classify(e)
            if status >= 500 and status != 503:
                logger.exception("internal error on %s %s", scope.get("method"), scope.get("path"))
            else:
                logger.info("answered %d (param %s): %s", status, param, message)
            if not started:
                await _send_json(send, status, error_body(status, message, param), [])
        finally:
            self.state.inflight -= 1


async def _discard_body(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _content_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_json(send: Any, status: int, body: dict, headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})
