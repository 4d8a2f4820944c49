"""Layout constants and the per-CTA call counter shared by the one-shot all-reduce protocols (the flag protocol
of cuda_allreduce.py and the LL words of cuda_allreduce_ll.py), in their own module so neither imports the other.

Every CTA slot's counter is the global call index: a call's CTA ``pid`` advances slot ``pid``, and CTA 0 also
advances the slots the call leaves idle, so calls of any size (any grid) keep all slots equal on every rank.
"""

from __future__ import annotations

import triton
import triton.language as tl

from octavo.plugins.platforms.cuda_pdl import gdc_launch_dependents, gdc_wait

BLOCK = 1024  # elements per CTA iteration (2 KiB of bf16)
MAX_CTAS = 64  # flag slots per source rank; a call uses min(MAX_CTAS, ceil(n / BLOCK)) CTAs
FLAG_BYTES = 64 * 1024  # flags[W][MAX_CTAS] int64 at the start of every rank's buffer (W <= 8 needs 4 KiB)


@triton.jit
def _next_epoch(counters, pid, grid, MAXG: tl.constexpr):
    """This CTA's call index (+1 on its slot); CTA 0 also advances the slots this call leaves idle."""
    epoch = tl.load(counters + pid) + 1
    tl.store(counters + pid, epoch)
    if pid == 0:
        idle = grid + tl.arange(0, MAXG)
        m_idle = idle < MAXG
        tl.store(counters + idle, tl.load(counters + idle, mask=m_idle) + 1, mask=m_idle)
    return epoch


@triton.jit
def _begin_call(counters, MAXG: tl.constexpr, PDL: tl.constexpr):
    """Start of every protocol kernel: (with PDL, wait for the predecessor, then let the successor launch), then
    this CTA's ``(pid, grid, epoch, parity)``. The wait comes first: the counters are earlier calls' state."""
    if PDL:  # cuda_pdl.py
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    epoch = _next_epoch(counters, pid, grid, MAXG)
    return pid, grid, epoch, epoch % 2
