"""Request fields that constrain the output, turned into one ``StructuredOutputsParams``.

Accepted, on chat and completions (the spellings vLLM and OpenAI clients send):

    response_format      {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
                         | {"type": "json_object"} | {"type": "text"} | {"type": "structural_tag", ...}
    structured_outputs   {"json" | "regex" | "choice" | "grammar" | "json_object" | "structural_tag": ...}
    guided_json, guided_regex, guided_choice, guided_grammar   (vLLM's older names)
    tool_choice          "required" / a named function (built in ``tool_calls``)

At most one source may be given. The grammar is checked here with the configured backend (no tokenizer,
milliseconds), so a bad schema, regex or grammar is a 400 that names the field before anything runs.
"""

from __future__ import annotations

import json
from typing import Any

from octavo.errors import APIError
from octavo.structured_outputs import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_UNSUPPORTED = ("guided_whitespace_pattern",)


def _field(req: Any, name: str) -> Any:
    """A declared field, or one the request model accepted as an extra."""
    if name in type(req).model_fields:
        return getattr(req, name)
    return (req.model_extra or {}).get(name)


def from_response_format(rf: Any) -> StructuredOutputsParams | None:
    """OpenAI's ``response_format`` as structured outputs (None for ``text``)."""
    if rf is None:
        return None
    if hasattr(rf, "model_dump"):
        rf = rf.model_dump()
    if not isinstance(rf, dict):
        raise APIError(400, "response_format must be an object with a 'type'", param="response_format")
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object",
                           param="response_format.json_schema.schema")
        return StructuredOutputsParams(json=spec["schema"])
    if kind == "structural_tag":
        tag = {k: v for k, v in rf.items() if k != "type"}
        return StructuredOutputsParams(structural_tag=json.dumps(tag))
    raise APIError(400, f"response_format.type {kind!r} is not one of text, json_object, json_schema, "
                   "structural_tag", param="response_format.type")


def structured_outputs_for(req: Any, backend: str, tool_constraint: StructuredOutputsParams | None = None
                           ) -> StructuredOutputsParams | None:
    """The one constraint a request asks for (or None), validated with ``backend``.

    Raises:
        APIError: 400 naming the field when two sources conflict or the grammar cannot compile.
    """
    found: dict[str, StructuredOutputsParams] = {}
    for name in _UNSUPPORTED:
        if _field(req, name) is not None:
            raise APIError(400, f"{name} is not supported; use a regex or grammar instead", param=name)
    chosen_backend = _field(req, "guided_decoding_backend")
    if chosen_backend is not None and chosen_backend != backend:
        raise APIError(400, f"guided_decoding_backend {chosen_backend!r} differs from the server's structured-"
                       f"outputs backend {backend!r}; drop the field or restart with --structured-outputs-backend",
                       param="guided_decoding_backend")
    try:
        rf = from_response_format(_field(req, "response_format"))
        if rf is not None:
            found["response_format"] = rf
        so = _field(req, "structured_outputs")
        if so is not None:
            if not isinstance(so, dict):
                raise ValueError("structured_outputs must be an object")
            so = {k: v for k, v in so.items() if v is not None}
            found["structured_outputs"] = StructuredOutputsParams(**so)
        for name, kind in _GUIDED.items():
            value = _field(req, name)
            if value is not None:
                found[name] = StructuredOutputsParams(**{kind: value})
    except APIError:
        raise
    except (TypeError, ValueError) as e:
        raise APIError(400, str(e), param=_param_of(str(e))) from None
    if tool_constraint is not None:
        found["tool_choice"] = tool_constraint
    if len(found) > 1:
        raise APIError(400, f"give at most one output constraint; got {sorted(found)}", param=sorted(found)[1])
    if not found:
        return None
    (field, params), = found.items()
    validate(params, backend, field)
    return params


def check_server_settings(settings: Any) -> None:
    """At server start: the named backend and parsers exist (``octavo.errors.UnknownPluginError`` otherwise),
    auto tool choice has its parser; then warm the backend's import."""
    from octavo.registry import get_plugin_manager

    pm = get_plugin_manager()
    server = settings.server
    pm.registration("structured_output_backends", settings.scheduler.structured_outputs_backend)
    if server.tool_call_parser:
        pm.registration("tool_parsers", server.tool_call_parser)
    if server.reasoning_parser:
        pm.registration("reasoning_parsers", server.reasoning_parser)
    if server.enable_auto_tool_choice and not server.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME (one of "
                         f"{', '.join(pm.names('tool_parsers'))})")
    warm(settings.scheduler.structured_outputs_backend)


#: ``octavo serve`` sets this so the warm-up waits until the server answers (``start_deferred_warm``): importing
#: xgrammar (and torch with it) in the front end while the core loads took ~1 s of the front end's CPU before
#: ready (issue 18 start-up); a structured request that comes before it is done waits for the import.
DEFER_WARM: list[str] | None = None
_warmed: set[str] = set()


def start_deferred_warm() -> None:
    """Start the warm-ups that ``DEFER_WARM`` held back."""
    global DEFER_WARM
    pending, DEFER_WARM = DEFER_WARM or [], None
    for backend in pending:
        warm(backend)


def warm(backend: str) -> None:
    """Import the backend's library on a daemon thread (xgrammar takes seconds to import), so the first
    structured request does not pay for it on the event loop. Once per backend and process."""
    import threading

    if DEFER_WARM is not None:
        DEFER_WARM.append(backend)
        return
    if backend in _warmed:
        return
    _warmed.add(backend)

    def load() -> None:
        from octavo.registry import resolve

        try:
            cls = resolve("structured_output_backends", backend)
            if cls.is_available():
                cls.validate(StructuredOutputsParams(json_object=True))
        except Exception:  # noqa: BLE001 - a broken backend is reported by the first request that uses it
            pass

    threading.Thread(target=load, name="octavo-grammar-warmup", daemon=True).start()


def _param_of(message: str) -> str | None:
    head = message.split(":", 1)[0]
    return head if head.replace(".", "").replace("_", "").isalnum() else None


def validate(params: StructuredOutputsParams, backend: str, field: str) -> None:
    """Check that ``backend`` can compile ``params``; a ``ValueError`` becomes a 400 naming ``field``."""
    from octavo.registry import resolve

    cls = resolve("structured_output_backends", backend)
    try:
        cls.validate(params)
    except ValueError as e:
        raise APIError(400, f"{field}: {e}", param=field) from None
