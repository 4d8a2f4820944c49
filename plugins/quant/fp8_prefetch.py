"""Batch-1 fp8 decode: keep HBM busy between the one-row GEMVs (L2 prefetch of the next weight, PDL).

Why: at one row the 8B forward is 128 weight-streaming GEMVs with ~7 small kernels in between per layer (rotary,
KV write, attention, merge, norms, SiLU; ~0.66 ms of 3.37 per forward on H100, docs/performance.md "FP8 session
5"). While those run, the memory system is idle; the GEMV after them then pays its ramp (launch, first loads)
from a cold start. Two measures, both hints that cannot change a result:

- **L2 prefetch chain** (``OCTAVO_FP8_GEMV_PREFETCH_MB``, MiB per link; 0 = off): the fp8 linears' forward order
  is recorded in the one discovery forward of fp8_fused.link_fp8_inputs; each one-row GEMV then ends with its
  last programs issuing ``cp.async.bulk.prefetch.L2`` for the first MiB of the NEXT linear's weight (qkv ->
  o_proj across rotary / KV write / attention; o_proj -> gate_up across the norm; down -> the next layer's
  qkv). Nothing waits for a prefetch; the next GEMV finds its first tiles in L2 (H100: 50 MB).
- **Programmatic dependent launch** (``OCTAVO_FP8_GEMV_PDL=1``, or ``OCTAVO_PDL=1``): the GEMV is
  launched while its producer runs and waits in the kernel (``griddepcontrol.wait``) before it reads the
  activations; the quantizing RMSNorm (fp8_fused.py) lets it launch at its start (``launch_dependents``).
  Everything the GEMV reads before the wait is a constant (weight scales).

- **Own rows first** (``OCTAVO_FP8_GEMV_SELF_PREFETCH=1``): each GEMV program starts with one bulk L2 request per
  weight row it owns, before reading the activations (or, under PDL, before waiting for its producer): its slice
  streams at full memory-level parallelism from the start instead of at the depth of the load pipeline.

Measured on H100 (session 6 batch 1, docs/performance.md "FP8 session 6"): all three made batch 1 slower or no
faster (chain 0.811 -> 0.785 of the roofline, self-prefetch 0.59, PDL with the chain flat). The chain and the
self-prefetch stay off, switches for other cards and kernels. PDL with the first weight block read before the
wait (``OCTAVO_FP8_GEMV_PDL_W``, its dependents let in after the wait) won in session 10 (H100: captured forward
3.156 -> 3.055 ms, -3.2 %): PDL and PDL_W are on by default.

All need sm_90 (Hopper) and the compiled one-row CUDA-core GEMV; elsewhere they are not used (the GEMV runs as
before). Tests: tests/quant/test_fp8_prefetch.py (the PTX holds the instructions; on a GPU: bit-identical
outputs with and without, eager and replayed from a CUDA graph).
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from octavo.env_flags import env_switch


def _prefetch_mb() -> int:
    raw = os.environ.get("OCTAVO_FP8_GEMV_PREFETCH_MB", "").strip()
    if not raw:
        return DEFAULT_PREFETCH_MB
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"OCTAVO_FP8_GEMV_PREFETCH_MB={raw!r} is not an integer (MiB per link; 0 = off)") from None
    if not 0 <= value <= 48:
        raise ValueError(f"OCTAVO_FP8_GEMV_PREFETCH_MB={value}: 0 (off) to 48 MiB (L2 is 50 MB on H100)")
    return value


DEFAULT_PREFETCH_MB = 0  # off: slower on H100 (docs/performance.md, "FP8 session 6")
PREFETCH_MB = _prefetch_mb()  # read at apply time: a benchmark may change it and recapture
# on by default since session 10 (with PDL_W: H100, one engine, alternating, same tokens: batch-1 fp8 decode
# 3.579 / 3.555 -> 3.386 / 3.441 ms/token, captured forward 3.156 -> 3.055 ms; PDL alone 3.508, graph 3.095;
# docs/performance.md "FP8 session 10"). OCTAVO_PDL=0 (plugins/platforms/cuda_pdl.py) turns it off with the rest
PDL = env_switch("OCTAVO_FP8_GEMV_PDL", default=env_switch("OCTAVO_PDL", default=True))
SELF_PREFETCH = env_switch("OCTAVO_FP8_GEMV_SELF_PREFETCH", default=False)  # each program's own rows first
# with PDL: the GEMV reads its first weight block before it waits and lets its dependents launch after the wait
# (fp8_gemv's ``pdl_w``; bit-identical). On by default since session 10 (above)
PDL_W = env_switch("OCTAVO_FP8_GEMV_PDL_W", default=True)


def _pdl_w_blocks() -> int:
    raw = os.environ.get("OCTAVO_FP8_GEMV_PDL_W_BLOCKS", "").strip() or "1"
    if raw not in ("1", "2", "3", "4"):
        raise ValueError(f"OCTAVO_FP8_GEMV_PDL_W_BLOCKS={raw!r}: 1-4 weight blocks read before the PDL wait")
    return int(raw)


# how many weight blocks (1024 columns each) the GEMV reads before its wait with PDL_W: the resident programs
# stream them while the producer (norm, attention, SiLU) runs. PDL_W_BY_SHAPE {(N, K): blocks} overrides it per
# weight shape (benchmarks/fp8_bs1.py's A/B)
PDL_W_BLOCKS = _pdl_w_blocks()
PDL_W_BY_SHAPE: dict[tuple[int, int], int] = {}


@lru_cache(maxsize=8)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def hopper(device: torch.device) -> bool:
    """sm_90+ (``cp.async.bulk.prefetch`` and ``griddepcontrol``); False off CUDA."""
    return device.type == "cuda" and _hopper(device.index if device.index is not None else torch.cuda.current_device())


def gemv_launch(method, device: torch.device, shape: tuple[int, int] | None = None) -> dict:
    """``fp8_gemv`` keyword arguments for one row of ``method``'s layer: ``prefetch`` (the next fp8 linear's
    weight, PREFETCH_MB MiB), ``pdl`` and ``pdl_w`` (blocks before the wait; ``shape`` = the weight's ``(N, K)``
    for PDL_W_BY_SHAPE), where this device can run them; ``{}`` otherwise."""
    if not hopper(device) or os.environ.get("TRITON_INTERPRET") == "1":
        return {}
    out = {}
    nxt = getattr(method, "pf_next", None)
    if nxt is not None and PREFETCH_MB > 0:
        out["prefetch"] = (nxt, PREFETCH_MB << 20)
    if PDL:
        out["pdl"] = True
        if PDL_W:
            out["pdl_w"] = PDL_W_BY_SHAPE.get(tuple(shape), PDL_W_BLOCKS) if shape is not None else PDL_W_BLOCKS
    if SELF_PREFETCH:
        out["self_prefetch"] = True
    return out


def link_chain(order: list) -> int:
    """Give each fp8 linear of ``order`` (forward order) the next one's weight to prefetch; returns the links."""
    seen, layers = set(), []
    for layer in order:
        if id(layer) not in seen:
            seen.add(id(layer))
            layers.append(layer)
    for a, b in zip(layers, layers[1:]):
        a.quant_method.pf_next = b.weight
    return max(0, len(layers) - 1)
