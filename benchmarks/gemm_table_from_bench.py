"""``cuda_gemm.TABLE`` entries from a ``gemm_triton_bench.py`` record: per weight shape, each measured row count
takes its fastest float64-checked config when it beats cuBLAS by ``--min-speedup`` (else cuBLAS, ``None``), and
covers the rows above the next smaller measured count up to itself; rows above the largest measured count stay
on cuBLAS. Prints the Python literal to paste (decisions stay reviewable in the diff).

    python benchmarks/gemm_table_from_bench.py gemm_triton.json [--min-speedup 1.05] [--min-rows 2]
"""

from __future__ import annotations

import argparse
import json
import re

NAME = re.compile(r"(\d+)x(\d+)x(\d+)_s(\d+)_w(\d+)_st(\d+)(_tma)?$")


def table(record: dict, min_speedup: float, kind: str = "") -> dict:
    """``kind`` "": the plain GEMM (cuda_gemm.TABLE); "silu": gate/up + SiLU-and-mul (cuda_gemm_silu.TABLE)."""
    best, speed = ("silu_best", "silu_speedup") if kind == "silu" else ("best", "speedup_vs_cublas")
    by_shape: dict = {}
    for c in record["cases"]:
        if best not in c:
            continue
        win = c[best] if c[speed] >= min_speedup else None
        by_shape.setdefault((c["N"], c["K"], c["shape"]), []).append((c["rows"], win, c[speed]))
    return {k: sorted(v) for k, v in by_shape.items()}


def literal(name: str | None) -> str:
    if name is None:
        return "None"
    bm, bn, bk, s, w, st, tma = NAME.match(name).groups()
    return f"GemmConfig({bm}, {bn}, {bk}, {s}, {w}, {st}{', True' if tma else ''})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("record")
    ap.add_argument("--min-speedup", type=float, default=1.05)
    args = ap.parse_args()
    with open(args.record) as f:
        rec = json.load(f)
    for kind, title in (("", "cuda_gemm.TABLE"), ("silu", "cuda_gemm_silu.TABLE (vs cuBLAS + SiLU-and-mul)")):
        print(f"# {title}\nTABLE = {{")
        for (n, k, shape), rows in table(rec, args.min_speedup, kind).items():
            entries = ", ".join(f"({r}, {literal(w)})" for r, w, _ in rows)
            speed = ", ".join(f"{r}: {sp:.2f}x" for r, _, sp in rows)
            print(f"    ({n}, {k}): [{entries}],  # {shape}: {speed} vs cuBLAS")
        print("}")


if __name__ == "__main__":
    main()
