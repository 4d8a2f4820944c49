"""``POST /v1/embeddings`` (OpenAI-compatible) and the choice of routes that fit the served model.

``register_embedding_routes(app, engine, model_name, check_model, check_ready)`` is called by
:func:`octavo.server.app.build_app`:

- an embedding model (``ModelInfo.is_pooling``) keeps ``/v1/embeddings``; ``/v1/completions`` and
  ``/v1/chat/completions`` are replaced by routes that answer 400 with the reason;
- a generative model answers ``/v1/embeddings`` with 400 and the reason (start it with ``--task embed``
  if its architecture can pool).

Inputs: a string, a list of strings, a list of token ids, or a list of token-id lists (batched; all are
validated before any is queued). ``encoding_format`` is ``float`` or ``base64`` (little-endian float32
bytes, what the ``openai`` client asks for by default). ``dimensions`` truncates the vector and
re-normalises it (if the model's vectors are unit-length), and only for a model that declares Matryoshka
training (``is_matryoshka`` / ``matryoshka_dimensions`` in config.json or
``config_sentence_transformers.json``); any other model answers 400.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import ConfigDict, model_validator

from octavo.server.pooling_common import (
    encode_vector,
    input_prompts,
    pool_all,
    refuse_fields,
    tokenize_inputs,
)
from octavo.server.protocol import I32, U32, _Checked

logger = logging.getLogger("octavo.server")

_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


# vLLM's embedding-request fields that would change the result, with the values that change nothing.
_EMBED_REFUSED: dict[str, tuple] = {"truncate_prompt_tokens": (None,), "normalize": (None, True),
                                    "add_special_tokens": (None, True), "embed_dtype": (None, "float32")}


class EmbeddingRequest(_Checked):
    """The body of ``POST /v1/embeddings``."""

    # Unknown fields are kept so they can be judged: vLLM's fields that would change the vectors are refused
    # (400 naming them), the rest warned about once per name, as on the generation routes.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    input: str | list[str] | list[I32] | list[list[I32]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: U32 | None = None
    user: str | None = None
    priority: I32 = 0

    @model_validator(mode="after")
    def _extra_fields(self) -> EmbeddingRequest:
        from octavo.server.vllm_fields import check_extra_fields

        refuse_fields(self.model_extra or {}, _EMBED_REFUSED, "on /v1/embeddings")
        check_extra_fields(self)
        return self

    def prompts(self) -> list[Any]:
        return input_prompts(self.input)


def matryoshka_dimensions(model_dir: str | None) -> tuple[bool, list[int] | None]:
    """``(supports dimensions, allowed sizes or None for any)`` from a model directory's config files."""
    sizes, declared = None, False
    if model_dir and os.path.isdir(model_dir):
        for name in ("config.json", "config_sentence_transformers.json"):
            path = os.path.join(model_dir, name)
            if os.path.isfile(path):
                with open(path) as f:
                    data = json.load(f)
                declared = declared or bool(data.get("is_matryoshka", False))
                sizes = sizes or data.get("matryoshka_dimensions")
    return declared or bool(sizes), (list(sizes) if sizes else None)


def _truncate(vector: list[float], dims: int) -> list[float]:
    renormalize = abs(math.sqrt(sum(x * x for x in vector)) - 1.0) < 1e-3  # the model emits unit vectors
    out = vector[:dims]
    if renormalize:
        norm = math.sqrt(sum(x * x for x in out)) or 1.0
        out = [x / norm for x in out]
    return out


def _model_dir(engine: Any) -> str | None:
    try:
        from octavo.core.loader import locate

        settings = engine.settings.model
        if settings.model is None:
            return None
        directory, _ = locate(settings.model, revision=settings.revision, download_dir=settings.download_dir,
                              config_only=True)
        return directory
    except Exception:  # noqa: BLE001 - without the files, dimensions are simply not supported
        return None


def register_embedding_routes(app: FastAPI, engine: Any, model_name: str, check_model, check_ready) -> None:
    """Add ``/v1/embeddings`` and keep only the routes that fit the served model (see the module docstring)."""
    from octavo.errors import APIError

    info = engine.get_model_info()
    is_pooling = bool(getattr(info, "is_pooling", False))
    supports_dims, allowed_dims = matryoshka_dimensions(_model_dir(engine)) if is_pooling else (False, None)

    if is_pooling:
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in _GENERATION_PATHS]

        pooler = getattr(info, "pooler", None) or {}
        kind, use = ("an embedding model", "POST /v1/embeddings") if pooler.get("task", "embed") == "embed" else \
            (f"a pooling model ({pooler.get('tasks')})", "/classify, /score, /rerank or /pooling")

        async def not_generative() -> None:
            raise APIError(400, f"The model {model_name!r} ({info.architecture}) is {kind}: it cannot "
                           f"generate text. Use {use}.", code="model_not_generative")

        for path in _GENERATION_PATHS:
            app.add_api_route(path, not_generative, methods=["POST"], include_in_schema=False)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict:
        check_model(body.model)
        if not is_pooling:
            raise APIError(400, f"The model {model_name!r} ({info.architecture}) is a generative model and does not "
                           "serve embeddings; serve an embedding model, or start this one with --task embed if its "
                           "architecture supports pooling.", code="model_not_embedding")
        check_ready()
        if body.dimensions is not None:
            dim = getattr(info, "embedding_dim", None)
            if not supports_dims:
                raise APIError(400, f"The model {model_name!r} does not support 'dimensions' (it declares no "
                               "Matryoshka training); omit the parameter.", param="dimensions")
            if body.dimensions < 1 or (dim is not None and body.dimensions > dim) or \
                    (allowed_dims is not None and body.dimensions not in allowed_dims):
                valid = allowed_dims if allowed_dims is not None else f"1..{dim}"
                raise APIError(400, f"dimensions={body.dimensions} is not supported by {model_name!r}; use one of "
                               f"{valid}.", param="dimensions")
        try:
            prompts = body.prompts()
        except ValueError as e:
            raise APIError(400, str(e), param="input") from None
        prompts = await tokenize_inputs(engine, prompts)
        base = f"embd-{uuid.uuid4().hex}"
        outs = await pool_all(engine, prompts, base, body.priority)
        data, n_tokens = [], 0
        for i, out in enumerate(outs):
            vector = list(out.outputs.embedding)
            if body.dimensions is not None:
                vector = _truncate(vector, body.dimensions)
            data.append({"object": "embedding", "index": i, "embedding": encode_vector(vector, body.encoding_format)})
            n_tokens += len(out.prompt_token_ids)
        return {"id": base, "object": "list", "data": data, "model": model_name,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
