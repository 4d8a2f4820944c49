"""What ``/v1/embeddings`` (``embeddings.py``) and the pooling routes (``pooling_routes.py``, their bodies in
``pooling_protocol.py``) share, so each rule has one copy:

- ``refuse_fields``: vLLM request fields that would change the result are refused (400 naming them) unless
  sent with their no-op value;
- ``input_prompts``: the forms of ``input`` (a string, strings, token ids, lists of token ids);
- ``tokenize_inputs``: text inputs tokenized off the event loop, size- and time-bounded;
- ``pool_all``: every input validated and queued before any runs (one bad input fails the whole request),
  then the results gathered;
- ``encode_vector``: ``float`` lists or ``base64`` (little-endian float32 bytes, the ``openai`` client's default).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from octavo.server.offload import run_bounded
from octavo.server.serving import RENDER_TIMEOUT_S


def refuse_fields(extras: dict[str, Any], refused: dict[str, tuple], where: str) -> None:
    """Raise a 400 for the first field of ``refused`` in ``extras`` whose value is not one of its no-op values
    (compared by value and type, so ``1`` is not ``True``)."""
    from octavo.errors import APIError

    for name, noop in refused.items():
        value = extras.get(name)
        if name in extras and not any(value is v or (value == v and type(value) is type(v)) for v in noop):
            raise APIError(400, f"{name} is not supported {where}; leave it out.", param=name)


def input_prompts(inp: Any) -> list[Any]:
    """``input`` -> one prompt per item (a string, or ``{"prompt_token_ids": ...}``); ``ValueError`` if malformed."""
    if isinstance(inp, str):
        return [inp]
    if not inp:
        raise ValueError("'input' is empty: give a string, a list of strings, or token ids.")
    if all(isinstance(x, int) for x in inp):
        return [{"prompt_token_ids": list(inp)}]  # one token array
    out = []
    for i, x in enumerate(inp):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, list) and x and all(isinstance(t, int) for t in x):
            out.append({"prompt_token_ids": x})
        else:
            raise ValueError(f"input[{i}] must be a non-empty string or a non-empty list of token ids.")
    return out


async def tokenize_inputs(engine: Any, prompts: list[Any], add_special_tokens: bool = True) -> list[Any]:
    """Text prompts -> ``{"prompt_token_ids", "prompt"}`` (token-id prompts pass through)."""
    out = []
    for p in prompts:  # off the event loop, size- and time-bounded
        if isinstance(p, str):
            ids = await run_bounded(lambda p=p: engine.encode(p, add_special_tokens=add_special_tokens),
                                    timeout_s=RENDER_TIMEOUT_S, what="tokenizing the input", param="input")
            p = {"prompt_token_ids": ids, "prompt": p}
        out.append(p)
    return out


async def pool_all(engine: Any, prompts: list[Any], base: str, priority: int, params: Any = None) -> list[Any]:
    """Queue every prompt as ``{base}-{i}`` (each with its own copy of the ``PoolingParams`` ``params``, or the
    model's default task for None), then return their final outputs in order."""
    streams = []
    try:  # validate and queue all inputs first: one bad input fails the whole request, nothing runs
        for i, prompt in enumerate(prompts):
            streams.append(engine.add_embedding_request(
                prompt, f"{base}-{i}", priority, pooling_params=params.clone() if params is not None else None))
    except BaseException:
        for st in streams:
            st.close()
        raise

    async def result(stream):
        try:
            async for out in stream:
                if out.finished:
                    return out
        finally:
            stream.close()

    return list(await asyncio.gather(*(result(st) for st in streams)))


def encode_vector(vector: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
