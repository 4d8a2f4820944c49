"""Summarize a benchmarks/head16_ab.py record by variant: ms/token (each measure, mean), the strict fraction of the
mean, the graph alone, outside it, and from the traces the step's GPU busy / idle and the ops outside the body graph.

    python benchmarks/head16_summary.py /work/team/gpu_results/s16/c1/.../head16/ab.json
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.head16_ab import base_name  # noqa: E402


def main(path: str) -> None:
    with open(path) as f:
        res = json.load(f)
    strict = res.get("strict_roofline_ms", {}).get("513_768")
    print(res.get("card"), "copy", round(res.get("copy_bandwidth_TBps", 0), 3), "TB/s; strict roofline", strict, "ms;",
          "load", round(res.get("load_s", 0), 1), "s;", "head tiles", json.dumps(res.get("head_tiles", {}))[:300])
    rows: dict = {}
    for tag, r in res.items():
        if isinstance(r, dict) and "ms_per_token" in r:
            rows.setdefault(base_name(tag), []).append((tag, r))
    for base, runs in rows.items():
        ms = [r["ms_per_token"] for _, r in runs]
        mean = sum(ms) / len(ms)
        g = [r.get("graph_forward_ms") for _, r in runs if r.get("graph_forward_ms")]
        line = f"{base:12s} n={len(ms)} ms/token {', '.join(f'{m:.4f}' for m in ms)} mean {mean:.4f}"
        if strict:
            line += f" strict {strict / mean:.4f}"
        if g:
            line += f" graph {min(g):.4f}-{max(g):.4f}"
        line += " tokens equal" if all(r.get("tokens_equal_first") for _, r in runs) else " TOKENS DIFFER"
        print(line)
        for tag, r in runs:
            late = r.get("ms_per_token_769_1024")
            extra = f" 769-1024 {late:.4f} (513-1024 {r['ms_per_token_513_1024']:.4f})" if late else ""
            for key in ("trace", "trace_ctx897"):
                t = r.get(key)
                if isinstance(t, dict) and "step_us" in t:
                    ops = ", ".join(f"{k[:28]} {v['n']}x{v['us']}" for k, v in list(t["outside_graph_ops"].items())[:8])
                    print(f"   {tag} {key}: step {t['step_us']} busy {t['busy_us']} idle {t['idle_us']} outside "
                          f"{t['outside_graph_op_us']} us [{ops}]{extra}")
                    extra = ""


if __name__ == "__main__":
    main(sys.argv[1])
