"""Fixed launch configs for the batch-1 GEMV (``cuda_fusions.gemv``) per weight shape and GPU, measured in a decode
graph rather than picked by the autotuner (issue 12, tensor-parallel decode; ``OCTAVO_GEMV_TABLE=0`` turns it off).

Why: the autotuner times each tile alone, L2 flushed and without programmatic dependent launch; in a decode graph
the GEMV starts under PDL while its predecessor runs and loads its first tile early, so the tile that is fastest
alone is not always fastest there. At TP=2 the halved 8B GEMVs (``o_proj`` 4096 x 2048, ``qkv`` 3072 x 4096,
``down`` 4096 x 7168) ran at 2.2-2.5 TB/s against 2.55-2.64 at TP=1 (session 7 kernel tables).
benchmarks/gpu_tp_gemv.py sweeps tiles per shape inside a PDL chain on the real layer weights and A/Bs the best
in the live engine (re-captured graphs); what won goes into :data:`TABLE`.

A table entry replaces the autotuner for that shape only (the plain GEMV and the row-parallel pushing GEMV of
cuda_allreduce_gemv.py both read it, so their tiles and sums stay equal); shapes not in the table are tuned as
before. Keyed by compute capability: entries were measured on H100 (sm_90) and are used on any sm_90 card.
"""

from __future__ import annotations

import torch

from octavo.env_flags import env_switch

# (capability "major.minor", N, K) -> (BLOCK_N, BLOCK_K, num_warps, num_stages); bias-free 16-bit weights.
TABLE: dict[tuple[str, int, int], tuple[int, int, int, int]] = {}

_STATE: dict = {"on": env_switch("OCTAVO_GEMV_TABLE", default=True), "override": {}, "cap": {}}


def set_override(entries: dict[tuple[int, int], tuple[int, int, int, int]] | None) -> None:
    """Benchmarks: use these ``(N, K) -> tile`` entries (any GPU) before :data:`TABLE`; ``None``/``{}`` clears.
    Graphs captured afterwards use them."""
    _STATE["override"] = dict(entries or {})


def set_table(on: bool) -> None:
    """Use :data:`TABLE` from now on, or not (the autotuner for every shape)."""
    _STATE["on"] = bool(on)


def _capability(device: torch.device) -> str:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _STATE["cap"]:
        major, minor = torch.cuda.get_device_capability(idx)
        _STATE["cap"][idx] = f"{major}.{minor}"
    return _STATE["cap"][idx]


def lookup(N: int, K: int, device: torch.device) -> dict | None:
    """The fixed launch config for a bias-free ``[N, K]`` weight on ``device`` (``BLOCK_N``, ``BLOCK_K``,
    ``num_warps``, ``num_stages``) or None (the autotuner decides). A tile that does not divide a shape the kernel
    runs unmasked (``EVEN``: ``K % 1024 == 0 and N % 64 == 0``) is refused with an error naming both."""
    tile = _STATE["override"].get((N, K))
    if tile is None and _STATE["on"] and TABLE and device.type == "cuda" and torch.cuda.is_available():
        tile = TABLE.get((_capability(device), N, K))
    if tile is None:
        return None
    bn, bk, warps, stages = tile
    if K % 1024 == 0 and N % 64 == 0 and (K % bk or N % bn):  # the kernel's unmasked EVEN path
        raise ValueError(f"GEMV table tile {tile} does not divide the weight shape {(N, K)}")
    return {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}
