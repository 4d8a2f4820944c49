"""KV admission control: admit a waiting request only if the running set's projected KV peak leaves it room.

The scheduler without it ("greedy") admits whenever the prompt's blocks are free; once the running requests
grow into the cache it preempts the newest, whose prompt and output are then recomputed. On long outputs
(Llama-3-8B, 512 x 1000/1000 on an H100) that recomputed 40 % of all prompt tokens (docs/performance.md).

"projected" (the default) looks ahead instead. Each running request ``r`` is projected to hold its tokens
``t_r`` plus one more per step until it has produced its expected remaining output ``e_r``, then to free its
``h_r`` blocks. A new request is admitted only if, at every future step ``s``, the blocks still to be
allocated fit in today's free blocks:

    need(s) = sum_{r: d_r > s} (ceil((t_r + s) / bs) - h_r)  -  sum_{r: d_r <= s} h_r  <=  free blocks
    d_r     = e_r + the steps its unscheduled prompt still takes (chunks of the token budget)

``need(s)`` only grows between two finishes, so checking it just before each finish (``s = d_k - 1``) is
enough: sort by ``d``, keep suffix sums, O(n) per check (and O(1) when even the sum of all growth fits).

``e_r`` is exact when the output length is known: ``ignore_eos`` (or no EOS token), no stop ids, no stop
strings, no grammar: it runs to ``max_tokens``. Otherwise the request may stop any time and ``e_r`` is the
estimate ``ceil(ratio * min(remaining, clip))`` with one adaptive ``ratio`` (SGLang's ``new_token_ratio``
idea; the numbers and the optimistic start are ours): it starts at ``ratio`` (0.1), jumps to
``ratio_after_preemption`` (0.7) when a preemption shows the estimate was too low, and decays linearly back
over ``decay_steps`` steps without one. Starting high would hold back short chat answers under a large
``max_tokens`` (-9 % on schedule_sim's chat workload); preemption stays the backstop.

No deadlock, no starvation: with nothing running every request is admitted (one that alone outgrows the
cache ends with "length", as before); the waiting queue is never reordered, so a large request at its head
holds later ones back until the running set has drained enough for it.
"""

from __future__ import annotations

import bisect
import math
from itertools import accumulate

from octavo.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def output_length_known(req: Request) -> bool:
    """True when ``req`` certainly runs to ``max_tokens``: nothing can stop it earlier."""
    p = req.sampling_params
    return ((p.ignore_eos or req.eos_token_id is None) and not p.stop_token_ids and not p.stop
            and req.grammar is None)


class KVAdmission:
    """Projected-peak admission (module docstring). One per scheduler; ``mode == "greedy"`` admits all."""

    def __init__(self, mode: str, block_size: int, max_num_batched_tokens: int, max_blocks: int, *,
                 ratio: float = 0.1, ratio_after_preemption: float = 0.7, decay_steps: int = 600,
                 clip_tokens: int = 4096) -> None:
        if mode not in ("projected", "greedy"):
            raise ValueError(f"kv_admission={mode!r}: expected 'projected' or 'greedy'")
        if not 0.0 <= ratio <= ratio_after_preemption <= 1.0:
            raise ValueError(f"kv_admission_ratio={ratio} and kv_admission_ratio_after_preemption="
                             f"{ratio_after_preemption} need 0 <= the first <= the second <= 1")
        self.mode = mode
        self.bs = block_size
        self.budget = max_num_batched_tokens
        self.max_blocks = max_blocks  # usable blocks: a projection never exceeds the whole cache
        self.min_ratio, self.max_ratio = ratio, ratio_after_preemption
        self.decay = (ratio_after_preemption - ratio) / max(1, decay_steps)
        self.clip = clip_tokens
        self.ratio = ratio
        # the projection of the running set for the current schedule() call (begin_step), kept sorted by d
        self._d: list[int] = []
        self._t: list[int] = []
        self._h: list[int] = []
        self._growth = 0  # total blocks the running set may still allocate
        self._num = 0

    # ---- estimates -----------------------------------------------------------------------------------
    def expected_remaining(self, req: Request) -> int:
        """Output tokens ``req`` is expected to still produce (exact when its length is known)."""
        rem = max(0, req.max_tokens - req.num_output_tokens - req.num_output_placeholders)
        if output_length_known(req):
            return rem
        return math.ceil(self.ratio * min(rem, self.clip))

    def _project(self, req: Request, num_held_blocks: int) -> tuple[int, int, int]:
        """(d: steps until it frees its blocks, t: tokens, h: blocks it holds now), with its prompt's remaining
        chunks ``pf`` folded in as ``t - pf`` so that ``t + s`` is its length at step ``s`` once decoding and
        ``t + d`` its expected final length."""
        unscheduled_prompt = max(0, req.num_prompt_tokens - req.num_computed_tokens)
        pf = cdiv(unscheduled_prompt, self.budget)
        return self.expected_remaining(req) + pf, req.num_tokens + req.num_output_placeholders - pf, num_held_blocks

    # ---- the check -----------------------------------------------------------------------------------
    def begin_step(self, running: list[Request], held_blocks) -> None:
        """Project the running set once per ``schedule()``; ``held_blocks(req)`` = blocks it holds now."""
        if self.mode == "greedy":
            return
        rows = sorted(self._project(r, held_blocks(r)) for r in running)
        self._d = [r[0] for r in rows]
        self._t = [r[1] for r in rows]
        self._h = [r[2] for r in rows]
        self._growth = sum(self._final_blocks(d, t) - h for d, t, h in rows)
        self._num = len(rows)

    def _final_blocks(self, d: int, t: int) -> int:
        return min(self.max_blocks, cdiv(t + d, self.bs))

    def admits(self, req: Request, num_free_blocks: int, num_hit_blocks: int) -> bool:
        """Whether ``req`` may start now, given the free blocks (its prefix hits that sit in the free queue
        already subtracted) and ``num_hit_blocks`` blocks of prefix-cache hits it will not allocate. Once its
        blocks are allocated, :meth:`admitted` adds it to the projection."""
        if self.mode == "greedy" or self._num == 0:  # nothing running: always (no deadlock)
            return True
        d_w, t_w, _ = self._project(req, 0)
        if self._growth + self._final_blocks(d_w, t_w) - num_hit_blocks <= num_free_blocks:
            return True  # even every request's whole growth at once fits
        return self._peak_fits(d_w, t_w, num_hit_blocks, num_free_blocks)

    def admitted(self, req: Request, num_held_blocks: int) -> None:
        """``req`` started and holds ``num_held_blocks`` (prefix hits included): the next check sees it."""
        if self.mode == "greedy":
            return
        d, t, h = self._project(req, num_held_blocks)
        i = bisect.bisect_right(self._d, d)
        self._d.insert(i, d)
        self._t.insert(i, t)
        self._h.insert(i, h)
        self._growth += self._final_blocks(d, t) - h
        self._num += 1

    def _peak_fits(self, d_w: int, t_w: int, hits: int, free: int) -> bool:
        bs, n = self.bs, self._num
        # suffix sums over the running set sorted by d: tokens, blocks held, count; prefix sums of blocks held
        suf_t = list(accumulate(reversed(self._t)))[::-1] + [0]
        suf_h = list(accumulate(reversed(self._h)))[::-1] + [0]
        pre_h = [0, *accumulate(self._h)]
        candidates = sorted({d - 1 for d in self._d if d >= 1} | {max(0, d_w - 1), 0})
        for s in candidates:
            k = bisect.bisect_right(self._d, s)  # requests k.. still run at step s; ..k-1 have freed
            cnt = n - k
            # sum of ceil((t + s) / bs) over the suffix, bounded above by (sum t + s * cnt) / bs + cnt
            need = (suf_t[k] + s * cnt) // bs + cnt - suf_h[k] - pre_h[k]
            if s < d_w:
                need += cdiv(t_w + s, bs) - hits
            if need > free:
                return False
        return True

    # ---- feedback ------------------------------------------------------------------------------------
    def on_step(self, num_preempted: int) -> None:
        """After each ``schedule()``: a preemption means the estimate was too low (up to
        ``ratio_after_preemption``), a step without one lets it decay back towards ``ratio``."""
        if num_preempted:
            self.ratio = max(self.ratio, self.max_ratio)
        else:
            self.ratio = max(self.min_ratio, self.ratio - self.decay)
