"""Executors run a step on the worker(s). Only the in-process executor (one device) exists so far.

``mp`` (one process per device with torch.distributed for tensor/pipeline parallelism) and ``ray`` are
configuration values that fail at start with a clear message until they land.
"""

from __future__ import annotations

from octavo.config import OctavoSettings
from octavo.core.worker import Worker


class UniExecutor:
    """Runs the single worker in the calling process."""

    def __init__(self, settings: OctavoSettings, platform) -> None:
        self.driver = Worker(settings, platform)

    def execute(self, sched_out):
        return self.driver.execute(sched_out)

    def release(self, request_ids: list[str]) -> None:
        self.driver.runner.release(request_ids)

    def shutdown(self) -> None:
        pass


def make_executor(settings: OctavoSettings, platform) -> UniExecutor:
    par = settings.parallel
    if par.tensor_parallel_size * par.pipeline_parallel_size > 1 or par.distributed_executor_backend in ("mp", "ray"):
        raise ValueError(
            "tensor_parallel_size / pipeline_parallel_size > 1 and the 'mp'/'ray' executors are not implemented "
            "yet; run with --tensor-parallel-size 1 --pipeline-parallel-size 1.")
    return UniExecutor(settings, platform)
