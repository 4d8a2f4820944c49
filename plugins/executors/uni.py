"""The in-process executor: one worker, in the engine core's process, called directly (no copy)."""

from __future__ import annotations

from octavo.executor import Executor, resolve_target
from octavo.step import RunnerOutput, StepBatch


class UniExecutor(Executor):
    name = "uni"

    def __init__(self, settings, platform, worker_target: str) -> None:
        super().__init__(settings, platform, worker_target)
        # NOTE: ``driver`` is for in-process tools (benchmarks, GPU tests); the engine core never reads it.
        self.driver = resolve_target(worker_target)(settings, platform=platform)
        self.worker_info = self.driver.info()

    def execute(self, batch: StepBatch) -> RunnerOutput:
        return self.driver.execute(batch)

    def collective_rpc(self, method, args=(), kwargs=None, timeout=None) -> list:
        return [self.driver.rpc(method, list(args), dict(kwargs or {}))]  # a callable works too: same process

    def execute_structured(self, batch: StepBatch, grammar) -> RunnerOutput:
        grammar.start()  # bitmasks fill on a host thread while the forward runs; the runner waits after it
        return self.driver.execute(batch, grammar=grammar)
