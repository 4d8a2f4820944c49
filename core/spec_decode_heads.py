"""The worker's half of head speculators (Medusa, MLP speculator, EAGLE, EAGLE-3): load the head next to the
target, and after each step, draft from the target's hidden states on the device.

For each sampled request the head reads the final hidden state of the position that produced the request's
last emitted token (with verified drafts: the row of the last accepted position) and that token. The drafts
go back in ``RunnerOutput.spec_token_ids``; the engine core verifies them in the next step like any other
proposer's. Asked for only when the core's policy wants drafts this step (``StepBatch.num_spec_proposals``).
A stateful head (EAGLE) is also fed the verified positions of every such step, prefill chunks included.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def attach_spec_head(worker) -> None:
    """Give ``worker.runner`` a :class:`HeadRunner` when the configured method is a head speculator."""
    cfg = worker.settings.scheduler.speculative_config
    if not cfg:
        return
    from octavo.core.plugin_manager import get_plugin_manager
    from octavo.speculator import SpeculativeConfig

    config = SpeculativeConfig.model_validate(cfg)
    cls = get_plugin_manager().resolve("speculators", config.method)
    if not getattr(cls, "runs_on_worker", False):
        return
    cls.check(config, worker.settings, worker.platform, worker.vocab_size)  # its own messages, before loading
    text_config = worker.resolved.hf_config.get_text_config()
    sched = worker.settings.scheduler
    k = config.num_speculative_tokens
    max_tokens = max(sched.max_num_batched_tokens or 0, 8192, worker.max_model_len) + sched.max_num_seqs * (k + 1)
    head = cls.load_head(config, hidden_size=text_config.hidden_size, vocab_size=worker.vocab_size,
                         device=worker.device, dtype=worker.dtype, target=worker.model, max_num_tokens=max_tokens)
    if k > head.max_drafts:
        raise ValueError(f"speculative_config num_speculative_tokens={k}: the {config.method} head "
                         f"{config.model!r} drafts at most {head.max_drafts}")
    worker.runner.spec_head = HeadRunner(head, stateful=bool(getattr(cls, "stateful", False)))
    logger.info("%s head %s loaded for speculative decoding", config.method, config.model)


class HeadRunner:
    """Calls the head after each step. Stateless heads (Medusa, MLP speculator) only when drafts are wanted;
    stateful ones (EAGLE) every step, to feed them what the target verified."""

    def __init__(self, head, stateful: bool = False) -> None:
        self.head = head
        self.stateful = stateful

    def begin(self, batch):
        """At the start of a step: forget finished requests (and restart re-described ones)."""
        if self.stateful:
            self.head.reset(list(batch.finished_ids) + [n.request_id for n in batch.new_requests])
        return batch, batch.num_spec_proposals

    def after_step(self, step, hidden, inputs, sampled: dict[str, list[int]], reqs, device) -> dict[str, list[int]]:
        batch, num_drafts = step
        if not num_drafts:  # policy off (large batch): no head work at all; an EAGLE head's K/V gets a gap,
            return {}       # masked out later (lower acceptance, never a different output)
        if not self.stateful:
            return self.propose(hidden, inputs, sampled, num_drafts, device) if sampled else {}
        feeds, qsl = [], inputs.layout.query_start_loc.tolist()
        for i, s in enumerate(batch.scheduled):
            state = reqs[s.request_id]
            if state.pooling:
                continue
            emitted = sampled.get(s.request_id)
            n_valid = len(s.token_ids) + (len(emitted) - 1 if emitted else 0)  # accepted drafts count
            start = s.num_computed_tokens
            seq = state.all_token_ids  # verified tokens (accepted drafts already written back)
            nxt = seq[start + 1:start + n_valid] + ([emitted[-1]] if emitted else seq[start + n_valid:start + n_valid + 1])
            if len(nxt) != n_valid:
                continue  # nothing known after this chunk (cannot happen for a prefill chunk): skip feeding
            rows = torch.arange(qsl[i], qsl[i] + n_valid)
            feeds.append((s.request_id, start, torch.tensor(nxt, dtype=torch.int64).to(device, non_blocking=True),
                          rows.to(device, non_blocking=True), bool(emitted)))
        drafts = self.head.feed(hidden, feeds, num_drafts)
        if not drafts:
            return {}
        ids = list(drafts)
        host = torch.stack([drafts[r] for r in ids]).cpu().tolist()
        return dict(zip(ids, host))

    def propose(self, hidden: torch.Tensor, inputs, sampled: dict[str, list[int]], num_drafts: int,
                device) -> dict[str, list[int]]:
        """Drafts per sampled request (one device->host copy). ``hidden`` is the model's output for the
        step's flat tokens; ``inputs.logits_indices`` maps each sampled row to its flat token."""
        drafts = inputs.spec_token_ids or [[]] * len(inputs.sample_req_ids)
        rows, last, ids, r0 = [], [], [], 0
        for rid, ds in zip(inputs.sample_req_ids, drafts):
            tokens = sampled.get(rid)
            if tokens:
                rows.append(r0 + len(tokens) - 1)  # the row whose logits produced the last emitted token
                last.append(tokens[-1])
                ids.append(rid)
            r0 += len(ds) + 1
        if not ids:
            return {}
        flat = inputs.logits_indices[torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)]
        last_t = torch.tensor(last, dtype=torch.int64).to(device, non_blocking=True)
        out = self.head.propose(hidden.index_select(0, flat), last_t, num_drafts).cpu().tolist()
        return dict(zip(ids, out))
