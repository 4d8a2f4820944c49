"""Admission pacing for a queue of known-length requests that outgrows the KV cache (core/kv_admission.py).

The projected check admits whole waves when every request's length is known: the first requests fill the
projected peak together, run to their ends together and free the cache together, so the next wave starts from
the same point (Llama-3-8B, 512 x 1000/1000 on an H100's 26,970 blocks: 215 + 215 + 82 requests, 3,011 steps,
the last wave 1,000 steps at 82 rows). Pacing spreads the starts at the cache's fluid rate instead: a step can
host ``capacity`` tokens and a request holds ``t + a`` tokens at the ``a``-th of its ``e`` remaining steps, so
the cache sustains ``capacity / area`` starts a step (``area = e * t + e * (e + 1) / 2``, its token-steps).

Whether that wins depends on the queue: starting slowly costs a ramp at the beginning and a drain at the end,
and a rate a little too high lets the early starts fill the peak so that the waves come back (schedule_sim,
512 x 1000/1000: 26,970 blocks 3,011 -> 2,680 steps at 1.3 x the fluid rate but 3,003 at 1.35; 25,000 blocks:
every rate from 1.1 up is worse than the waves). So :func:`choose` plays the queue forward in a light model of
the scheduler (one token a step, a start only if its projected peak fits, at most one budget's prompts a step)
for each candidate rate and for no pacing, and paces only if a rate saves at least ``MIN_GAIN`` of the steps.
"""

from __future__ import annotations

import numpy as np

RATES = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4)  # candidate factors over the fluid rate, ascending
MIN_GAIN = 0.03  # pace only if the model saves at least this share of the steps
REPLAN_STEPS = 256  # an episode starting sooner after the last model run reuses its rate
MIN_STEPS = 128  # pace only outputs this long on average: the model ignores how the token budget splits prompts
# across steps and rounds the cache's blocks of partial chunks, which decide short runs (64 x 40/40 on 100 blocks
# of 16: the model saw 160 -> 147 steps, the scheduler took 161 -> 162)
PLAN_SPAN = 4  # the model plays at most the queue's head holding this many caches' worth of final tokens


def area(t: int, e: int) -> int:
    """Token-steps a request of ``t`` tokens holds over its ``e`` remaining steps."""
    return e * t + e * (e + 1) // 2


def play(capacity: int, running: list[tuple[int, int]], waiting: list[tuple[int, int]], per_step: int,
         rate: float, block: int = 1) -> int:
    """Steps until the last request ends: ``running`` (tokens, remaining steps), ``waiting`` (prompt tokens,
    output tokens) in queue order, at most ``per_step`` starts a step; ``rate`` 0: the projected check alone
    (waves), else starts are also paid for from a credit of ``rate * capacity`` token-steps a step, a step's
    first start waiting until a whole chunk (``per_step`` requests) is paid for."""
    horizon = max([d for _, d in running] + [0]) + sum(e for _, e in waiting) + len(waiting) + 2
    use = np.zeros(horizon, np.int64)
    for t, d in running:
        use[:d] += -(-(t + np.arange(1, d + 1)) // block) * block
    ramps: dict[tuple[int, int], np.ndarray] = {}
    credit, end, s, i = None, max([d for _, d in running] + [0]), 0, 0
    final = sum(t + d for t, d in running) + sum(t + e for t, e in waiting)
    while i < len(waiting):
        if rate and credit is not None:
            credit += rate * capacity
        started = 0
        while i < len(waiting) and started < per_step:
            t, e = waiting[i]
            paced = rate and final > capacity
            if paced:
                a = area(t, e)
                cap = per_step * a
                credit = cap if credit is None else min(credit, cap)
                if credit < (a if started else min(per_step, len(waiting) - i) * a):
                    break
            ramp = ramps.get((t, e))
            if ramp is None:
                ramp = ramps[(t, e)] = -(-(t + np.arange(1, e + 1)) // block) * block  # whole blocks held
            if end > s and int((use[s:s + e] + ramp).max()) > capacity:  # (nothing running: always starts)
                break
            use[s:s + e] += ramp
            end = max(end, s + e)
            final -= t + e
            if paced:
                credit -= a
            i += 1
            started += 1
        s += 1
    return end


def choose(capacity: int, running: list[tuple[int, int]], waiting: list[tuple[int, int]], per_step: int,
           block: int = 1) -> float:
    """The pacing rate to use, or 0 (the waves). A rate qualifies if it and the next higher candidate both save
    ``MIN_GAIN`` of the steps in the model: the rate at which the waves come back in the model sits at or a
    little below the scheduler's (schedule_sim, 512 x 1000/1000: 1.2 vs 1.2-1.25 at 26,420 blocks, 1.3 vs 1.35 at
    26,970), so the best rate right below that edge is not taken. Among those that qualify, the fewest steps (the
    lower rate on a tie). Chosen vs the scheduler's steps (waves -> paced): 26,420 blocks 1.1 (3,012 -> 2,784),
    26,970 1.2 (3,011 -> 2,720), 27,500 1.3 (3,010 -> 2,639), 30,000 1.35 (3,005 -> 2,523), 25,000 none."""
    base = play(capacity, running, waiting, per_step, 0.0, block)
    steps = [play(capacity, running, waiting, per_step, r, block) for r in RATES]
    ok = [n <= base * (1 - MIN_GAIN) for n in steps]
    best, best_steps = 0.0, base
    for k in range(len(RATES) - 1):
        if ok[k] and ok[k + 1] and steps[k] < best_steps:
            best, best_steps = RATES[k], steps[k]
    return best


def parse(value) -> str | float:
    """The setting ``kv_admission_pacing``: "auto" (:func:`choose`), 0 / "off", or a fixed factor."""
    value = str(value).strip()
    if value in ("auto", "off"):
        return value
    try:
        f = float(value)
    except (TypeError, ValueError):
        f = -1.0
    if f == 0.0:
        return "off"
    if not 0.5 <= f <= 4.0:
        raise ValueError(f"kv_admission_pacing={value!r}: expected auto, off (0) or a rate factor in [0.5, 4]")
    return f


class Pacer:
    """One per :class:`~octavo.core.kv_admission.KVAdmission` (projected mode): the credit, and the rate chosen
    for the current episode (from the first check that finds the queue outgrowing the cache to the first that
    does not)."""

    def __init__(self, setting, capacity: int, budget: int, known) -> None:
        self.setting = parse(setting)
        self.known = known  # kv_admission.output_length_known (passed in: no import circle)
        self.capacity, self.budget = capacity, budget
        self.rate: float | None = None  # this episode's (None: no episode)
        self.credit = 0.0
        self.burst = -1  # the step whose starts have begun (its later starts need one area each)
        self.charge = 0  # the area the request that last passed the gate spends once admitted
        self.binds: tuple = ((), False)
        self.episodes: list[float] = []  # rates chosen, in order (benchmarks read them)
        self.planned_at = 0  # the step of the last model run

    def _outgrows(self, adm) -> bool:
        """Whether the running set and the whole waiting queue together outgrow the cache (final tokens)."""
        # once per schedule() call: an admission moves a request from the queue to the running set without changing
        # the total (its running t + d equals its queue term num_tokens + placeholders + expected output), so the
        # queue is not walked again for each of a step's admissions (nano-vllm: 255 walks, ~33k terms, a run)
        key = (adm.num_steps, len(adm._waiting) + adm.num_running)
        if self.binds[0] != key:
            adm._merge()
            total = int((adm._t + adm._d).sum())  # running: tokens at their projected ends
            for r in adm._waiting:  # (stops once over: a long queue costs what fills the cache, not its length)
                if total > self.capacity:
                    break
                total += r.num_tokens + r.num_output_placeholders + adm.expected_remaining(r)
            self.binds = (key, total > self.capacity)
        return self.binds[1]

    def gate(self, adm, req) -> bool:
        """Whether pacing lets ``req`` start now (True when it does not apply)."""
        self.charge = 0
        if self.setting == "off":
            return True
        if not self._outgrows(adm) or not self.known(req):
            self.rate = None  # the episode (if any) is over
            return True
        t, e = req.num_tokens + req.num_output_placeholders, adm.expected_remaining(req)
        per_step = max(1, self.budget // max(1, req.num_prompt_tokens - req.num_computed_tokens))
        if self.rate is None:  # a new episode: the rate, and a full chunk's credit to start with
            if self.setting != "auto":
                self.rate = self.setting
            elif self.episodes and adm.num_steps - self.planned_at < REPLAN_STEPS:
                self.rate = self.episodes[-1]  # a queue hovering at the cache's size: no model run every step
            else:  # the model on the queue's head up to PLAN_SPAN caches' worth of final tokens, all known
                self.planned_at = adm.num_steps
                waiting, total = [], 0
                for r in adm._waiting:
                    if not self.known(r) or total > PLAN_SPAN * self.capacity:
                        break
                    waiting.append((r.num_tokens + r.num_output_placeholders, adm.expected_remaining(r)))
                    total += sum(waiting[-1])
                known = len(waiting) == len(adm._waiting) or total > PLAN_SPAN * self.capacity
                known = known and sum(e for _, e in waiting) >= MIN_STEPS * len(waiting)
                adm._merge()
                running = list(zip(adm._t.tolist(), adm._d.tolist()))
                self.rate = choose(self.capacity, running, waiting, per_step, adm.bs) if known else 0.0
            self.episodes.append(self.rate)
            self.credit = per_step * area(t, e)
        if not self.rate:
            return True
        a = area(t, e)
        self.credit = min(self.credit, per_step * a)
        if self.credit < (a if self.burst == adm.num_steps else min(per_step, len(adm._waiting)) * a):
            return False
        self.charge = a
        return True

    def admitted(self, step: int) -> None:
        if self.charge:  # it passed the gate: spend its area
            self.credit -= self.charge
            self.charge = 0
            self.burst = step

    def on_step(self) -> None:
        if self.rate:
            self.credit += self.rate * self.capacity
