"""build_step_inputs reuses a request's converted block-table row while its block ids are unchanged
(core/input_batch.py). The rows must still follow every edit the KV manager makes: appends, in-place edits of
its live list (sliding-window releases, rejected drafts' tail, a preemption's new blocks), shrinks; with the live
list handed over (synchronous in-process path) or a copy of it (async scheduling, other processes)."""

from __future__ import annotations

import random

import numpy as np
import torch

from octavo.core.input_batch import CachedRequestState, build_step_inputs
from octavo.sampling_params import SamplingParams
from octavo.step import NewRequestData, ScheduledRequestData, StepBatch

BS = 16


def _reference(lists: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(lists), max(len(ids) for ids in lists)), dtype=np.int32)
    for i, ids in enumerate(lists):
        out[i, :len(ids)] = ids
    return out


def _edit(rng: random.Random, ids: list[int]) -> None:
    r = rng.random()
    if r < 0.10:
        ids.append(rng.randrange(1, 5000))  # a new block
    elif r < 0.13 and len(ids) > 2:
        ids[:2] = [0, 0]  # sliding window: released blocks become the null block, in place
    elif r < 0.15 and len(ids) > 2:
        del ids[rng.randint(1, len(ids) - 1):]  # rejected drafts' tail freed
    elif r < 0.16:
        ids[:] = [rng.randrange(1, 5000) for _ in range(rng.randint(1, 30))]  # preempted, then new blocks
    elif r < 0.17 and ids:
        ids[rng.randrange(len(ids))] = rng.randrange(1, 5000)  # one entry replaced, same length


def test_block_rows_follow_every_edit():
    rng = random.Random(3)
    live = {f"r{i}": [rng.randrange(1, 5000) for _ in range(rng.randint(1, 30))] for i in range(24)}
    params = SamplingParams(max_tokens=64, temperature=0.0)
    states = {rid: CachedRequestState(NewRequestData(rid, [1] * 8, params)) for rid in live}
    for step in range(300):
        for ids in live.values():
            _edit(rng, ids)
        rids = rng.sample(sorted(live), rng.randint(1, len(live)))
        copies = step % 3 != 0
        scheduled = [ScheduledRequestData(rid, [5], len(live[rid]) * BS - 1, list(live[rid]) if copies else live[rid],
                                          True) for rid in rids]
        inputs = build_step_inputs(StepBatch(scheduled, [], [], len(scheduled), len(scheduled)), states, BS,
                                   torch.device("cpu"))
        expect = _reference([live[rid] for rid in rids])
        got = inputs.layout.block_tables
        assert got.dtype == torch.int32 and torch.equal(got, torch.from_numpy(expect)), step
        slots = expect[np.arange(len(rids)), (np.array([len(live[r]) for r in rids]) * BS - 1) // BS] * BS + (BS - 1)
        assert torch.equal(inputs.layout.slot_mapping, torch.from_numpy(slots.astype(np.int64))), step
