"""Every error the server answers, in OpenAI's shape, from one place.

``{"error": {"message", "type", "param", "code"}}``: ``param`` names the request field at fault in the
client's own words (``max_completion_tokens``, not the internal ``max_tokens``), messages never carry
internal class names or tracebacks. ``classify`` maps any exception to (status, message, param) so a
non-streaming response and an in-stream error event say the same thing. Logging: one line per 4xx
(here), one traceback per genuine 5xx (in ``guard``), nothing for a client that went away.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi.responses import JSONResponse

from octavo.errors import APIError, EngineDeadError

logger = logging.getLogger("octavo.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          503: "service_unavailable_error"}


class ServerShuttingDown(EngineDeadError):
    """The server is stopping (SIGTERM): new requests get 503, requests still running at the deadline end."""


def error_body(status: int, message: str, param: str | None = None, code: Any = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "internal_error" if status >= 500 else
                                                              "invalid_request_error"),
                      "param": param, "code": code if code is not None else status}}


def error_response(status: int, message: str, *, param: str | None = None, code: Any = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error response; logs one line (4xx at INFO, 5xx at WARNING; tracebacks are logged elsewhere)."""
    log = logger.info if status < 500 else logger.warning
    log("answered %d%s: %s", status, f" (param {param})" if param else "", message)
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


# SamplingParams says "SamplingParams.<field>: <why>"; the request may have named that field differently.
_SP_FIELD = re.compile(r"^SamplingParams\.(\w+): (.*)$", re.S)


def client_param(field: str, body: Any = None) -> str:
    """The client's name for an internal sampling field (``max_tokens`` may have come as
    ``max_completion_tokens``, chat's ``logprobs`` count as ``top_logprobs``)."""
    given = set(getattr(body, "model_fields_set", ()) or ())
    if field == "max_tokens" and "max_completion_tokens" in given:
        return "max_completion_tokens"
    if field == "logprobs" and "top_logprobs" in given:
        return "top_logprobs"
    return field


def classify(e: BaseException, body: Any = None) -> tuple[int, str, str | None]:
    """Any exception -> (HTTP status, client-facing message, param)."""
    if isinstance(e, APIError):
        return e.status, e.message, e.param
    if isinstance(e, ServerShuttingDown):
        return 503, f"The server is shutting down: {e}", None
    if isinstance(e, EngineDeadError):
        return 503, f"The engine is down: {_first_line(str(e))}", None
    if isinstance(e, ValueError):
        text = _first_line(str(e))
        m = _SP_FIELD.match(text)
        if m:
            param = client_param(m.group(1), body)
            return 400, f"{param}: {m.group(2)}", param
        return 400, text, getattr(e, "param", None)
    return 500, "Internal server error (logged on the server).", None


def stream_error(e: BaseException, body: Any = None) -> dict[str, Any]:
    """An error inside an SSE stream (after the 200 was sent), in OpenAI's error shape."""
    status, message, param = classify(e, body)
    log = logger.info if status < 500 else logger.warning
    log("stream ended with %d%s: %s", status, f" (param {param})" if param else "", message)
    return error_body(status, message, param)


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else "unknown reason"
