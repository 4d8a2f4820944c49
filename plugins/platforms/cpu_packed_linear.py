"""bfloat16 dense linears on a CPU through weights packed once for oneDNN (issue 18, offline batch 64).

Why: ``F.linear`` on bfloat16 CPU tensors runs oneDNN's AMX matmul (``brg_matmul:avx10_1_512_amx`` in
``ONEDNN_VERBOSE``), but with the weight in its plain ``[out, in]`` layout, so every call first copies the
weight into the blocked VNNI layout AMX reads. Packing it once (``torch.ops.mkldnn._reorder_linear_weight``, as
inductor's CPU freezing does) and calling ``torch.ops.mkldnn._linear_pointwise`` gave the **same bits** as
``F.linear`` for every row count tried (1 .. 2048, strided and 3-D inputs, with bias) and, 1 thread, SmolLM2
shapes: 1.5-1.9x at 1 row, 1.1-1.7x at 64 rows, 1.0-2.7x at 2048 rows, 2.1x for the 49,152-row LM head at 64
rows (docs/performance.md "Offline 64 x 128/128, session 7"). float32 was tried the same way and is not used:
its packed path differs from ``F.linear`` in the last bits (the fp32 parity tests pin exact results) and was
0.7-1.2x.

On CPUs with AVX512-BF16 and no AMX (oneDNN's ``vdpbf16ps`` path) the weight is packed for
``cpu_bf16_gemm.py``'s kernel instead, which gives oneDNN's bits (checked once per weight shape at install) and
skips its per-call set-up (session 9: batch-64 decode step 1.12x, 1 thread).

Installed by the CPU platform's ``prepare_model`` on dense (``UnquantizedLinearMethod``) bfloat16 linears and on
a dense bfloat16 LM head (its ``logits_method``), within a memory budget (the packed copy doubles those
weights): ``OCTAVO_CPU_PACKED_LINEAR_MB`` (default 1024; ``0`` turns packing off). Not with
``OCTAVO_CPU_COMPILE=1`` (inductor would have to trace the opaque packed tensor). The packed copy follows the
weight it was made from: each call checks that ``layer.weight`` still lies in the same storage object (a weak
reference; ``LLM.sleep`` / ``wake_up`` and weight reloads replace it) and repacks otherwise.
"""

from __future__ import annotations

import logging
import os
import time
import weakref

import torch
import torch.nn.functional as F

from octavo.errors import ConfigError
from octavo.nn.linear import LinearBase, UnquantizedLinearMethod

logger = logging.getLogger(__name__)

BUDGET_ENV = "OCTAVO_CPU_PACKED_LINEAR_MB"
DEFAULT_BUDGET_MB = 1024


def available() -> bool:
    """Whether this torch build has the oneDNN packed-linear ops."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, n) for n in ("_reorder_linear_weight", "_linear_pointwise"))


class _Packed:
    """A weight's packed copy and the storage it was made from; when that storage is freed (``LLM.sleep(level=2)``,
    a reload), ``owner._packed`` is dropped with it, so sleeping frees the copy too."""

    def __init__(self, weight: torch.Tensor, rows_hint: int, owner=None) -> None:
        # AVX512-BF16 without AMX: cpu_bf16_gemm.py's kernel (oneDNN's bits, checked per shape); else oneDNN's pack
        self.gemm = _gemm_pack(weight, rows_hint)
        self.packed = None if self.gemm is not None else torch.ops.mkldnn._reorder_linear_weight(weight.detach(),
                                                                                                 rows_hint)
        me, holder = weakref.ref(self), weakref.ref(owner) if owner is not None else None

        def drop(_dead) -> None:
            o = holder() if holder is not None else None
            if o is not None and o._packed is not None and o._packed is me():
                o._packed = None

        self.storage = weakref.ref(weight.untyped_storage(), drop)
        self.key = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()))
        self.rows_hint = rows_hint

    def current(self, weight: torch.Tensor) -> bool:
        return (self.storage() is weight.untyped_storage()
                and self.key == (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride())))


_gemm_verified: dict[tuple[int, int], bool] = {}


def _gemm_pack(weight: torch.Tensor, rows_hint: int):
    """``weight`` packed for ``cpu_bf16_gemm`` where that kernel is wanted here and gives oneDNN's bits for this
    shape (checked once per shape against oneDNN's packed linear); else None."""
    try:
        from . import cpu_bf16_gemm as g  # relative, like the platform's other siblings
    except ImportError:  # a copy of this plugin without that sibling: oneDNN
        return None
    if not g.wanted():
        return None
    wp = g.pack(weight.detach())
    if wp is None:
        return None
    key = tuple(weight.shape)
    if key not in _gemm_verified:
        _gemm_verified[key] = g.same_bits_as_onednn(
            weight.detach(), torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint), wp)
        if not _gemm_verified[key]:
            logger.warning("bf16 GEMM kernel differs from oneDNN for a %s weight here: oneDNN kept (%s)", key,
                           g.SWITCH)
    return wp if _gemm_verified[key] else None


_linear_fn: list = []


def _gemm_linear():
    """``cpu_bf16_gemm.linear``, imported once (an import statement in ``packed_linear`` cost ~2 us a call)."""
    if not _linear_fn:
        from .cpu_bf16_gemm import linear

        _linear_fn.append(linear)
    return _linear_fn[0]


def _usable(weight: torch.Tensor) -> bool:
    return weight.dtype is torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2 and not weight.is_meta


class PackedLinearMethod(UnquantizedLinearMethod):
    """``UnquantizedLinearMethod`` whose bfloat16 CPU calls run on the packed weight (same bits as ``F.linear``);
    other inputs, and a weight that can no longer be packed, run ``F.linear``."""

    def __init__(self, weight: torch.Tensor, rows_hint: int) -> None:
        self._packed = _Packed(weight, rows_hint, self)

    def apply(self, layer, x, bias=None):
        return packed_linear(self, layer.weight, x, bias)


def packed_linear(owner, weight: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None,
                  out_f32: bool = False) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through ``owner._packed`` when ``x`` and ``weight`` are bfloat16 on the CPU;
    repacks when the weight was replaced since. ``out_f32``: the vdpbf16ps kernel may hand its bf16 results
    widened to float32 (the same values; other paths return bf16)."""
    if x.dtype is not torch.bfloat16 or x.device.type != "cpu" or (bias is not None and bias.dtype != x.dtype):
        return F.linear(x, weight, bias)
    p = owner._packed
    if p is None or not p.current(weight):
        if not _usable(weight):
            return F.linear(x, weight, bias)
        owner._packed = p = _Packed(weight, p.rows_hint if p is not None else 64, owner)
    if p.gemm is not None:
        out = _gemm_linear()(x, p.gemm, out_f32) if bias is None else None
        # a bias or a layout the kernel does not read: F.linear, the same bits as the packed call
        return out if out is not None else F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, p.packed, bias, "none", [], "")


class PackedLogitsMethod:
    """An LM head's ``logits_method`` (``ParallelLMHead.compute_logits``) over the packed head weight."""

    def __init__(self, weight: torch.Tensor, rows_hint: int) -> None:
        self._packed = _Packed(weight, rows_hint, self)

    def process_weights_after_loading(self, layer) -> None:
        self._packed = None  # repacked from the new weight on the next call

    def apply(self, layer, x, bias=None):
        # float32 logits straight from the kernel: compute_logits' .float() is then a no-op instead of a second
        # pass over the [rows, vocab] logits (~1 ms of a batch-64 bf16 decode step); the same values
        return packed_linear(self, layer.weight, x, bias, out_f32=True)


def budget_bytes() -> int:
    raw = os.environ.get(BUDGET_ENV, str(DEFAULT_BUDGET_MB))
    try:
        mb = int(raw)
    except ValueError:
        raise ConfigError(f"{BUDGET_ENV}={raw!r}: use a whole number of MiB (0 turns packing off)") from None
    if mb < 0:
        raise ConfigError(f"{BUDGET_ENV}={raw!r}: use a whole number of MiB >= 0 (0 turns packing off)")
    return mb * 2**20


def pack_dense_linears(model: torch.nn.Module, rows_hint: int = 64) -> dict[str, int]:
    """Install :class:`PackedLinearMethod` on ``model``'s dense bfloat16 CPU linears and a dense bfloat16 LM
    head (head first: the largest gain), until :func:`budget_bytes` is spent. Returns counts for the start-up
    log; an empty dict when packing is off, unavailable, or nothing qualifies."""
    budget = budget_bytes()
    if budget == 0 or os.environ.get("OCTAVO_CPU_COMPILE", "0") not in ("", "0") or not available():
        return {}
    heads = [m for m in model.modules() if hasattr(m, "logits_method") and m.logits_method is None
             and isinstance(getattr(m, "weight", None), torch.Tensor) and _usable(m.weight)]
    linears = [m for m in model.modules() if isinstance(m, LinearBase)
               and type(m.quant_method) is UnquantizedLinearMethod and _usable(m.weight)]
    used, counts = 0, {"linears": 0, "lm_head": 0, "bytes": 0}
    t0, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(1)  # reorders are small copies: 2 threads on a busy 2-CPU machine spent 5x on barriers
    try:
        for m in heads + linears:
            size = m.weight.numel() * m.weight.element_size()
            if used + size > budget:
                continue
            if m in heads:
                m.logits_method = PackedLogitsMethod(m.weight, rows_hint)
                counts["lm_head"] += 1
            else:
                m.quant_method = PackedLinearMethod(m.weight, rows_hint)
                counts["linears"] += 1
            used += size
    finally:
        torch.set_num_threads(threads)
    counts["bytes"] = used
    if used:
        logger.info("bfloat16 linears on packed oneDNN weights: %d linears, %d LM head(s), %.0f MiB in %.2f s (%s)",
                    counts["linears"], counts["lm_head"], used / 2**20, time.perf_counter() - t0, BUDGET_ENV)
    return counts if used else {}
