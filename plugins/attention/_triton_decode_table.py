"""Which launch the ``triton`` backend uses for decode rows, per cache kind and shape: a committed table of
measured configs for the decode kernel (``_triton_decode.paged_decode``), and the rule for shapes it lacks.

Why a table: decode of hundreds of requests is bound by reading the KV cache, and the best tile (``block_n``),
warps, pipeline stages and request order depend on the GQA group and head size (measured on H100 with
``benchmarks/decode_attn_bench.py``; docs/performance.md "Decode attention launch table"). A 16-bit cache takes
the decode kernel only for the shapes listed (other shapes are unmeasured and keep the general kernel,
``_triton_kernels``); an fp8 cache always takes it (1.34x the general kernel on H100, session 4). ``ordered`` runs the requests
longest context first (``_triton_decode.longest_first``), which shortens the last wave of programs.

Not in any default (measured no faster, kept for A/B runs): ``chunk`` (split-KV with a merge kernel; the grid
is sized for ``max_model_len`` under CUDA graphs) and ``write_kv`` (the step's K/V stored by the decode launch
instead of a separate 1.6 µs write launch: equal within noise).

``OCTAVO_TRITON_DECODE_LAUNCH`` (for A/B measurements) replaces the looked-up launch, e.g.
``block_n=128,warps=4,stages=2,ordered=1`` (optionally ``,chunk=512,write_kv=1``); every key must be given and valid,
or it is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeLaunch:
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    ordered: bool = False
    chunk: int = 0  # > 0: split contexts into chunks of this many keys (merged by a second kernel)
    write_kv: bool = False  # decode-only steps: the decode kernel stores the step's K/V (no write launch)


# (cache kind, GQA group, padded head size) -> launch. Kinds: "16bit" (bf16/fp16 cache), "fp8".
# Session 6 batch 1 (H100 80GB HBM3, read rate 3.02 TB/s; docs/performance.md "Decode attention launch table"),
# one layer at the served batch and context range, CUDA-graph medians, KV bytes read per second:
TABLE: dict[tuple[str, int, int], DecodeLaunch] = {
    # Qwen3-0.6B (16 q / 8 kv heads, 128), batch 139, contexts 100-1600: general kernel 2.59 TB/s, this 2.93
    # (1.13x; unordered 2.76, BLOCK_N 64 ordered 2.91, 3 stages 2.94, 8 warps 2.84, chunk 512/1024 2.67/2.80)
    ("16bit", 2, 128): DecodeLaunch(block_n=128, num_warps=4, num_stages=2, ordered=True),
    # Llama-3-8B (32 / 8, 128), batch 220, contexts 1000-2000: general kernel 2.81 TB/s, this 2.99 (1.06x;
    # unordered 2.97, BLOCK_N 64 2.93, chunk 512 2.72)
    ("16bit", 4, 128): DecodeLaunch(block_n=128, num_warps=4, num_stages=2, ordered=True),
    # Llama-3-8B with an e4m3 cache, batch 420: the fp8 default (BLOCK_N 64) 2.32 TB/s, this 2.45 (1.056x;
    # BLOCK_N 64 ordered 2.38, 8 warps 2.00, chunk 512 2.04)
    ("fp8", 4, 128): DecodeLaunch(block_n=128, num_warps=4, num_stages=2, ordered=True),
}
#: an fp8 cache's launch for shapes not in the table (session 4's measured default)
FP8_DEFAULT = DecodeLaunch(block_n=64, num_warps=4, num_stages=2, ordered=False)
#: ``OCTAVO_TRITON_DECODE_KERNEL=1`` on a 16-bit shape not in the table
FORCED_DEFAULT = DecodeLaunch()

_KEYS = {"block_n": (16, 32, 64, 128, 256), "warps": (1, 2, 4, 8), "stages": (1, 2, 3, 4, 5), "ordered": (0, 1),
         "chunk": (0, 256, 512, 1024, 2048), "write_kv": (0, 1)}
_OPTIONAL = {"chunk": 0, "write_kv": 0}


def _from_env(raw: str) -> DecodeLaunch:
    got: dict[str, int] = {}
    for part in raw.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in _KEYS or not value.strip().isdigit() or int(value) not in _KEYS[name] or name in got:
            raise ValueError(f"OCTAVO_TRITON_DECODE_LAUNCH={raw!r}: expected each of "
                             + ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in _KEYS.items())
                             + " once (chunk and write_kv may be left out: 0)")
        got[name] = int(value)
    got = {**_OPTIONAL, **got}
    if set(got) != set(_KEYS):
        raise ValueError(f"OCTAVO_TRITON_DECODE_LAUNCH={raw!r}: missing {sorted(set(_KEYS) - set(got))}")
    if got["chunk"] % got["block_n"]:
        raise ValueError(f"OCTAVO_TRITON_DECODE_LAUNCH={raw!r}: chunk must be a multiple of block_n")
    return DecodeLaunch(got["block_n"], got["warps"], got["stages"], bool(got["ordered"]), got["chunk"],
                        bool(got["write_kv"]))


def decode_launch(kind: str, group: int, head_dp: int, forced: bool = False) -> DecodeLaunch | None:
    """The decode kernel's launch for this shape, or None: the general kernel (16-bit shapes not in the table,
    float32 caches). ``forced``: ``OCTAVO_TRITON_DECODE_KERNEL=1`` (a launch for every cache kind)."""
    raw = os.environ.get("OCTAVO_TRITON_DECODE_LAUNCH", "").strip()
    if raw:
        return _from_env(raw)
    hit = TABLE.get((kind, group, head_dp))
    if hit is not None:
        return hit
    if kind == "fp8":
        return FP8_DEFAULT
    return FORCED_DEFAULT if forced else None
