"""The ``ngram`` proposer (prompt lookup decoding): no extra model.

For each request, take the last ``n`` tokens (``n`` from ``prompt_lookup_max`` down to
``prompt_lookup_min``), find their latest earlier occurrence in the prompt + output, and propose the
tokens that followed it. Pays off when the output copies its input (summaries, edits, code, RAG)::

    tokens : ... the quick brown fox jumps ... | the quick brown
                 ^^^^^^^^^^^^^^^ match (n=3)           suffix
    drafts : fox jumps ...
"""

from __future__ import annotations

import numpy as np

from octavo.speculator import SpecRequest, Speculator


def find_ngram_drafts(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the longest matching suffix."""
    num = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        suffix = tokens[num - n:]
        # windows starting at 0 .. num-n-1 (the suffix itself excluded)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:num - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


class NgramProposer(Speculator):
    name = "ngram"

    def __init__(self, *, num_speculative_tokens: int, config=None, settings=None, context=None) -> None:
        super().__init__(num_speculative_tokens=num_speculative_tokens, config=config, settings=settings,
                         context=context)
        self.min_n = (config.prompt_lookup_min if config else None) or 1
        self.max_n = (config.prompt_lookup_max if config else None) or 3

    def propose(self, requests: list[SpecRequest]) -> list[list[int]]:
        return [find_ngram_drafts(np.asarray(r.token_ids, dtype=np.int64), self.min_n, self.max_n,
                                  min(r.max_num_drafts, self.num_speculative_tokens)) for r in requests]
