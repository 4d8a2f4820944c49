"""Speculative decoding on the runner's side: a row per draft position for verification, verification on the
device, and writing each request's emitted tokens into the runner output.

Kept apart from ``core/spec_decode.py`` (the engine core's proposer glue, which loads a draft Worker) so the
runner never imports the worker it lives in.
"""

from __future__ import annotations


class DraftView:
    """A request seen after its first ``j`` drafts were accepted (what ``build_sampling_batch`` reads)."""

    __slots__ = ("request_id", "sampling_params", "eos_token_id", "output_token_ids", "all_token_ids")

    def __init__(self, req, drafts: list[int]) -> None:
        self.request_id = req.request_id
        self.sampling_params = req.sampling_params
        self.eos_token_id = req.eos_token_id
        self.output_token_ids = req.output_token_ids + drafts if drafts else req.output_token_ids
        self.all_token_ids = req.all_token_ids + drafts if drafts else req.all_token_ids

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


def expand_for_verification(reqs: list, drafts: list[list[int]]) -> list:
    """``k + 1`` sampling rows per request with ``k`` drafts (the request itself when ``k == 0``)."""
    rows = []
    for req, ds in zip(reqs, drafts):
        if not ds:
            rows.append(req)
            continue
        rows.extend(DraftView(req, ds[:j]) for j in range(len(ds) + 1))
    return rows


def verify_on_device(logits, sample_reqs: list, drafts: list[list[int]], vocab_size: int, device,
                     generators: dict) -> dict:
    """The runner's sampling step when some request carries drafts: ``logits`` has ``k + 1`` rows per
    request (``k = len(drafts[i])``). Returns device tensors to copy to the host: each row's token and
    accept flag, and (when asked) logprobs of the raw distribution for each row's token."""
    from octavo.core.input_batch import build_sampling_batch
    from octavo.core.rejection_sampler import verify
    from octavo.core.sampler import compute_logprobs, gather_logprobs

    rows = expand_for_verification(sample_reqs, drafts)
    b = build_sampling_batch(rows, vocab_size, device, generators)
    raw = compute_logprobs(logits) if b.max_num_logprobs >= 0 else None
    out = verify(logits, b, [len(d) for d in drafts], drafts)
    pending = {"row_tokens": out.row_tokens, "accepted": out.accepted}
    if raw is not None:
        pending["lp_ids"], pending["lp"], pending["ranks"] = gather_logprobs(raw, out.row_tokens, b.max_num_logprobs)
    return pending


def emitted_tokens(host: dict, drafts: list[list[int]]) -> list[tuple[int, list[int]]]:
    """Per request (in sample order): (its first row, the tokens it emits this step)."""
    from octavo.core.rejection_sampler import split_emitted

    return split_emitted(host["row_tokens"].tolist(), host["accepted"].tolist(), [len(d) for d in drafts])


def fill_runner_output(result, host: dict, sample_req_ids: list[str], drafts: list[list[int]], reqs: dict,
                       row_logprobs) -> None:
    """Put each request's emitted tokens (and their logprobs, one entry per token) into ``result``, and
    write the accepted drafts into the runner's copy of each sequence: their K/V are in the cache and the
    scheduler's next step starts after them (it sends only the one new token)."""
    for rid, (r0, tokens) in zip(sample_req_ids, emitted_tokens(host, drafts)):
        result.sampled[rid] = tokens
        reqs[rid].all_token_ids.extend(tokens[:-1])
        want = reqs[rid].sampling_params.logprobs
        if want is not None:
            result.logprobs[rid] = [row_logprobs(host["lp_ids"][r0 + j], host["lp"][r0 + j],
                                                 int(host["ranks"][r0 + j]), want) for j in range(len(tokens))]


def first_logits_rows(drafts: list[list[int]], request_indices: list[int]) -> list[int]:
    """The logits row of each sampled request's first position (requests with drafts own k + 1 rows)."""
    if not drafts:
        return request_indices
    starts, r = [], 0
    for ds in drafts:
        starts.append(r)
        r += len(ds) + 1
    return [starts[i] for i in request_indices]


def verify_graph_shapes(settings) -> tuple:
    """``(requests, tokens per request)`` of the verify steps a platform may capture as graphs: sizes 1, 2, 4,
    8 below the batch-size policy's limit (8 when it is off) x 2 .. k + 1 tokens. Empty without speculation."""
    cfg = settings.scheduler.speculative_config
    if not cfg:
        return ()
    k = int(cfg.get("num_speculative_tokens", 0) if isinstance(cfg, dict) else cfg.num_speculative_tokens)
    limit = (cfg.get("disable_by_batch_size", 8) if isinstance(cfg, dict) else cfg.disable_by_batch_size) or 9
    sizes = [n for n in (1, 2, 4, 8) if n < limit]
    return tuple((n, q) for n in sizes for q in range(2, min(k, 16) + 2))
