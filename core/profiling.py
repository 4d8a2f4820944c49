"""The profiling pass that sizes the KV cache on devices whose free memory can be measured.

It runs one forward pass at the step's full token budget (with a temporary, minimal KV cache) plus the
logits of ``max_num_seqs`` rows, so the allocator reserves the activation peak before the cache is sized.
"""

from __future__ import annotations

import torch

from octavo.core.input_batch import CachedRequestState, build_step_inputs
from octavo.sampling_params import SamplingParams
from octavo.step import NewRequestData, ScheduledRequestData, StepBatch


@torch.inference_mode()
def profile_run(worker) -> None:
    settings = worker.settings
    bs = worker.block_size
    num_tokens = min(settings.scheduler.max_num_batched_tokens or 2048, worker.max_model_len)
    num_blocks = -(-num_tokens // bs) + 1
    layers = worker.attn_layers
    temp = []
    for layer in layers:
        shape = worker.attn_backend_cls.kv_cache_shape(num_blocks, bs, layer.num_kv_heads, layer.head_size)
        kv = torch.zeros(shape, dtype=worker._kv_dtype(), device=worker.device)
        impl = worker.attn_backend_cls(num_heads=layer.num_heads, head_size=layer.head_size,
                                       num_kv_heads=layer.num_kv_heads, scale=layer.scale,
                                       sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap)
        layer.bind(impl, kv)
        temp.append(kv)
    new = NewRequestData("profile", [0] * num_tokens, SamplingParams(max_tokens=1))
    batch = StepBatch([ScheduledRequestData("profile", new.prompt_token_ids, 0, list(range(1, num_blocks)), True)],
                      [new], total_num_tokens=num_tokens)
    from octavo.core.model_runner import ModelRunner

    runner = ModelRunner(worker.model, worker.attn_backend_cls, worker.device, bs, worker.vocab_size)
    inputs = build_step_inputs(batch, {"profile": CachedRequestState(new)}, bs, worker.device)
    hidden = runner.forward(inputs)
    if hasattr(worker.model, "compute_logits"):
        rows = min(settings.scheduler.max_num_seqs, num_tokens)
        worker.model.compute_logits(hidden[:rows]).softmax(-1)
    worker.platform.synchronize()
    del hidden, temp
    for layer in layers:
        layer.bind(None, None)
