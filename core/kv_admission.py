"""KV admission control: admit a waiting request only if the running set's projected KV peak leaves it room.

The scheduler without it ("greedy") admits whenever the prompt's blocks are free; once the running requests
grow into the cache it preempts the newest, whose prompt and output are then recomputed. On long outputs
(Llama-3-8B, 512 x 1000/1000 on an H100's cache) that was 277 preemptions and 352k recomputed prompt tokens on
top of 512k (docs/performance.md).

"projected" (the default) looks ahead instead. Each running request ``r`` is projected to hold its tokens
``t_r`` plus one more per step until it has produced its expected remaining output ``e_r``, then to free its
``h_r`` blocks. A new request is admitted only if, at every future step ``s``, the blocks still to be
allocated fit in today's free blocks:

    need(s) = sum_{r: d_r > s} (ceil((t_r + s) / bs) - h_r)  -  sum_{r: d_r <= s} h_r  <=  free blocks
    d_r     = e_r + the steps its unscheduled prompt still takes (chunks of the token budget)

``need(s)`` only grows between two finishes, so checking it just before each finish (``s = d_k - 1``) is
enough: sort by ``d``, keep suffix sums, O(n) per check (and O(1) when even the sum of all growth fits).
Waiting longer only helps (the running requests are closer to their ends when the new one starts), so a
failed check also finds, by bisection, the fewest steps ``D`` after which the same request would pass with
the same running set; until then, or until a request joins, finishes or is preempted, its check is refused
without projecting (nothing is rebuilt per step while the head of the queue waits). Blocks freed otherwise
(sliding-window release, rejected drafts' slots) only count from the next change: conservative.

``e_r`` is exact when the output length is known: ``ignore_eos`` (or no EOS token), no stop ids, no stop
strings, no grammar: it runs to ``max_tokens``. Otherwise the request may stop any time and ``e_r`` is the
estimate ``ceil(ratio * min(remaining, clip))`` with one adaptive ``ratio`` (SGLang's ``new_token_ratio``
idea; the numbers and the optimistic start are ours): it starts at ``ratio`` (0.1), jumps to
``ratio_after_preemption`` (0.7) when a preemption shows the estimate was too low, and decays linearly back
over ``decay_steps`` steps without one. Starting high would hold back short chat answers under a large
``max_tokens`` (-9 % on schedule_sim's chat workload); preemption stays the backstop.

Last-wave overcommit (``overcommit``: a share of the cache, setting ``kv_admission_overcommit``; 0 = off): when
the check above fails, it is retried with ``X - tail`` extra blocks, ``X = overcommit * cache blocks`` and
``tail`` the final blocks of every request still waiting behind this one. So it fires only when the whole rest
of the queue (at most ``OVERCOMMIT_MAX_TAIL`` requests) fits in ``X``: instead of a last wave that runs alone for
a whole output length (Llama-3-8B fp8, 512 x 1000/1000 on an H100: ~20 requests x 1,000 small steps), those
requests start now and the cache runs short by at most ``X`` at the end, where preemption recomputes a few of
them (benchmarks/schedule_sim.py, 61,600 blocks, 0.05: 2,002 -> 1,116 steps, 14 preemptions). A long queue
(bf16's waves, a busy server) leaves no bonus: its schedule is unchanged (bf16 512 x 1000/1000 and the eos / chat
workloads: the same steps). Default 0.05 since session 10: on an H100, one engine, that fp8 run took 40.67 s
(2,002 steps) off and 36.12 s on (1,118 steps, 14 preemptions, 1,823 prompt tokens recomputed: the prefix cache
still held most of theirs), +12.6 % tok/s.

Pacing (``pacing``, setting ``kv_admission_pacing``, core/kv_pacing.py): when every waiting request's length is known and
the queue outgrows the cache, the check above admits whole waves; pacing spreads the starts at the cache's
fluid rate where a model of the schedule says that takes fewer steps. It only ever refuses: the check above still
decides every start.

No deadlock, no starvation: with nothing running every request is admitted (one that alone outgrows the
cache ends with "length", as before); the waiting queue is never reordered, so a large request at its head
holds later ones back until the running set has drained enough for it. (Under the priority policy the
scheduler lets a request that outranks a running one skip this check: see docs/engine.md.)
"""

from __future__ import annotations

import math

import numpy as np

from octavo.core.kv_pacing import Pacer
from octavo.core.request import Request

# the last-wave overcommit looks at a queue of at most this many requests (the 8B fp8 run's last wave: ~20-30)
OVERCOMMIT_MAX_TAIL = 64


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
                 clip_tokens: int = 4096, overcommit: float = 0.0, pacing: str | float = "off") -> None:
        if mode not in ("projected", "greedy"):
            raise ValueError(f"kv_admission={mode!r}: expected 'projected' or 'greedy'")
        if not 0.0 <= ratio <= ratio_after_preemption <= 1.0:
            raise ValueError(f"kv_admission_ratio={ratio} and kv_admission_ratio_after_preemption="
                             f"{ratio_after_preemption} need 0 <= the first <= the second <= 1")
        if not 0.0 <= overcommit <= 0.25:
            raise ValueError(f"kv_admission_overcommit={overcommit}: expected a share of the cache in [0, 0.25]")
        self.pacer = (Pacer(pacing, max_blocks * block_size, max_num_batched_tokens, output_length_known)
                      if mode == "projected" else None)
        self.mode = mode
        self.overcommit_blocks = int(overcommit * max_blocks)  # X of the module docstring
        self.bs = block_size
        self.budget = max_num_batched_tokens
        self.max_blocks = max_blocks  # usable blocks: a projection never exceeds the whole cache
        self.min_ratio, self.max_ratio = ratio, ratio_after_preemption
        self.decay = (ratio_after_preemption - ratio) / max(1, decay_steps)
        self.clip = clip_tokens
        self.ratio = ratio
        self.num_steps = 0
        # the running set's projection for the current schedule() call, sorted by d (int64 arrays)
        self._d = self._t = self._h = np.zeros(0, np.int64)
        # (d, t, h) of requests admitted since the arrays were last built, in admission order: folded in by _merge
        # only when a check needs the arrays (an admission whose cheap check passes never does; np.insert per
        # admission cost ~0.3 ms each on the core thread: nano-vllm's 256 admissions sit in its host-bound
        # prefill steps)
        self._new: list[tuple[int, int, int]] = []
        self._growth = 0  # total blocks the running set may still allocate
        self._sums = None  # suffix / prefix sums of the projection, built at the first _fits
        self._pending = None  # (running, held_blocks, version) until the step's first check builds the projection
        self._waiting = ()  # the scheduler's waiting queue of this schedule() call (last-wave overcommit)
        self._refused = None  # (key, step): until that step the same first check fails again
        self._num_admitted = 0

    # ---- estimates -----------------------------------------------------------------------------------
    def expected_remaining(self, req: Request) -> int:
        """Output tokens ``req`` is expected to still produce (exact when its length is known)."""
        rem = max(0, req.max_tokens - req.num_output_tokens - req.num_output_placeholders)
        if output_length_known(req):
            return rem
        return math.ceil(self.ratio * min(rem, self.clip))

    def _project(self, req: Request) -> tuple[int, int]:
        """(d: steps until it frees its blocks, t: tokens), with its prompt's remaining chunks ``pf`` folded
        in as ``t - pf`` so that ``t + s`` is its length at step ``s`` once decoding and ``t + d`` its
        expected final length."""
        pf = cdiv(max(0, req.num_prompt_tokens - req.num_computed_tokens), self.budget)
        return self.expected_remaining(req) + pf, req.num_tokens + req.num_output_placeholders - pf

    def _final_blocks(self, d, t):
        return np.minimum(self.max_blocks, -(-(t + d) // self.bs))

    def _final_int(self, d: int, t: int) -> int:
        """:meth:`_final_blocks` of one request, in plain ints (numpy's scalar path costs microseconds a call)."""
        return min(self.max_blocks, -(-(t + d) // self.bs))

    @property
    def num_running(self) -> int:
        """Requests in the running set's projection (admitted this step included)."""
        return len(self._d) + len(self._new)

    def _merge(self) -> None:
        """Fold the requests admitted since the last build into the sorted arrays. A stable sort of the arrays
        followed by the new entries in admission order puts each new one after every equal ``d`` before it:
        the order inserting each at ``searchsorted(d, side="right")`` on admission gave, so the projection is
        the same array."""
        if not self._new:
            return
        nd, nt, nh = (np.array(c, np.int64) for c in zip(*self._new))
        self._new = []
        d, t, h = np.concatenate([self._d, nd]), np.concatenate([self._t, nt]), np.concatenate([self._h, nh])
        order = np.argsort(d, kind="stable")
        self._d, self._t, self._h = d[order], t[order], h[order]
        self._sums = None

    # ---- the check -----------------------------------------------------------------------------------
    def begin_step(self, running: list[Request], held_blocks, version: tuple, waiting=()) -> None:
        """Start the checks of one ``schedule()``. ``held_blocks(req)``: blocks it holds now; ``version``: changes
        whenever a request joins, leaves or is preempted; ``waiting``: the queue (for the last-wave overcommit).
        The projection is built at the first check, if any."""
        self._pending = (running, held_blocks, version)
        self._waiting = waiting

    def _overcommit_room(self, req: Request) -> int:
        """Extra blocks the check may assume: ``X`` minus the final blocks of every other waiting request (their
        sum is only needed up to ``X``), or 0 (module docstring)."""
        if len(self._waiting) > OVERCOMMIT_MAX_TAIL:  # a long queue: no last wave to save (and no O(queue) scan)
            return 0
        room = self.overcommit_blocks
        for r in self._waiting:
            if room <= 0:
                return 0
            if r is not req:  # its final length (tokens + expected output) in blocks; plain ints, no numpy
                room -= min(self.max_blocks, cdiv(r.num_tokens + r.num_output_placeholders
                                                  + self.expected_remaining(r), self.bs))
        return max(0, room)

    def _build(self) -> None:
        running, held_blocks, _ = self._pending
        self._pending = None
        # one pass over the requests' raw counts, then the same arithmetic as _project on whole arrays
        raw = np.array([(r.max_tokens, len(r.output_token_ids), r.num_output_placeholders, len(r.all_token_ids),
                         len(r.prompt_token_ids), r.num_computed_tokens, output_length_known(r), held_blocks(r))
                        for r in running], np.int64).reshape(-1, 8)
        max_tokens, num_out, ph, num_tokens, num_prompt, num_computed, known, held = raw.T
        rem = np.maximum(0, max_tokens - num_out - ph)
        e = np.where(known == 1, rem, np.ceil(self.ratio * np.minimum(rem, self.clip)).astype(np.int64))
        pf = -(-np.maximum(0, num_prompt - num_computed) // self.budget)
        order = np.argsort(e + pf, kind="stable")
        self._d, self._t, self._h = (e + pf)[order], (num_tokens + ph - pf)[order], held[order]
        self._growth = int((self._final_blocks(self._d, self._t) - self._h).sum())
        self._sums = None
        self._new = []

    def admits(self, req: Request, num_free_blocks: int, num_hit_blocks: int) -> bool:
        """Whether ``req`` may start now, given the free blocks (its prefix hits that sit in the free queue
        already subtracted) and ``num_hit_blocks`` blocks of prefix-cache hits it will not allocate. Once its
        blocks are allocated, :meth:`admitted` adds it to the projection."""
        if self.mode == "greedy":
            return True
        key = None
        if self._pending is not None:  # the step's first check
            key = (self._pending[2], self._num_admitted, req.request_id, self.ratio)
            if self._refused is not None and self._refused[0] == key and self.num_steps < self._refused[1]:
                return False  # the same check failed and cannot pass before that step (module docstring)
            self._build()
        if self.num_running == 0:  # nothing running: always (no deadlock)
            return True
        if self.pacer is not None and not self.pacer.gate(self, req):
            return False  # not the projection's refusal: nothing cached, the credit grows each step
        d_w, t_w = self._project(req)
        need = self._growth + self._final_int(d_w, t_w) - num_hit_blocks
        if need <= num_free_blocks:
            return True  # even every request's whole growth at once fits (the overcommit room only adds to the free)
        if self.overcommit_blocks:
            num_free_blocks += self._overcommit_room(req)
            if need <= num_free_blocks:
                return True
        self._merge()
        if self._fits(d_w, t_w, num_hit_blocks, num_free_blocks, 0):
            return True
        if key is not None:
            self._refused = (key, self.num_steps + self._min_delay(d_w, t_w, num_hit_blocks, num_free_blocks))
        return False

    def admitted(self, req: Request, num_held_blocks: int) -> None:
        """``req`` started and holds ``num_held_blocks`` (prefix hits included): the next check sees it."""
        if self.mode == "greedy":
            return
        self._num_admitted += 1  # part of the refusal key: the running set changed even if its size did not
        if self.pacer is not None:
            self.pacer.admitted(self.num_steps)
        if self._pending is not None:
            self._build()
        d, t = self._project(req)
        self._new.append((d, t, num_held_blocks))  # sorted in by _merge when a check needs the arrays
        self._growth += self._final_int(d, t) - num_held_blocks

    def _fits(self, d_w: int, t_w: int, hits: int, free: int, delay: int) -> bool:
        """need(s) <= free at every step ``s >= delay`` if the new request starts at step ``delay``."""
        d, bs = self._d, self.bs
        n = len(d)
        if self._sums is None:  # over requests k.. (sorted by d): tokens, blocks held; blocks held by ..k-1
            t, h = self._t, self._h
            self._sums = (np.concatenate([np.cumsum(t[::-1])[::-1], [0]]),
                          np.concatenate([np.cumsum(h[::-1])[::-1], [0]]), np.concatenate([[0], np.cumsum(h)]))
        suf_t, suf_h, pre_h = self._sums
        s = np.concatenate([d[d - 1 >= delay] - 1, [delay, delay + max(0, d_w - 1)]])  # repeats are harmless
        k = np.searchsorted(d, s, side="right")  # requests k.. still run at step s; ..k-1 have freed
        cnt = n - k
        # sum of ceil((t + s) / bs) over the suffix, bounded above by (sum t + s * cnt) / bs + cnt
        need = (suf_t[k] + s * cnt) // bs + cnt - suf_h[k] - pre_h[k]
        need += np.where(s < delay + d_w, -(-(t_w + s - delay) // bs) - hits, 0)
        return bool((need <= free).all())

    def _min_delay(self, d_w: int, t_w: int, hits: int, free: int) -> int:
        """Fewest steps from now after which the check passes with this running set (it passes once all of
        it has finished, if ever): bisection, since a later start only lowers the new request's usage."""
        lo, hi = 1, int(self._d[-1]) + 1
        if not self._fits(d_w, t_w, hits, free, hi):
            return hi  # it needs more than the running set ever frees: wait for the next change
        while lo < hi:
            mid = (lo + hi) // 2
            if self._fits(d_w, t_w, hits, free, mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ---- feedback ------------------------------------------------------------------------------------
    def on_step(self, num_preempted: int) -> None:
        """After each ``schedule()``: a preemption means the estimate was too low (up to
        ``ratio_after_preemption``), a step without one lets it decay back towards ``ratio``."""
        self.num_steps += 1
        if self.pacer is not None:
            self.pacer.on_step()
        if num_preempted:
            self.ratio = max(self.ratio, self.max_ratio)
        else:
            self.ratio = max(self.min_ratio, self.ratio - self.decay)
