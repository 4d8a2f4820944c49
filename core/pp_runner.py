"""Pipeline parallelism on the worker side: process groups, what a stage refuses, and the stage's runner.

Rank layout (vLLM's): global rank = stage * tensor_parallel_size + tp_rank. Each stage is one tensor-parallel
group; stage s's tp rank r sends its ``IntermediateTensors`` (hidden states and residual, ``[2, n, hidden]``
in one message) to the same tp rank of stage s + 1 with ``torch.distributed`` point-to-point send/recv (gloo
on CPU, NCCL on GPU). The receiver knows the shape from the step itself (every rank gets the same
``StepBatch`` and builds the same flat inputs), so no metadata travels.

Every stage updates its own per-request state from each step's ``StepBatch`` (the next batch carries the
sampled tokens), so only the last stage samples; its tp rank 0 returns the ``RunnerOutput``. With the ``mp``
executor the engine core keeps up to P micro-batches in flight (core/pp_schedule.py); each stage runs them in the
order sent, so stages overlap on different micro-batches.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from octavo.core.input_batch import StepInputs, build_step_inputs
from octavo.core.model_runner import ModelRunner
from octavo.model import ForwardContext
from octavo.nn.parallel import set_tensor_parallel_group
from octavo.nn.pipeline import INTERMEDIATE_KEY, IntermediateTensors, set_pipeline_stage
from octavo.step import RunnerOutput, StepBatch

logger = logging.getLogger(__name__)


def join_pipeline(rank: int, tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """Create every stage's tensor-parallel group (all ranks must create all groups, in the same order),
    use this rank's for ``octavo.nn``'s collectives, and set this process's stage."""
    tp = tensor_parallel_size
    groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in range(pipeline_parallel_size)]
    set_tensor_parallel_group(groups[rank // tp])
    set_pipeline_stage(rank // tp, pipeline_parallel_size)


def check_pipeline_settings(settings, model_cls, platform) -> None:
    """Refuse, naming the setting, what pipeline stages do not run (yet) instead of running it wrong."""
    par = settings.parallel
    if par.pipeline_parallel_size == 1:
        return
    arch = getattr(model_cls, "__name__", str(model_cls))
    if not vars(model_cls).get("supports_pipeline_parallel"):
        raise ValueError(f"pipeline_parallel_size={par.pipeline_parallel_size}: {arch} cannot be split into "
                         "pipeline stages (supported: Llama/Mistral/Qwen2, Qwen3, Qwen3-MoE, Mixtral); use "
                         "tensor_parallel_size instead.")
    refused = {"speculative_config": settings.scheduler.speculative_config,
               "enable_lora": settings.lora.enable_lora,
               f"task={settings.model.task!r}": settings.model.task not in ("auto", "generate"),
               "runner='pooling'": getattr(settings.model, "runner", "auto") == "pooling"}
    for name, value in refused.items():
        if value:
            raise ValueError(f"{name} is not supported with pipeline_parallel_size > 1 (only plain generation "
                             "runs across stages); drop one of them.")
    cache = settings.cache
    if platform.capabilities().memory_profiling and not (cache.kv_cache_memory_bytes
                                                         or cache.num_gpu_blocks_override):
        raise ValueError("pipeline_parallel_size > 1 on a device platform needs an explicit KV cache size "
                         "(--kv-cache-memory-bytes or --num-gpu-blocks-override): the memory-profiling pass "
                         "runs a whole model, not one stage.")


class StageLink:
    """Point-to-point links to the neighbouring stages (same tp rank one stage up / down)."""

    def __init__(self, rank: int, tp_size: int, stage: int, num_stages: int, hidden_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.prev = rank - tp_size if stage > 0 else None
        self.next = rank + tp_size if stage < num_stages - 1 else None
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device

    def recv(self, num_tokens: int) -> IntermediateTensors:
        buf = torch.empty((2, num_tokens, self.hidden_size), dtype=self.dtype, device=self.device)
        dist.recv(buf, src=self.prev)
        return IntermediateTensors(buf[0], buf[1])

    def send(self, out: IntermediateTensors) -> None:
        if not isinstance(out, IntermediateTensors):
            raise TypeError(f"pipeline stage before the last: the model returned {type(out).__name__}, "
                            "not IntermediateTensors (does its forward follow octavo.nn.pipeline?)")
        dist.send(torch.stack([out.hidden_states, out.residual]), dst=self.next)


class PipelineStageRunner(ModelRunner):
    """The model runner of one pipeline stage: receives its input from the previous stage, sends its output
    to the next; only the last stage samples (it is the plain runner there, plus the receive)."""

    def __init__(self, *args, link: StageLink, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.is_pooling:  # a pooling-only architecture under task auto
            raise ValueError("pooling models are not supported with pipeline_parallel_size > 1")
        self.link = link

    @property
    def is_last(self) -> bool:
        return self.link.next is None

    def forward(self, inputs: StepInputs, mm_embeds=None):
        if mm_embeds is not None:
            raise ValueError("multimodal inputs are not supported with pipeline_parallel_size > 1")
        metadata = self.attn_backend_cls.build_metadata(inputs.layout, self.device)
        ctx = ForwardContext(attn_metadata=metadata, query_start_loc=inputs.query_start_loc)
        if self.link.prev is not None:
            ctx.extra[INTERMEDIATE_KEY] = self.link.recv(inputs.input_ids.shape[0])
        out = self.model(inputs.input_ids, inputs.positions, ctx)
        if self.link.next is not None:
            self.link.send(out)
        return out

    @torch.inference_mode()
    def execute(self, batch: StepBatch, grammar=None) -> RunnerOutput:
        if self.is_last:  # grammar bitmasks (structured outputs) apply where the logits are
            return super().execute(batch, grammar) if grammar is not None else super().execute(batch)
        self.update_states(batch)  # the same per-request state as every stage, from the same batch
        if not batch.is_empty:
            self.forward(build_step_inputs(batch, self.requests, self.block_size, self.device))
        return RunnerOutput(sampled={}, logprobs={}, prompt_logprobs={}, pooled={})
