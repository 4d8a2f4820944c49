"""The step contract without a model: what the scheduler decides reaches the runner's own per-request state
exactly, through msgpack (as the ``mp``/``ray`` executors send it), across chunked prefill, preemption
(recompute), finishing, aborting and an id reused at once."""

from __future__ import annotations

import types

import msgspec

from octavo.config import OctavoSettings
from octavo.core.kv_cache.manager import KVCacheManager
from octavo.core.messages import EngineCoreRequest
from octavo.core.model_runner import ModelRunner
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.core.step_builder import StepBuilder
from octavo.sampling_params import SamplingParams
from octavo.step import RunnerOutput, StepBatch, TokenLogprobs, WorkerInfo

ENC, DEC = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(StepBatch)


def make(num_blocks=64, block_size=4, **kw):
    settings = OctavoSettings.from_kwargs(block_size=block_size, enable_prefix_caching=False, **kw)
    return Scheduler(settings, KVCacheManager(num_blocks, block_size, False), 256)


def req(rid, n, arrival=0.0, max_tokens=8):
    return Request(EngineCoreRequest(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), arrival,
                                     eos_token_id=None), max_tokens)


def runner():
    """The runner's state handling alone (``ModelRunner.update_states`` needs no model)."""
    return types.SimpleNamespace(requests={}, generators={})


def step(s: Scheduler, builder: StepBuilder, r) -> StepBatch:
    out = s.schedule()
    batch = DEC.decode(ENC.encode(builder.build(out)))  # what a worker process receives
    ModelRunner.update_states(r, batch)
    sampled = {}
    for x in out.scheduled:
        state = r.requests[x.req.request_id]
        if x.samples:  # the runner's copy of the sequence is the scheduler's, token for token
            assert state.all_token_ids == x.req.all_token_ids
            sampled[x.req.request_id] = 100 + x.req.num_output_tokens
    for req_, _ in s.update(out, sampled):
        if req_.is_finished:
            builder.forget([req_.request_id])
    return batch


def test_runner_state_follows_chunks_preemption_and_finish():
    s, b, r = make(num_blocks=6, max_num_batched_tokens=6, kv_admission="greedy"), StepBuilder(), runner()
    s.add_request(req("a", 8))
    s.add_request(req("b", 8, arrival=1))
    news, finished, preempted = [], [], 0
    for _ in range(60):
        before = s.stats.num_preemptions
        batch = step(s, b, r)
        preempted += s.stats.num_preemptions - before
        news += [n.request_id for n in batch.new_requests]
        finished += batch.finished_ids
        if not s.has_unfinished_requests():
            break
    assert preempted >= 1  # the cache is too small for both: the victim recomputed
    assert news == ["a", "b"]  # described once each, even across the preemption
    step_batch = b.flush()
    ModelRunner.update_states(r, step_batch)
    assert sorted(finished + step_batch.finished_ids) == ["a", "b"] and r.requests == {}


def test_abort_then_reuse_of_the_same_id_in_one_batch():
    s, b, r = make(), StepBuilder(), runner()
    s.add_request(req("x", 5))
    step(s, b, r)
    s.abort(["x"])
    b.forget(["x"])
    s.add_request(req("x", 3, arrival=1))
    batch = step(s, b, r)
    assert batch.finished_ids == ["x"] and [n.request_id for n in batch.new_requests] == ["x"]
    assert r.requests["x"].prompt_token_ids == [1, 2, 3]  # freed first, then described anew


def test_outputs_and_worker_info_round_trip():
    out = RunnerOutput(sampled={"a": [5, 6]}, logprobs={"a": [TokenLogprobs([5], [-0.1], [1])] * 2})
    assert msgspec.msgpack.decode(ENC.encode(out), type=RunnerOutput) == out
    info = WorkerInfo(num_blocks=3, block_size=16, max_model_len=64, vocab_size=10, architecture="X",
                      model_source="m", dtype="float32", device="cpu", eos_token_ids=[2])
    assert msgspec.msgpack.decode(ENC.encode(info), type=WorkerInfo) == info
