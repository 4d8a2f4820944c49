"""The draft model of the ``draft_model`` proposer: a second :class:`Worker` (own weights, own KV cache) in
the engine-core process, driven through the same step contract as the target (``StepBatch`` in,
``RunnerOutput`` out), greedy. The proposer plugin sees only :class:`octavo.speculator.DraftModel`.

Its KV blocks are handed out here (no prefix caching): block 0 is the null block, as in the target's pool.
"""

from __future__ import annotations

import logging

from octavo.core.step import NewRequestData, ScheduledRequestData, StepBatch
from octavo.sampling_params import SamplingParams
from octavo.speculator import DraftModel

logger = logging.getLogger(__name__)

_GREEDY = SamplingParams(temperature=0.0)


def load_draft_model(settings, platform, config, vocab_size: int, max_model_len: int) -> DraftModelHandle:
    """Load ``config.model`` as a draft on ``platform``; its vocabulary must be the target's."""
    from octavo.core.worker import Worker

    model = settings.model.model_copy(update={"model": config.model, "quantization": config.quantization,
                                              "max_model_len": max_model_len, "served_model_name": None,
                                              "tokenizer": None, "task": "generate"})
    scheduler = settings.scheduler.model_copy(update={"speculative_config": None})
    worker = Worker(settings.model_copy(update={"model": model, "scheduler": scheduler}), platform)
    if worker.vocab_size != vocab_size:
        raise ValueError(f"speculative_config model {config.model!r} has vocab_size={worker.vocab_size} but the "
                         f"target has {vocab_size}: a draft model must share the target's tokenizer.")
    logger.info("draft model %s loaded for speculative decoding (%d KV blocks)", config.model, worker.num_blocks)
    return DraftModelHandle(worker)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class DraftModelHandle(DraftModel):
    def __init__(self, worker) -> None:
        self.worker = worker
        self.vocab_size = worker.vocab_size
        self.block_size = worker.block_size
        self.free = list(range(worker.num_blocks - 1, 0, -1))
        self.blocks: dict[str, list[int]] = {}
        self.known: set[str] = set()
        self.pending_forget: list[str] = []

    def run(self, feeds: list[tuple[str, list[int], int]]) -> dict[str, int]:
        new, scheduled = [], []
        for rid, token_ids, start in sorted(feeds, key=lambda f: not (len(f[1]) == 1 and f[2] > 0)):
            blocks = self.blocks.setdefault(rid, [])
            need = _cdiv(start + len(token_ids), self.block_size) - len(blocks)
            if need > len(self.free):
                continue  # the draft cache is full: no drafts for this request this step
            blocks.extend(self.free.pop() for _ in range(max(0, need)))
            if rid not in self.known:
                self.known.add(rid)
                new.append(NewRequestData(rid, [], _GREEDY))
            scheduled.append(ScheduledRequestData(rid, list(token_ids), start, list(blocks), True))
        finished, self.pending_forget = self.pending_forget, []
        if not scheduled:
            if finished:
                self.worker.execute(StepBatch(finished_ids=finished))
            return {}
        num_decode = next((i for i, s in enumerate(scheduled) if not (len(s.token_ids) == 1
                                                                       and s.num_computed_tokens > 0)),
                          len(scheduled))
        out = self.worker.execute(StepBatch(scheduled, new, finished, num_decode,
                                            sum(len(s.token_ids) for s in scheduled)))
        return {rid: tokens[-1] for rid, tokens in out.sampled.items()}

    def forget(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.free.extend(reversed(self.blocks.pop(rid, [])))
            if rid in self.known:
                self.known.discard(rid)
                self.pending_forget.append(rid)
