"""The executor interface: how the engine core runs a step on its worker(s), whatever process or host they
live in. Executors are plugins (``octavo_register_executors``; built-ins ``uni``, ``mp``, ``ray``).

The engine core builds one executor per engine with ``cls(settings, platform, worker_target)``.
``worker_target`` is a ``"module:function"`` that, called in the worker's process as
``fn(settings_json, rank=, world_size=, init_method=)``, returns a worker object with ``info()`` (a
:class:`octavo.step.WorkerInfo`) and ``execute(StepBatch) -> RunnerOutput``; it also sets up
``torch.distributed`` for ranks > 1. So an executor moves data and watches processes, and never imports
the engine core.
"""

from __future__ import annotations

import importlib
from typing import Any

from octavo.step import RunnerOutput, StepBatch, WorkerInfo


def resolve_target(target: str) -> Any:
    """``"pkg.module:attr"`` -> the object (how executors find the worker factory in any process)."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class ExecutorError(RuntimeError):
    """A worker died or failed: the engine cannot go on (the server answers 503 and exits non-zero)."""


class Executor:
    """Runs steps on ``world_size`` workers and returns rank 0's output.

    Contract:
      - ``worker_info``: set by ``__init__`` (every rank loaded and sized its cache; ``num_blocks`` is the
        minimum over ranks).
      - ``execute(batch)``: run one step on every rank; return rank 0's :class:`RunnerOutput`. Raises
        :class:`ExecutorError` (never hangs) when a worker died or failed.
      - ``check_health()``: raise :class:`ExecutorError` if a worker is gone (called between steps).
      - ``shutdown()``: stop every worker; safe to call twice.

    Args:
        settings: the engine's ``OctavoSettings``.
        platform: the platform selected in the engine-core process.
        worker_target: ``"module:function"`` building a worker in the calling process (see module docstring).
    """

    name: str = ""
    worker_info: WorkerInfo
    # async scheduling (docs/async_scheduling.md): an executor that implements ``execute_async`` sets this; the
    # engine core refuses ``async_scheduling=True`` with any other executor
    supports_async_scheduling: bool = False

    def __init__(self, settings: Any, platform: Any, worker_target: str) -> None:
        self.settings = settings
        self.platform = platform
        self.worker_target = worker_target

    def execute(self, batch: StepBatch) -> RunnerOutput:
        raise NotImplementedError

    def execute_structured(self, batch: StepBatch, grammar: Any) -> RunnerOutput:
        """A step in which some requests sample under a grammar. ``grammar`` (the engine core's
        ``GrammarStep``) fills their token bitmasks on the host. Default: ``grammar.attach(batch)`` fills
        them now into ``ScheduledRequestData.grammar_bitmask`` (bytes, so they cross any boundary), then
        ``execute``. An in-process executor overrides it to overlap the fill with the forward pass:
        ``grammar.start()`` and hand ``grammar`` to the runner, which calls ``grammar.wait()`` after the
        forward (see plugins/executors/uni.py)."""
        grammar.attach(batch)
        return self.execute(batch)

    def execute_async(self, batch: StepBatch, grammar: Any = None) -> Any:
        """Async scheduling: start the step and return at once a ``concurrent.futures.Future`` of the runner's
        answer, so the engine core schedules the next step meanwhile. Steps run in submission order. The
        answer is the runner's ``DeferredOutput`` (its ``result()`` waits for that step's tokens only) or a
        plain :class:`RunnerOutput`. ``grammar``: a gated ``GrammarStep`` the runner waits on after the
        forward (the engine core releases it once the previous step's tokens advanced the grammars)."""
        raise NotImplementedError(f"the {self.name!r} executor cannot run steps asynchronously")

    def collective_rpc(self, method: Any, args: list | tuple = (), kwargs: dict | None = None,
                       timeout: float | None = None) -> list:
        """Call ``method`` on every rank's worker (``worker.rpc``) and return the results, by rank (vLLM's
        ``collective_rpc``). ``method``: a worker method name or ``"module:function"`` (called with the worker
        first); in-process executors also take a callable. Default: refused, naming the executor."""
        raise NotImplementedError(f"collective_rpc is not supported by the {self.name!r} executor.")

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def merge_worker_infos(infos: list[WorkerInfo]) -> WorkerInfo:
    """Rank 0's info with the smallest ``num_blocks`` over ranks (every rank holds its shard of each block)."""
    info = infos[0]
    for other in infos[1:]:
        if (other.block_size, other.max_model_len, other.vocab_size) != (info.block_size, info.max_model_len,
                                                                           info.vocab_size):
            raise ExecutorError(f"workers disagree on the cache geometry: {info} vs {other}")
    info.num_blocks = min(i.num_blocks for i in infos)
    info.world_size = len(infos)
    return info
