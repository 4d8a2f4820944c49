"""``AsyncLLM``: the asyncio engine behind the server, with the engine core in its own process.

The front end (this object, in the caller's process) tokenizes, applies chat templates, validates,
detokenizes and applies stop strings; the core (another process, over ZeroMQ + msgpack) only schedules
and runs the model on token ids. One output task reads the core's step outputs, turns them into
``RequestOutput`` objects and puts each into its request's queue, so every ``generate`` call is an async
iterator over its own outputs:

    engine = AsyncLLM(model="path/to/model.gguf", max_model_len=2048)
    params = SamplingParams(max_tokens=32, output_kind=RequestOutputKind.DELTA)
    async for out in engine.generate("Hello", params, request_id="r1"):
        print(out.outputs[0].text, end="")
    engine.shutdown()

Leaving the loop early (``break``, task cancellation, a client disconnect) aborts the request in the
core, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from octavo.async_llm_vllm import AsyncVllmMethods
from octavo.async_output_loop import AsyncOutputLoop
from octavo.async_stream import RequestStream
from octavo.config import OctavoSettings
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

__all__ = ["AsyncLLM", "RequestStream"]


# Beside this file: the output task (async_output_loop.py), each request's stream (async_stream.py), and
# vLLM's sleep / wake_up / is_sleeping / collective_rpc (async_llm_vllm.py).
class AsyncLLM(AsyncOutputLoop, AsyncVllmMethods):
    """Asynchronous engine client: submit requests from a running event loop and stream their outputs.

    Args:
        model: a local directory, a ``.gguf`` file or a hub id; None means the embedded default model.
        **kwargs: any flat settings field (``max_model_len=2048``, ``max_num_seqs=32``,
            ``disable_frontend_multiprocessing=True``, ...), see :class:`octavo.config.OctavoSettings`.

    Raises:
        octavo.errors.EngineStartError: the engine core could not load the model (the
            message carries the real reason, e.g. a missing file).
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        self._setup(OctavoSettings.from_kwargs(model=model, **kwargs))

    @classmethod
    def from_settings(cls, settings: OctavoSettings, *, while_loading: Callable[[], None] | None = None) -> AsyncLLM:
        """Build from a complete settings object (as the server does).

        Args:
            while_loading: called once the engine core has been started and the tokenizer loaded, while the core
                still loads the model in its own process (``octavo serve`` imports the HTTP server then). If it
                raises, the core is shut down and the exception propagates.
        """
        self = cls.__new__(cls)
        self._setup(settings, while_loading)
        return self

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> AsyncLLM:
        """Build from an ``octavo.AsyncEngineArgs`` (vLLM's idiom)."""
        from octavo.engine_args import settings_from_engine_args

        return cls.from_settings(settings_from_engine_args(engine_args))

    def _setup(self, settings: OctavoSettings, while_loading: Callable[[], None] | None = None) -> None:
        from octavo.core.engine_client import make_engine_core_client
        from octavo.core.loader import load_tokenizer
        from octavo.frontend import FrontEnd

        # the core may then measure whether the reserved CPU serves it better (core/cpu_threads.py)
        adaptive = not settings.server.disable_frontend_multiprocessing and settings.device.num_threads is None
        if not settings.server.disable_frontend_multiprocessing:
            settings = _reserve_frontend_core(settings)
        self.settings = settings
        self._client = None
        t0 = time.perf_counter()
        # Start the core first: it loads the model in its own process while we load the tokenizer here.
        self._client = make_engine_core_client(settings, adaptive_threads=adaptive)
        try:
            self.tokenizer = None if settings.model.skip_tokenizer_init else load_tokenizer(settings.model)
            if while_loading is not None:
                while_loading()
            self.model_info = self._client.wait_ready()
        except BaseException:
            self._client.shutdown()
            raise
        self.load_time_s = time.perf_counter() - t0
        self.frontend = FrontEnd(settings, self.tokenizer, self.model_info)
        self._queues: dict[str, asyncio.Queue] = {}  # internal request id -> its outputs
        self._not_started: set[str] = set()  # internal ids of requests whose first token has not come back yet
        self._output_task: asyncio.Task | None = None
        self.stats = None  # the latest SchedulerStats from the core
        self.stats_observers: list[Callable[[Any], None]] = []  # called with every SchedulerStats
        self.finished_observers: list[Callable[[RequestOutput], None]] = []  # called with each final output
        self.dead_observers: list[Callable[[str], None]] = []  # called once, with the reason, if the core dies
        self._client.on_dead(self._on_dead)
        self._shut = False

    # ------------------------------------------------------------------------------------------ state
    @property
    def is_running(self) -> bool:
        return not self._shut and not self._client.is_dead

    @property
    def errored(self) -> bool:
        """True once the engine core is dead; every request then fails with ``EngineDeadError``."""
        return self._client.is_dead

    @property
    def dead_reason(self) -> str | None:
        return self._client.dead_reason

    @property
    def num_waiting(self) -> int:
        """Requests accepted but still without their first token (what ``max_queue_len`` bounds)."""
        return len(self._not_started)

    @property
    def num_unfinished(self) -> int:
        return len(self._queues)

    def get_tokenizer(self):
        return self.tokenizer

    def get_model_info(self):
        """The loaded model's ``ModelInfo`` (name, vocabulary, max_model_len, KV blocks, dtype, device)."""
        return self.model_info

    async def get_stats(self):
        """Fresh ``SchedulerStats`` straight from the core (running, waiting, KV usage, ...)."""
        self._ensure_output_task()
        return await self._client.call_utility("get_stats")

    async def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block in the core; False (nothing changed) while requests hold blocks."""
        self._ensure_output_task()
        return await self._client.call_utility("reset_prefix_cache")

    def tokenize(self, prompt: Any) -> tuple[str | None, list[int]]:
        """A prompt -> ``(text or None, token ids)``, validated and size-bounded (``InputError`` if not)."""
        return self.frontend.tokenize(prompt)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``, size-bounded like every prompt (``InputError`` if it cannot fit)."""
        return self.frontend.encode(text, add_special_tokens=add_special_tokens)

    def render_chat(self, messages: list[dict], **kwargs: Any) -> tuple[str, list[int]]:
        """Render a conversation with the chat template -> ``(text, token ids)`` (see ``FrontEnd.render_chat``)."""
        return self.frontend.render_chat(messages, **kwargs)

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` if the engine core is gone."""
        from octavo.errors import EngineDeadError

        if self._client.is_dead:
            raise EngineDeadError(self._client.dead_reason)
        if self._shut:
            raise EngineDeadError("the engine was shut down.")

    # ------------------------------------------------------------------------------------------ requests
    async def generate(self, prompt: Any, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0,
                       lora_request: Any = None) -> AsyncIterator[RequestOutput]:
        """Submit one request and iterate over its outputs until it finishes.

        Args:
            prompt: text, a list of token ids, ``{"prompt": ...}`` or ``{"prompt_token_ids": [...]}``.
            sampling_params: how to sample; its ``output_kind`` picks cumulative (default), delta
                (streaming: each output carries only the new text and tokens) or final-only outputs.
            request_id: the caller's id, echoed in every output (default: a random one). It need not be
                unique: the engine runs each request under its own internal id.
            priority: lower runs first under ``scheduling_policy="priority"``.
            lora_request: an ``octavo.lora.request.LoRARequest`` (needs ``enable_lora``), or None.

        Yields:
            ``RequestOutput`` objects; the last has ``finished=True``.

        Raises:
            ValueError: invalid prompt or parameters (raised before anything is queued), or the core
                rejected the request.
            EngineDeadError: the engine core died before or while serving this request.
        """
        stream = self.add_request(prompt, sampling_params, request_id, priority, lora_request=lora_request)
        try:
            async for out in stream:
                yield out
        finally:  # cancelled, closed early, or the caller went away: abort and free its KV blocks now
            stream.close()

    def beam_search(self, prompt: Any, request_id: str, params: Any, lora_request: Any = None):
        """Beam search over one prompt (vLLM's ``EngineClient.beam_search``): an async iterator yielding one
        finished ``RequestOutput`` whose ``outputs`` are the beams, best first (``octavo.llm_beam``)."""
        from octavo.llm_beam import beam_search_async

        return beam_search_async(self, prompt, params, request_id, lora_request)

    async def embed(self, prompt: Any, request_id: str | None = None, priority: int = 0):
        """Embed one input with an embedding model; returns its ``EmbeddingRequestOutput``.

        Mirrors ``LLMEngine.add_embedding_request``: pooling and normalisation are the model's own.

        Raises:
            ValueError: the model is generative (not served for embeddings), or the input is invalid.
            EngineDeadError: the engine core is gone.
        """
        stream = self.add_embedding_request(prompt, request_id, priority)
        try:
            async for out in stream:
                if out.finished:
                    return out
            raise ValueError(f"embedding request {stream.request_id!r} ended without a result")
        finally:
            stream.close()

    def add_embedding_request(self, prompt: Any, request_id: str | None = None, priority: int = 0,
                              pooling_params: Any = None) -> RequestStream:
        """Validate and submit a pooling request now (like :meth:`add_request`); iterate the stream.
        ``pooling_params``: a ``PoolingParams`` with its ``task`` set (None: ``embed``; see octavo.pooling)."""
        self.frontend.check_task(pooling=True)
        return self.add_request(prompt, SamplingParams(max_tokens=1, detokenize=False), request_id, priority,
                                _pooling=True, _pooling_params=pooling_params)

    def add_request(self, prompt: Any, sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0, _pooling: bool = False,
                    lora_request: Any = None, _pooling_params: Any = None) -> RequestStream:
        """Validate and submit a request now; iterate the returned stream for its outputs.

        Unlike :meth:`generate`, bad input raises here, before the caller commits to a response (the
        server uses this to answer 400 before streaming). The caller must ``close()`` the stream if it
        stops iterating before the end (``close`` aborts the request).

        Raises:
            ValueError: invalid prompt or parameters; nothing was queued.
            EngineDeadError: the engine core is gone.
        """
        from octavo.errors import EngineDeadError

        if self._client.is_dead:
            raise EngineDeadError(self._client.dead_reason)
        if self._shut:
            raise EngineDeadError("the engine was shut down.")
        self._ensure_output_task()
        request_id = request_id or uuid.uuid4().hex
        internal_id, core_reqs = self.frontend.submit(request_id, prompt, sampling_params, priority,
                                                      pooling=_pooling, lora_request=lora_request,
                                                      pooling_params=_pooling_params)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[internal_id] = q
        self._not_started.add(internal_id)
        stream = RequestStream(self, request_id, q, internal_id)
        try:
            self._client.add_requests(core_reqs)
        except BaseException:
            stream.close()
            raise
        return stream

    def _forget(self, internal_id: str) -> None:
        self._queues.pop(internal_id, None)
        self._not_started.discard(internal_id)
        self.frontend.reclaim(internal_id)

    def abort(self, request_id: str | list[str]) -> None:
        """Stop requests by the caller's id (every unfinished request submitted with it); frees their KV blocks."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._abort_internal([i for rid in ids for i in self.frontend.internal_ids(rid)])

    def _abort_internal(self, internal_ids: list[str]) -> None:
        for rid in internal_ids:
            self._not_started.discard(rid)
        seq_ids = self.frontend.abort(internal_ids)
        if seq_ids:
            self._client.abort_requests(seq_ids)

    def fail_all(self, error: BaseException) -> int:
        """End every unfinished request with ``error`` (raised from its iterator) and abort it in the core.

        The server's graceful shutdown uses it for requests still running when its timeout is up.
        Returns how many requests it ended.
        """
        ids = list(self._queues)
        for rid in ids:
            self._queues[rid].put_nowait(error)
        self._abort_internal(ids)
        return len(ids)

    # ------------------------------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Stop the output task and the engine core (the core process is joined, or killed if stuck)."""
        if self._shut:
            return
        self._shut = True
        if self._output_task is not None and not self._output_task.done():
            self._output_task.cancel()
        if self._client is not None:
            self._client.shutdown()

    def __del__(self) -> None:  # pragma: no cover - best effort: never leave a core process behind
        try:
            if not getattr(self, "_shut", True):
                self._client.shutdown(timeout_s=1.0)
        except Exception:  # noqa: BLE001
            pass


def _reserve_frontend_core(settings: OctavoSettings) -> OctavoSettings:
    """Leave one CPU to the front end: the core's torch threads default to all CPUs but one.

    The front end (HTTP, tokenization, detokenization) shares the machine with the core process. If the
    core's OpenMP threads claim every CPU, each time the front end (or anything else) runs, one of them
    is preempted and the others spin at the next barrier: on a 2-CPU machine this made decode 5-7x
    slower than one thread (measured, docs/performance.md). vLLM's CPU backend reserves a core likewise.
    An explicit ``num_threads`` is kept.
    """
    if settings.device.num_threads is not None:
        return settings
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    settings = settings.model_copy(deep=True)
    settings.device.num_threads = max(1, cpus - 1)
    return settings
