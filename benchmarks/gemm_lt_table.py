"""``cuda_gemm_lt.LT_TABLE`` entries from ``benchmarks/gemm_lt_bench.py`` records (issue 17; session 12, engineer tput).

Per (shape, rows): the fastest candidate that gave the same bits twice and stayed within two bf16 rounding steps of
``F.linear`` (``cuda_gemm.first_use_ok``'s bound), taken only where it beats the route the engine runs today
(cuBLAS, or cuBLASLt's pick where ``cuda_gemm.BLAS_TABLE`` says so) by at least ``--margin``. Prints the table
literal and the us a layer each entry saves.

    python benchmarks/gemm_lt_table.py gemm_lt.json [more.json ...] [--margin 0.03]
"""

from __future__ import annotations

import argparse
import json
import sys


def entries(records: list[dict], margin: float) -> tuple[dict, list[dict]]:
    from octavo.plugins.platforms.cuda_gemm import blas_library

    table: dict = {}
    notes = []
    for rec in records:
        for row in rec["cases"]:
            n, k, m = row["N"], row["K"], row["rows"]
            today = row["cublaslt_us"] if blas_library(m, n, k) == "cublaslt" else row["cublas_us"]
            ok = [c for c in row["candidates"]
                  if "us" in c and c.get("deterministic") and c.get("rel_diff", 1.0) <= 1.6e-2]
            if not ok:
                continue
            best = min(ok, key=lambda c: c["us"])
            gain = 1 - best["us"] / today
            notes.append({"shape": row["shape"], "rows": m, "today_us": today, "best_us": best["us"],
                          "gain": round(gain, 3), "index": best["index"], "taken": gain >= margin})
            if gain >= margin:
                table.setdefault((rec["card"], n, k), {})[m] = best["config"]
    return table, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+")
    ap.add_argument("--margin", type=float, default=0.03)
    args = ap.parse_args()
    records = []
    for path in args.records:
        with open(path) as f:
            records.append(json.load(f))
    table, notes = entries(records, args.margin)
    for note in sorted(notes, key=lambda d: (d["shape"], d["rows"])):
        print(json.dumps(note), file=sys.stderr)
    print("LT_TABLE = {")
    for (card, n, k), sizes in sorted(table.items()):
        print(f"    ({card!r}, {n}, {k}): {{")
        for m in sorted(sizes):
            print(f"        {m}: {sizes[m]!r},")
        print("    },")
    print("}")


if __name__ == "__main__":
    main()
