"""Choose and build the executor (a plugin: ``octavo_register_executors``; built-ins in plugins/executors/).

The engine core talks to it through the step contract only (``octavo.executor.Executor``): ``worker_info``
once, then ``execute(StepBatch) -> RunnerOutput``. The worker factory every executor calls, in whichever
process it places a rank, is :data:`WORKER_TARGET`.
"""

from __future__ import annotations

import logging

from octavo.config import OctavoSettings

logger = logging.getLogger(__name__)

WORKER_TARGET = "octavo.core.worker:create_worker"


def executor_name(settings: OctavoSettings) -> str:
    """vLLM's rule: the configured backend, else ``uni`` for one rank and ``mp`` for several."""
    par = settings.parallel
    world = par.tensor_parallel_size * par.pipeline_parallel_size
    name = par.distributed_executor_backend or ("uni" if world == 1 else "mp")
    if name == "uni" and world > 1:
        raise ValueError(f"distributed_executor_backend='uni' runs one worker, but tensor_parallel_size x "
                         f"pipeline_parallel_size = {world}; use 'mp' (one host) or 'ray'.")
    return name


def make_executor(settings: OctavoSettings, platform):
    from octavo.core.plugin_manager import get_plugin_manager

    name = executor_name(settings)
    pm = get_plugin_manager()
    if name not in pm.names("executors"):
        raise ValueError(f"distributed_executor_backend={name!r} is not a registered executor (registered: "
                         f"{', '.join(pm.names('executors'))}); see `octavo plugins`.")
    cls = pm.resolve("executors", name)
    return cls(settings, platform, WORKER_TARGET)
