"""The in-process executor: one worker, in the engine core's process, called directly (no copy)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from octavo.executor import Executor, resolve_target
from octavo.step import RunnerOutput, StepBatch


class UniExecutor(Executor):
    name = "uni"
    supports_async_scheduling = True

    def __init__(self, settings, platform, worker_target: str) -> None:
        super().__init__(settings, platform, worker_target)
        # NOTE: ``driver`` is for in-process tools (benchmarks, GPU tests); the engine core never reads it.
        self.driver = resolve_target(worker_target)(settings, platform=platform)
        self.worker_info = self.driver.info()
        self._step_thread: ThreadPoolExecutor | None = None

    def execute(self, batch: StepBatch) -> RunnerOutput:
        return self.driver.execute(batch)

    def collective_rpc(self, method, args=(), kwargs=None, timeout=None) -> list:
        return [self.driver.rpc(method, list(args), dict(kwargs or {}))]  # a callable works too: same process

    def execute_structured(self, batch: StepBatch, grammar) -> RunnerOutput:
        grammar.start()  # bitmasks fill on a host thread while the forward runs; the runner waits after it
        return self.driver.execute(batch, grammar=grammar)

    def execute_async(self, batch: StepBatch, grammar=None) -> Future:
        """Run the step on one worker thread (steps in order), so the engine core's thread schedules the next
        step meanwhile. A thread, not just the device's own asynchrony: on a CPU the forward itself is the
        step (torch releases the GIL inside its kernels), and a structured step's sampling waits on the
        grammar fill that the core thread releases (docs/async_scheduling.md)."""
        if self._step_thread is None:
            # the initializer must not hold this executor: the pool's thread keeps it for its whole life, so a
            # bound method kept the driver (model, KV cache) and the thread alive after the LLM was dropped
            self._step_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="octavo-step",
                                                   initializer=_bind_device,
                                                   initargs=(getattr(self.driver, "device", None),))
        return self._step_thread.submit(self.driver.execute, batch, grammar)

    def shutdown(self) -> None:
        if self._step_thread is not None:
            self._step_thread.shutdown(wait=True, cancel_futures=True)
            self._step_thread = None
        release = getattr(self.driver, "release", None)  # weights + KV cache back to the device now
        if release is not None:
            release()
        super().shutdown()


def _bind_device(device) -> None:
    """The step thread's initializer: the current CUDA device is per thread."""
    if device is not None and device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
