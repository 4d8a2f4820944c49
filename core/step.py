"""The step contract, re-exported for engine code: the structs live in ``octavo.step`` (public, because
executor plugins move them without importing the core). Import from either; they are the same objects."""

from octavo.step import (
    NewRequestData,
    PromptLogprobs,
    RunnerOutput,
    ScheduledRequestData,
    StepBatch,
    TokenLogprobs,
    WorkerInfo,
)

__all__ = ["NewRequestData", "PromptLogprobs", "RunnerOutput", "ScheduledRequestData", "StepBatch", "TokenLogprobs",
           "WorkerInfo"]
