"""The xgrammar backend's chained fill (session 16, opt-in ``OCTAVO_GRAMMAR_CHAIN``; the engine side and the why:
core/grammar_chain.py): step N+1's accept of N's tokens, its fill and the gate word's opening as ONE C job
(plugins/structured_output/xgrammar_native_src.py ``chain_job`` / ``octavo_chain_run``) that the CUDA driver runs as a
host function once N's sampled ids are in pinned host memory. This module builds the jobs; nothing here calls CUDA.

A job reuses the core thread's ``NativeFill`` call (the same chunks, pool, matchers Array and rows; prepared once per
batch layout) and owns its tokens / per-row results, so two jobs in flight never share them. Jobs come from a ring of
:data:`SLOTS` per layout: a slot is reused only after its job ran and the host settled it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from octavo.plugins.structured_output import xgrammar_native as xn

SLOTS = 4  # jobs per layout (two steps in flight under async scheduling, + room)
_P, _I32 = ctypes.c_void_p, ctypes.c_int32


class _Job(ctypes.Structure):  # the C chain_job
    _fields_ = [("fns", _P), ("args", _P), ("n", ctypes.c_int), ("pool", _P), ("acc", xn._Accept),
                ("sampled", _P), ("index", _P), ("rows", _I32), ("bits", _I32), ("word", _P), ("seq", _I32),
                ("rc", _I32), ("state", _I32), ("t_run", ctypes.c_double), ("t_end", ctypes.c_double)]


class ChainJob:
    """One step's chained job (a ring slot). ``bind`` (the runner, at the launch) sets N's tokens and the word;
    ``run_now`` runs it on this thread (the CPU stand-in; GIL released); ``fn`` / ``addr``: the host function and its
    argument for ``cuLaunchHostFunc``. After it ran: ``state`` (1 opened, 2 left for the host), ``ok`` / ``term``."""

    __slots__ = ("ring", "job", "tokens", "ok", "term", "index", "keep", "busy", "rows")

    def __init__(self, ring: Any, rows: int) -> None:
        self.ring, self.rows = ring, rows
        self.job = _Job()
        self.tokens, self.ok = (ctypes.c_int32 * rows)(), (ctypes.c_int8 * rows)()
        self.term, self.index = (ctypes.c_int8 * rows)(), (ctypes.c_int32 * rows)()
        self.keep: Any = None  # what the prepared call points at (the Arrays, rows, matchers): alive until settled
        self.busy = False

    @property
    def fn(self) -> int:
        return self.ring.fn

    @property
    def addr(self) -> int:
        return ctypes.addressof(self.job)

    def bind(self, sampled: Any, index: list[int] | None, words: Any, seq: int) -> None:
        """N's host tensor of sampled ids (int64 or int32, filled before the job runs), row r's position in it
        (None: r), and the gate word to open to ``seq``."""
        j = self.job
        j.sampled, j.bits = sampled.data_ptr(), sampled.element_size() * 8
        if index is None:
            j.index = None
        else:
            self.index[:] = index
            j.index = ctypes.addressof(self.index)
        j.word, j.seq = words.data_ptr(), seq
        self.keep = (self.keep[0], sampled)  # (the host copy alive until the job ran)

    def run_now(self) -> None:
        self.ring.lib.octavo_chain_run(self.addr)

    def state(self, timeout_s: float = 0.0) -> int:
        """0 not run yet, 1 filled and opened, 2 left for the host; waits up to ``timeout_s`` (GIL released then)."""
        if timeout_s <= 0:
            return self.ring.gil.octavo_chain_wait(self.addr, 0.0)
        return self.ring.lib.octavo_chain_wait(self.addr, timeout_s)

    def results(self) -> tuple[bytes, bytes]:
        """(per-row accept results: 1 accepted, 0 refused, 2 the call failed; per-row 1: terminated)."""
        return ctypes.string_at(self.ok, self.rows), ctypes.string_at(self.term, self.rows)

    def times(self) -> tuple[float, float]:
        return self.job.t_run, self.job.t_end

    def release(self) -> None:
        self.keep, self.busy = None, False


class ChainRing:
    """The jobs of one NativeFill layout (its ``_key``): :meth:`take` gives a free slot set up for this step."""

    def __init__(self, native: Any, inner: list) -> None:
        self.native, self.lib, self.gil = native, native.lib, native.gil
        self.fn = self.lib.octavo_chain_fn()
        self.key = native._key  # noqa: SLF001
        self.term_fn = xn._method(inner[0]._handle, "is_terminated")  # noqa: SLF001
        self.slots = [ChainJob(self, len(inner)) for _ in range(SLOTS)]
        self.matchers: Any = None  # the step list and the rows' address of the last job (the backend's fast check)
        self.rows_ptr = 0

    def take(self, matchers: list) -> ChainJob | None:
        """A free slot for ``matchers``' step (None: all in flight), pointing at the prepared call (set once per slot:
        the ring is per layout; only the per-run fields are reset here)."""
        for slot in self.slots:
            if not slot.busy:
                break
        else:
            return None
        j = slot.job
        if not j.fns:
            nat, acc = self.native, self.native.acc
            j.fns, j.args, j.n, j.pool = ctypes.addressof(nat.fns), ctypes.addressof(nat.args), nat.n, nat.pool
            j.acc.fn, j.acc.mviews, j.acc.cuts = acc.fn, acc.mviews, acc.cuts
            j.acc.tokens, j.acc.ok = ctypes.addressof(slot.tokens), ctypes.addressof(slot.ok)
            j.acc.term_fn, j.acc.term, j.rows = self.term_fn.__chandle__(), ctypes.addressof(slot.term), slot.rows
            self.prepared = (nat._keep, nat.fns, nat.args, self.term_fn)  # noqa: SLF001
        j.state, j.t_run, j.t_end = 0, 0.0, 0.0
        slot.keep, slot.busy = ((self.prepared, matchers), None), True
        return slot
