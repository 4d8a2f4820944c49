"""vLLM's pooling routes: ``/pooling``, ``/classify``, ``/score`` + ``/v1/score``, ``/rerank`` + ``/v1/rerank`` +
``/v2/rerank``, with vLLM's (and Jina's / Cohere's, for rerank) request and response shapes.

``register_pooling_routes(app, engine, model_name, check_model, check_ready)`` is called once by
``build_app``. Every route runs its inputs as pooling requests through ``AsyncLLM.add_embedding_request``
with a ``PoolingParams`` (``octavo.pooling`` applies them in the front end), all validated before any runs.
A route that the served model cannot answer is a 400 saying why (``/classify`` on a generative or an
embedding model, ``/score`` on a classifier with several labels, ...). ``/score`` and ``/rerank`` use a
cross-encoder (a one-label classifier) on the tokenizer's pair template, or the cosine similarity of
embeddings for an embedding model, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI

from octavo.pooling import cosine, model_tasks, pair_prompts
from octavo.server.offload import run_bounded
from octavo.server.pooling_common import encode_vector, pool_all, tokenize_inputs
from octavo.server.pooling_protocol import ClassificationRequest, PoolingRequest, RerankRequest, ScoreRequest
from octavo.server.serving import RENDER_TIMEOUT_S

_NEEDS = {"classify": "a classification model (*ForSequenceClassification)",
          "score": "a cross-encoder (a classifier with one label) or an embedding model",
          "pooling": "a pooling model (embedding, classification or reward)"}


def register_pooling_routes(app: FastAPI, engine: Any, model_name: str, check_model, check_ready) -> None:
    """Add the pooling routes; each answers 400 with the reason when the served model cannot run it."""
    from octavo.errors import APIError

    info = engine.get_model_info()
    tasks = model_tasks(getattr(info, "pooler", None), getattr(info, "is_pooling", False))

    def refuse(route: str, what: str) -> APIError:
        kind = f"serves the pooling tasks {tasks}" if tasks else "is a generative model"
        return APIError(400, f"The model {model_name!r} ({info.architecture}) {kind}; {route} needs {_NEEDS[what]}.",
                        param="model", code="model_not_supported")

    def start(body: Any, path: str, what: str, task: str | None) -> None:
        check_model(body.model)
        if task is None or task not in tasks:
            raise refuse(path, what)
        check_ready()

    def prompts_of(body: Any) -> list[Any]:
        try:
            return body.prompts()
        except ValueError as e:
            raise APIError(400, str(e), param="input") from None

    def usage(outs: list[Any]) -> dict[str, int]:
        n = sum(len(o.prompt_token_ids) for o in outs)
        return {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}

    @app.post("/pooling")
    async def pooling(body: PoolingRequest) -> dict:
        task = body.task or (tasks[0] if tasks else None)
        start(body, "/pooling", "pooling", task)
        base = body.request_id or f"pool-{uuid.uuid4().hex}"
        prompts = await tokenize_inputs(engine, prompts_of(body), body.add_special_tokens)
        outs = await pool_all(engine, prompts, base, body.priority, body.pooling_params(task))
        data = [{"index": i, "object": "pooling", "data": encode_vector(_vector(o), body.encoding_format)}
                for i, o in enumerate(outs)]
        return {"id": base, "object": "list", "created": int(time.time()), "model": model_name, "data": data,
                "usage": usage(outs)}

    @app.post("/classify")
    async def classify(body: ClassificationRequest) -> dict:
        start(body, "/classify", "classify", "classify")
        base = body.request_id or f"classify-{uuid.uuid4().hex}"
        prompts = await tokenize_inputs(engine, prompts_of(body), body.add_special_tokens)
        outs = await pool_all(engine, prompts, base, body.priority, body.pooling_params("classify"))
        labels = (info.pooler or {}).get("id2label") or {}
        data = []
        for i, o in enumerate(outs):
            probs = list(o.outputs.data)
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": labels.get(str(best), str(best)), "probs": probs,
                         "num_classes": len(probs)})
        return {"id": base, "object": "list", "created": int(time.time()), "model": model_name, "data": data,
                "usage": usage(outs)}

    async def scores(body: Any, left: list[str], right: list[str], path: str, base: str) -> tuple[list, int]:
        """Scores of the (left, right) pairs and the prompt tokens used."""
        if "score" in tasks:
            start(body, path, "score", "score")
            tok = engine.get_tokenizer()
            prompts = await run_bounded(lambda: pair_prompts(tok, left, right, "text_1"), timeout_s=RENDER_TIMEOUT_S,
                                        what="tokenizing the pairs", param="text_1")
            outs = await pool_all(engine, prompts, base, body.priority, body.pooling_params("score"))
            return [float(o.outputs.data[0]) for o in outs], usage(outs)["prompt_tokens"]
        start(body, path, "score", "embed" if "embed" in tasks else None)
        uniq = list(dict.fromkeys(left + right))  # each distinct text embedded once
        prompts = await tokenize_inputs(engine, uniq, body.add_special_tokens)
        outs = await pool_all(engine, prompts, base, body.priority, body.pooling_params("embed"))
        vec = {text: o.outputs.embedding for text, o in zip(uniq, outs)}
        return [cosine(vec[a], vec[b]) for a, b in zip(left, right)], usage(outs)["prompt_tokens"]

    async def score(body: ScoreRequest) -> dict:
        left = [body.text_1] if isinstance(body.text_1, str) else list(body.text_1)
        right = [body.text_2] if isinstance(body.text_2, str) else list(body.text_2)
        if len(left) == 1:
            left = left * len(right)
        if not right or len(left) != len(right):
            raise APIError(400, f"text_1 has {len(left)} texts and text_2 {len(right)}: give one text_1 for many "
                           "text_2, or lists of the same non-zero length.", param="text_2")
        base = body.request_id or f"score-{uuid.uuid4().hex}"
        values, n = await scores(body, left, right, "/score", base)
        return {"id": base, "object": "list", "created": int(time.time()), "model": model_name,
                "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(values)],
                "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0}}

    async def rerank(body: RerankRequest) -> dict:
        try:
            docs = body.document_texts()
        except ValueError as e:
            raise APIError(400, str(e), param="documents") from None
        base = body.request_id or f"rerank-{uuid.uuid4().hex}"
        values, n = await scores(body, [body.query] * len(docs), docs, "/rerank", base)
        order = sorted(range(len(docs)), key=lambda i: values[i], reverse=True)
        if body.top_n:
            order = order[:body.top_n]
        results = [{"index": i, "relevance_score": values[i],
                    **({"document": {"text": docs[i]}} if body.return_documents else {})} for i in order]
        return {"id": base, "model": model_name, "usage": {"total_tokens": n}, "results": results}

    for path in ("/score", "/v1/score"):
        app.add_api_route(path, score, methods=["POST"])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.add_api_route(path, rerank, methods=["POST"])


def _vector(out: Any) -> list[float]:
    return list(out.outputs.embedding) if hasattr(out.outputs, "embedding") else list(out.outputs.data)
