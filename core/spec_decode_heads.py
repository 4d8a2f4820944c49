"""The worker's half of head speculators (Medusa, MLP speculator): load the head next to the target, and after
each step that samples, draft from the target's hidden states on the device.

For each sampled request the head reads the final hidden state of the position that produced the request's
last emitted token (with verified drafts: the row of the last accepted position) and that token. The drafts
go back in ``RunnerOutput.spec_token_ids``; the engine core verifies them in the next step like any other
proposer's. Asked for only when the core's policy wants drafts this step (``StepBatch.num_spec_proposals``).
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
    head = cls.load_head(config, hidden_size=text_config.hidden_size, vocab_size=worker.vocab_size,
                         device=worker.device, dtype=worker.dtype, target=worker.model)
    if config.num_speculative_tokens > head.max_drafts:
        raise ValueError(f"speculative_config num_speculative_tokens={config.num_speculative_tokens}: the "
                         f"{config.method} head {config.model!r} drafts at most {head.max_drafts}")
    worker.runner.spec_head = HeadRunner(head)
    logger.info("%s head %s loaded for speculative decoding", config.method, config.model)


class HeadRunner:
    def __init__(self, head) -> None:
        self.head = head

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
