"""The one-row fp8 GEMV's measured tiles per card and weight shape (fp8_gemv.py launches them instead of autotuning).

Why: the autotuner times each tile on a lone kernel with its first call's flags and no neighbours, while the
captured batch-1 forward runs every GEMV under programmatic dependent launch right after its producer; the tile
that wins alone need not win there. benchmarks/fp8_bs1_tiles.py sweeps the tiles in the recaptured graph
(``sweep_table``: tile and loop depth per shape, as this card's rows).

Keyed by the card's name (``torch.cuda.get_device_name()``): the rows were measured on that card and are used on it
only. A card with no row for a shape (another GPU, another model's shape) keeps the autotuner's tile and one weight
block a loop trip.
"""

from __future__ import annotations

import functools

import torch

from octavo.env_flags import env_switch

#: the split-accumulator one-row GEMV's tile per card and weight shape, chosen in the captured forward instead of by
#: the autotuner's lone-kernel timing (which runs with its first call's flags and no neighbours, while the graph runs
#: every GEMV under PDL right after its producer). Session 11 batch 1, H100, 8B fp8 bs1 in one engine
#: (benchmarks/fp8_bs1_tiles.py sweep: one shape's tile at a time in the recaptured graph, 2 rounds). That run's
#: autotuner had, for the inputs the graph gives them, qkv (e4m3 from the norm) 8x1024 w4 s4, o 8x1024 w4 s4, gate_up
#: (e4m3) 4x1024 w4 s3, down 4x1024 w4 s3; the sweep's best: qkv 4x1024 (-5 us a forward), o 16x1024 w8 (-6), gate_up
#: as tuned, down 16x1024 w8 (-29). All four pinned: the captured forward 3.060 / 3.064 -> 3.023 / 3.024 ms,
#: 3.469 -> 3.398 / 3.378 ms/token, greedy tokens equal (docs/performance.md "FP8 session 11"). One tile per shape
#: serves both input kinds (bf16 or the norm's e4m3). ``OCTAVO_FP8_GEMV_TABLE=0`` (or ``TABLE_ON = False``) keeps the
#: autotuner's choice.
#: Session 17 (engineer fp817), one NVIDIA H200, 8B fp8 bs1 in one engine (fp89.sh s17h: sweep_table from the H100
#: rows, each shape's tile x {1, 2} blocks a trip in the recaptured graph, 2 rounds; then alternating x3): the
#: autotuner's tiles (qkv / gate_up on 16x512 for the norm's e4m3 input) 2.455-2.464 ms a captured forward, the H100
#: rows 2.333-2.336, these rows 2.321-2.324 (ms/token 2.686-2.734 -> 2.505-2.565, strict 0.694-0.707 -> 0.740-0.758).
#: The autotuner's 512-wide blocks sum in another fp32 order, so its greedy tokens differ from the table's on random
#: weights (docs/performance.md "FP8 session 17").
TILES: dict[tuple[str, int, int], tuple[int, int, int, int]] = {  # (card, N, K) -> (BLOCK_N, BLOCK_K, warps, stages)
    ("NVIDIA H100 80GB HBM3", 6144, 4096): (4, 1024, 4, 3),
    ("NVIDIA H100 80GB HBM3", 4096, 4096): (16, 1024, 8, 3),
    ("NVIDIA H100 80GB HBM3", 28672, 4096): (4, 1024, 4, 3),
    ("NVIDIA H100 80GB HBM3", 4096, 14336): (16, 1024, 8, 3),
    ("NVIDIA H200", 6144, 4096): (8, 1024, 4, 4),
    ("NVIDIA H200", 4096, 4096): (8, 1024, 8, 3),
    ("NVIDIA H200", 28672, 4096): (8, 1024, 2, 3),
    ("NVIDIA H200", 4096, 14336): (8, 1024, 4, 4),
}
#: the main loop's weight blocks a trip (fp8_gemv's ``LOOP2``; the same bits) per card and shape, with the table's
#: tile. Session 12 batch 1, H100, 8B fp8 bs1 in one engine, alternating: two blocks a trip for all four GEMVs took the
#: captured forward 3.018 / 3.025 / 3.023 -> 3.006 / 3.009 ms; its per-kernel critical path: down 757 -> 712 us and
#: o 252 -> 230 us a forward (the 16x1024 8-warp tile holds 155 registers: one program an SM, one 16 KB block in flight
#: without it), qkv 250 -> 288 and gate_up 1215 -> 1227 (their 4x1024 tile already runs six programs an SM), so only
#: o and down take it. Four blocks a trip lost everywhere (3.26 ms). docs/performance.md "FP8 session 12"
LOOPS: dict[tuple[str, int, int], int] = {
    ("NVIDIA H100 80GB HBM3", 4096, 4096): 2,
    ("NVIDIA H100 80GB HBM3", 4096, 14336): 2,
    ("NVIDIA H200", 4096, 4096): 2,  # session 17's sweep (above): two blocks a trip for o_proj and down here too
    ("NVIDIA H200", 4096, 14336): 2,
}
TABLE_ON = env_switch("OCTAVO_FP8_GEMV_TABLE", default=True)


@functools.lru_cache(maxsize=8)
def _card(index: int) -> str:
    return torch.cuda.get_device_name(index)


def table_tile(device: torch.device, n: int, k: int, split: int) -> tuple[int, int, int, int] | None:
    """The measured tile for this card and ``[n, k]`` weight (split accumulator only), or None (autotune)."""
    if not TABLE_ON or not split or device.type != "cuda":
        return None
    return TILES.get((_card(device.index if device.index is not None else torch.cuda.current_device()), n, k))



def table_loop(device: torch.device, n: int, k: int) -> int:
    """The main loop's weight blocks a trip for the table's tile on this card and ``[n, k]`` weight (0: one)."""
    if not TABLE_ON or device.type != "cuda":
        return 0
    return LOOPS.get((_card(device.index if device.index is not None else torch.cuda.current_device()), n, k), 0)
