"""The profiling pass that sizes the KV cache on devices whose free memory can be measured.

It runs one forward pass at the step's full token budget (with a temporary, minimal KV cache; several requests
where ``max_model_len`` is shorter than the budget, as a chunked-prefill step packs them) plus the
logits of ``max_num_seqs`` rows, so the allocator reserves the activation peak before the cache is sized
(:func:`kv_budget_from_profile` reads the device around it).
"""

from __future__ import annotations

import torch

from octavo.core.input_batch import CachedRequestState, build_step_inputs
from octavo.sampling_params import SamplingParams
from octavo.step import NewRequestData, ScheduledRequestData, StepBatch


@torch.inference_mode()
def profile_run(worker) -> int:
    """Returns the bytes the allocator reserved for the temporary KV cache (0 where the platform cannot say):
    freed at the end, they are no activation memory (:func:`kv_budget_from_profile`)."""
    settings = worker.settings
    bs = worker.block_size
    # a step packs several prompts up to the token budget (chunked prefill), so the budget is the activation
    # peak even where one request is shorter (the 8B e2e: 8192-token steps, max_model_len 4096), unless
    # max_num_seqs requests of max_model_len hold fewer tokens; one request per max_model_len tokens
    per_req = min(settings.scheduler.max_num_batched_tokens or 2048, worker.max_model_len)
    num_tokens = min(settings.scheduler.max_num_batched_tokens or 2048,
                     settings.scheduler.max_num_seqs * worker.max_model_len)
    lengths = [per_req] * (num_tokens // per_req) + ([num_tokens % per_req] if num_tokens % per_req else [])
    per_blocks = [-(-n // bs) for n in lengths]
    num_blocks = sum(per_blocks) + 1  # block 0 pads the block tables
    layers = worker.attn_layers
    plat, index = worker.platform, worker.device.index or 0
    reserved = getattr(plat, "memory_reserved", None)
    reserved_before = reserved(index) if reserved else 0
    temp = []
    for layer in layers:
        shape = worker.attn_backend_cls.kv_cache_shape(num_blocks, bs, layer.num_kv_heads, layer.head_size)
        kv = torch.zeros(shape, dtype=worker._kv_dtype(), device=worker.device)
        impl = worker.attn_backend_cls(num_heads=layer.num_heads, head_size=layer.head_size,
                                       num_kv_heads=layer.num_kv_heads, scale=layer.scale,
                                       sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap)
        layer.bind(impl, kv)
        temp.append(kv)
    temp_reserved = max(0, reserved(index) - reserved_before) if reserved else 0
    news, scheduled, first = [], [], 1
    for i, (n, nb) in enumerate(zip(lengths, per_blocks, strict=True)):
        new = NewRequestData(f"profile{i}", [0] * n, SamplingParams(max_tokens=1))
        news.append(new)
        scheduled.append(ScheduledRequestData(new.request_id, new.prompt_token_ids, 0,
                                              list(range(first, first + nb)), True))
        first += nb
    batch = StepBatch(scheduled, news, total_num_tokens=num_tokens)
    from octavo.core.model_runner import ModelRunner

    runner = ModelRunner(worker.model, worker.attn_backend_cls, worker.device, bs, worker.vocab_size)
    inputs = build_step_inputs(batch, {n.request_id: CachedRequestState(n) for n in news}, bs, worker.device)
    hidden = runner.forward(inputs)
    if hasattr(worker.model, "compute_logits"):
        rows = min(settings.scheduler.max_num_seqs, num_tokens)
        worker.model.compute_logits(hidden[:rows]).softmax(-1)
    worker.platform.synchronize()
    del hidden, temp
    for layer in layers:
        layer.bind(None, None)
    return temp_reserved


def kv_budget_from_profile(worker) -> tuple[int, dict]:
    """Bytes the KV cache may take of ``gpu_memory_utilization`` x the device, and the readings behind them.

    The allocator's cached-but-free blocks are handed back to the device before the profile run
    (``platform.empty_cache`` where it has one): after loading they are the loader's freed temporaries (the
    dummy loader's float32 draws, as large as the largest weight; online quantization's float32 copies),
    which the engine never needs again. Counted as used, as the reading did before session 9, they cost
    the KV cache that many bytes (``cached_free_released_GiB`` below says how many). What the profile run then reserves (its activation peak, with
    the allocator's rounding) stays counted, as does every byte outside the allocator (the device context,
    loaded kernels), except the profile's temporary KV cache (``profile_temp_kv_released_GiB``). Memory taken
    later (CUDA graph pools, the sampler's rows) comes from the ``1 - gpu_memory_utilization`` left over, as
    before.
    """
    plat = worker.platform
    index = worker.device.index or 0  # this rank's device, not device 0
    total = plat.memory_total(index)
    gib = 2 ** 30
    used_loaded = total - plat.memory_free(index)
    if hasattr(plat, "empty_cache"):
        plat.empty_cache()
    used_before = total - plat.memory_free(index)
    if hasattr(plat, "reset_peak_memory_stats"):
        plat.reset_peak_memory_stats(index)
    temp_kv = profile_run(worker) or 0
    used = total - plat.memory_free(index)
    reserved = plat.memory_reserved(index) if hasattr(plat, "memory_reserved") else None  # (before the release)
    # The profile's temporary KV cache (~1 GiB for the 8B shape's 8k-token step) was freed into the allocator's
    # cache at its end; counted, it cost the real KV cache as many bytes (session 11's 8B H100 run: 26,971 blocks
    # where 0.9 of the card gives ~27,480). Its segments go back to the device and leave the reading; the
    # activations' segments go back with them (empty_cache frees every unused one) but stay counted, so the
    # activation peak is still reserved out of the budget. Only what the device got back, at most the temporary
    # cache's bytes, leaves the reading; without empty_cache all stays counted, as before.
    released = 0
    if temp_kv and hasattr(plat, "empty_cache"):
        plat.empty_cache()
        released = max(0, min(temp_kv, used - (total - plat.memory_free(index))))
    budget = max(0, int(total * worker.settings.cache.gpu_memory_utilization) - (used - released))
    info = {"total_GiB": total / gib, "used_after_load_GiB": used_loaded / gib,
            "cached_free_released_GiB": (used_loaded - used_before) / gib,
            "used_before_profile_GiB": used_before / gib, "used_after_profile_GiB": used / gib,
            "profile_added_GiB": (used - used_before) / gib, "profile_temp_kv_released_GiB": released / gib,
            "kv_budget_GiB": budget / gib}
    if hasattr(plat, "peak_memory_allocated"):  # torch's own view: peak tensors vs the allocator's reservation
        info["torch_peak_allocated_GiB"] = plat.peak_memory_allocated(index) / gib
    if reserved is not None:
        info["torch_reserved_GiB"] = reserved / gib
        info["outside_torch_GiB"] = (used - reserved) / gib  # device context, loaded kernels, library handles
    return budget, info
