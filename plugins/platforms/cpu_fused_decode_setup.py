"""Install :mod:`.cpu_fused_decode`'s runner from the CPU platform's ``prepare_model``.

Why its own module: cpu.py stays importable without torch-heavy imports (the plugin manager imports it in every
process) and a verbatim third-party copy of cpu.py without this sibling still loads (it then refuses the switch).

``OCTAVO_CPU_FUSED_DECODE``: ``1`` runs single-request decode steps through the fused C stack (refused with the
reason when the model cannot run it, or with ``enforce_eager``); ``0`` never; unset: :data:`DEFAULT_ON`. With
``OCTAVO_CPU_COMPILE=1`` too, the compiled runner takes every step the fused one does not.
"""

from __future__ import annotations

import logging
import os

from octavo.errors import ConfigError
from octavo.platform import ModelHandle, PreparedModel

logger = logging.getLogger(__name__)

ENV = "OCTAVO_CPU_FUSED_DECODE"
#: whether an unset switch runs the fused stack where the model supports it AND the per-op path computes its bits
#: (``same_bits_reason``: cpu_norm / cpu_rope / cpu_silu installed, one dtype; see docs/quantization.md)
DEFAULT_ON = True


def with_fused_decode(handle: ModelHandle, prepared: PreparedModel | None) -> PreparedModel | None:
    """``prepared`` with the fused runner in front of its step runner, when the switch asks for it."""
    raw = os.environ.get(ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{ENV}={raw!r}: use 1 (fused batch-1 CPU decode) or 0")
    explicit = raw == "1"
    if raw == "0" or (raw == "" and not DEFAULT_ON):
        return prepared
    if handle.enforce_eager:
        if explicit:
            raise ConfigError(f"{ENV}=1 and enforce_eager are both set; unset one of them")
        return prepared
    from .cpu_fused_decode import CpuFusedDecodeRunner, same_bits_reason, unsupported_reason

    reason = unsupported_reason(handle.model)
    if reason is None and not explicit:  # the default only where batch 1 computes the per-op path's bits
        reason = same_bits_reason(handle.model, handle.dtype)
    if reason is not None:
        if explicit:
            raise ConfigError(f"{ENV}=1: this model cannot run the fused CPU decode step: {reason}")
        logger.info("fused CPU decode step not used: %s", reason)
        return prepared
    fallback = prepared.step_runner if prepared is not None else None
    runner = CpuFusedDecodeRunner(handle.model, handle.dtype, fallback=fallback)
    notes = dict(prepared.notes) if prepared is not None else {}
    notes["fused_decode"] = {"batch": 1, "layers": int(runner._stack.nlayers)}
    return PreparedModel(step_runner=runner, notes=notes)
