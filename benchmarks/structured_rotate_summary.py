"""The lines that matter of benchmarks/structured_rotate.py records (session 16): each mode's ms per step, each mode
against ``free`` and ``json`` (median of round ratios, p25..p75), tokens equal, and the host keys that tell the
modes apart (the core thread's accept / release, the runner's apply, the device's idle time in its wait).

    python benchmarks/structured_rotate_summary.py RECORD.json [...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling module below, run as a script
from structured_pairs_summary import records  # noqa: E402

KEYS = ("prepare", "accept", "release", "fill", "apply", "device_wait", "chained_frac", "graph_replays",
        "graph_lean_replays", "graph_direct", "graph_lean_sets")


def main() -> None:
    for rec in records(sys.argv[1:]):
        for key, b in rec.items():
            if not key.startswith("batch_"):
                continue
            print(f"  {key}: {b['rounds']} rounds, tokens equal {b['tokens_equal']}")
            for mode, ms in b["ms_per_step"].items():
                vs = [f"vs {base} {b['pairs'][f'{mode}_vs_{base}']['pct_median']:+.2f} % "
                      f"{b['pairs'][f'{mode}_vs_{base}']['p25_p75']}"
                      for base in ("free", "json", "chain") if f"{mode}_vs_{base}" in b["pairs"]]
                host = b["host_ms_per_step"].get(mode, {})
                keys = " ".join(f"{k} {host[k]:.3f}" for k in KEYS if k in host)
                print(f"    {mode:14s} {ms:.3f} ms  {'; '.join(vs)}  [{keys}]")
                th = " ".join(f"{k} {v:.3f}" for k, v in host.items() if k.startswith(("cpu:", "rq:", "sec:")))
                if th:
                    print(f"    {'':14s} threads, ms a step: {th}")


if __name__ == "__main__":
    main()
