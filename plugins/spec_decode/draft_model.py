"""The ``draft_model`` proposer: a smaller model sharing the target's tokenizer drafts k tokens greedily.

The draft keeps its own KV cache (loaded by the core, see ``SpecContext.load_draft_model``). Each step it
first catches up on what the target verified — the longest common prefix of what it has cached and the
request's tokens stays, the rest (rejected drafts) is recomputed from there — then drafts one token at a
time, all requests batched in each draft forward::

    cached : t0 .. t9 d0 d1 d2        (d1, d2 were rejected; the target emitted d0 then x)
    tokens : t0 .. t9 d0 x
    feed   :             x  -> e0 -> e1 -> ...   (one draft forward per drafted token)
"""

from __future__ import annotations

from octavo.speculator import SpecRequest, Speculator


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelProposer(Speculator):
    name = "draft_model"

    def __init__(self, *, num_speculative_tokens: int, config=None, settings=None, context=None) -> None:
        super().__init__(num_speculative_tokens=num_speculative_tokens, config=config, settings=settings,
                         context=context)
        if context is None or context.load_draft_model is None:
            raise ValueError("method 'draft_model' needs the engine to load the draft model (SpecContext."
                             "load_draft_model); it cannot run standalone")
        self.draft = context.load_draft_model(config)
        self.cached: dict[str, list[int]] = {}  # tokens whose K/V the draft holds, per request

    def propose(self, requests: list[SpecRequest]) -> list[list[int]]:
        drafts: dict[str, list[int]] = {r.request_id: [] for r in requests}
        room = {r.request_id: r.max_num_drafts for r in requests}
        feeds = []
        for r in requests:
            cached = self.cached.get(r.request_id, [])
            # keep the verified common prefix; always feed at least the last token (its logits draft d0)
            n = min(common_prefix_len(cached, r.token_ids), len(r.token_ids) - 1)
            feeds.append((r.request_id, r.token_ids[n:], n))
            self.cached[r.request_id] = list(r.token_ids)
        while feeds:
            out = self.draft.run(feeds)
            fed, feeds = feeds, []
            for rid, _, _ in fed:
                if rid not in out:  # did not fit the draft's cache: start over next time
                    self.cached.pop(rid, None)
                    continue
                drafts[rid].append(out[rid])
                if len(drafts[rid]) < room[rid]:
                    feeds.append((rid, [out[rid]], len(self.cached[rid])))
                    self.cached[rid].append(out[rid])
        return [drafts[r.request_id] for r in requests]

    def release(self, request_ids: list[str]) -> None:
        self.draft.forget(request_ids)
        for rid in request_ids:
            self.cached.pop(rid, None)
