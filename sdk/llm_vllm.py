"""``LLM`` methods vLLM scripts call beyond generate/chat/embed: ``encode``, ``enqueue`` and
``wait_for_completion``, ``start_profile``/``stop_profile``, and ``beam_search`` (octavo.llm_beam).

A mixin so ``sdk/llm.py`` stays the core of the offline API; every method here works through ``LLM``'s
own engine and helpers.
"""

from __future__ import annotations

import os
from typing import Any


class VllmLLMMethods:
    """vLLM's extra ``LLM`` methods (mixed into :class:`octavo.LLM`)."""

    def encode(self, prompts: Any, pooling_params: Any = None, use_tqdm: bool = True) -> list:
        """Pooled outputs of an embedding model (vLLM's generic pooling call; the same as ``embed``).

        Raises:
            TypeError: ``pooling_params`` given (per-request pooling options are not supported).
        """
        if pooling_params is not None:
            raise TypeError("LLM.encode: pooling_params is not supported; the model's own pooling is used.")
        return self.embed(prompts, use_tqdm=use_tqdm)

    def enqueue(self, prompts: Any, sampling_params: Any = None, priority: list[int] | None = None) -> list[str]:
        """Queue prompts without running them; ``wait_for_completion`` runs everything queued.

        Returns:
            The request ids, in the order of ``prompts``.
        """
        from octavo.prompt_batch import _as_list, _per_prompt
        from octavo.sampling_params import RequestOutputKind

        prompts = _as_list(prompts)
        params = _per_prompt(sampling_params if sampling_params is not None else self.get_default_sampling_params(),
                             len(prompts))
        ids: list[str] = []
        try:
            for i, (prompt, sp) in enumerate(zip(prompts, params)):
                if sp.output_kind != RequestOutputKind.FINAL_ONLY:
                    sp = sp.clone()
                    sp.output_kind = RequestOutputKind.FINAL_ONLY
                rid = str(next(self._counter))
                self.llm_engine.add_request(rid, prompt, sp, priority[i] if priority else 0)
                ids.append(rid)
        except ValueError:
            self.llm_engine.abort_request(ids)
            raise
        self.__dict__.setdefault("_enqueued", []).extend(ids)
        return ids

    def wait_for_completion(self, use_tqdm: bool = True) -> list:
        """Run every queued request to the end; outputs in the order they were enqueued."""
        ids, self._enqueued = self.__dict__.get("_enqueued", []), []
        return self._collect(ids, use_tqdm) if ids else []

    def start_profile(self, profile_dir: str | None = None) -> None:
        """Start the torch profiler; ``stop_profile`` writes a trace (TensorBoard / Perfetto JSON) to
        ``profile_dir``, else ``$OCTAVO_TORCH_PROFILER_DIR`` (or vLLM's ``$VLLM_TORCH_PROFILER_DIR``).

        Raises:
            ValueError: no directory given, or the model runs in other processes (the profiler sees only this one).
        """
        import torch

        directory = profile_dir or os.environ.get("OCTAVO_TORCH_PROFILER_DIR") or \
            os.environ.get("VLLM_TORCH_PROFILER_DIR")
        if not directory:
            raise ValueError("start_profile: give profile_dir= or set OCTAVO_TORCH_PROFILER_DIR.")
        par = self.llm_engine.settings.parallel
        if par.tensor_parallel_size * par.pipeline_parallel_size > 1 or getattr(par, "data_parallel_size", 1) > 1 \
                or par.distributed_executor_backend not in (None, "uni"):
            raise ValueError("start_profile: the model runs in worker processes here; profile with "
                             "distributed_executor_backend='uni' and one device.")
        os.makedirs(directory, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(directory))
        self._profiler.start()

    def stop_profile(self) -> None:
        """Stop the profiler started by ``start_profile`` and write its trace."""
        profiler = self.__dict__.pop("_profiler", None)
        if profiler is None:
            raise RuntimeError("stop_profile: start_profile was not called.")
        profiler.stop()

    def beam_search(self, prompts: Any, params: Any, lora_request: Any = None, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list:
        """Beam search over each prompt (vLLM's signature); see :func:`octavo.llm_beam.beam_search`.

        Returns:
            One ``octavo.beam_search.BeamSearchOutput`` per prompt; ``.sequences`` best first.
        """
        from octavo.llm_beam import beam_search

        return beam_search(self, prompts, params, lora_request=lora_request, use_tqdm=use_tqdm,
                           concurrency_limit=concurrency_limit)

    def sleep(self, level: int = 1) -> dict:
        """Free the memory of an idle engine (needs ``enable_sleep_mode=True``): level 1 frees the KV cache and
        offloads the weights to host memory (on a CPU they stay where they are), level 2 frees both
        (``wake_up`` reloads the checkpoint). Returns the bytes freed per kind (core/sleep_mode.py).

        Raises:
            ValueError: sleep mode is off, requests are unfinished, or the platform captured device graphs.
        """
        return self._core_utility("sleep")(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what ``sleep`` freed: ``tags`` among ``["weights", "kv_cache"]`` (default both)."""
        self._core_utility("wake_up")(tags)

    def is_sleeping(self) -> bool:
        return self._core_utility("is_sleeping")()

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None) -> list:
        """Run ``method`` on every worker and return each rank's result (vLLM's signature): a worker method
        name, ``"module:function"`` (called as ``function(worker, *args, **kwargs)``), or, when the model runs
        in this process, a callable taking the worker first (core/worker_rpc.py)."""
        return self._core_utility("collective_rpc")(method, args=args, kwargs=kwargs, timeout=timeout)

    def _core_utility(self, name: str) -> Any:
        method = getattr(self.llm_engine.core, name, None)
        if method is None:  # e.g. the data-parallel core, which fans requests out to replicas
            raise ValueError(f"{name} is not supported by this engine ({type(self.llm_engine.core).__name__}; "
                             "data_parallel_size > 1 runs several engine cores).")
        return method
