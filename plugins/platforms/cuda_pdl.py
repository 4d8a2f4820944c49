"""Programmatic dependent launch (PDL) for the small Triton kernels of a decode step (opt-in: ``OCTAVO_PDL=1``).

Why: a batch-1 decode graph of Llama-3-8B at TP=2 is ~400 kernels (3.5 ms); a replayed graph still pays about
1 us between two dependent kernels (the next one is launched only once the previous has drained), and each GEMV
then waits for its first weight tile. With PDL (sm_90+, CUDA 12.3+ graphs) a kernel launched with
``launch_pdl=True`` may start while its predecessor runs: it does work that needs nothing of the predecessor
(a GEMV loads its first weight tile), then ``gdc_wait()`` blocks until the predecessor finished and its writes
are visible. A kernel calls ``gdc_launch_dependents()`` to let its successor start early; every kernel here
calls it only *after* its own ``gdc_wait()``, so at most two kernels overlap and whatever ran before the
predecessor is complete (what a pre-wait part may read: weights, never activations, KV or all-reduce state).

Kernels taking part (a ``PDL`` constexpr each, the launch option only when on): the batch-1 GEMV, RMSNorm,
SiLU-and-mul and rotary of cuda_fusions.py and the one-shot all-reduce / all-gather / all-reduce + RMSNorm of
cuda_allreduce*.py. Kernels that do not (attention, cuBLAS) are simply waited for in full, as without PDL.
``set_pdl`` switches it at run time (a graph captured after the switch uses the new launches).
"""

from __future__ import annotations

import os

from octavo.env_flags import env_switch

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if _INTERPRET:  # the interpreter has no griddepcontrol: no-ops, so CPU tests run
    import triton  # the PDL code paths of the kernels (tests/kernels/test_pdl_paths_cpu.py)
    import triton.language as tl  # noqa: F401 - the interpreter wants it visible to jit functions

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass
else:
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # pragma: no cover - Triton without the intrinsics: PDL cannot be turned on
        gdc_launch_dependents = gdc_wait = None

DEFAULT_ON = True  # unset OCTAVO_PDL: on where supported (session 6 batch 1: TP=1 8B bs1 5.86 -> 5.67 ms with the SiLU
# GEMV, same greedy tokens); an explicit 1 where unsupported is an error
_STATE = {"on": env_switch("OCTAVO_PDL") if os.environ.get("OCTAVO_PDL", "").strip() else None, "checked": False}


def _unsupported() -> str | None:
    """Why PDL cannot run here, or None."""
    import torch

    if gdc_wait is None:
        return "Triton's gdc_wait / gdc_launch_dependents (triton >= 3.4)"
    if not _INTERPRET and (not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0)):
        return "an sm_90+ GPU (Hopper or newer)"
    return None


def set_pdl(on: bool) -> None:
    """Turn PDL on or off for kernels launched (or graphs captured) from now on."""
    _STATE["on"], _STATE["checked"] = bool(on), False


def pdl_on() -> bool:
    """Whether the next launch uses PDL; raises (once per switch) when it was asked for where it cannot run."""
    if _STATE["on"] is None:  # OCTAVO_PDL unset: the default where supported, resolved once
        _STATE["on"], _STATE["checked"] = DEFAULT_ON and _unsupported() is None, True
    if _STATE["on"] and not _STATE["checked"]:
        why = _unsupported()
        if why is not None:
            raise RuntimeError(f"OCTAVO_PDL=1 needs {why}")
        _STATE["checked"] = True
    return _STATE["on"]


def launch_opts() -> dict:
    """``PDL`` constexpr and, when on, Triton's ``launch_pdl`` option for one kernel launch."""
    return {"PDL": True, "launch_pdl": True} if pdl_on() else {"PDL": False}
