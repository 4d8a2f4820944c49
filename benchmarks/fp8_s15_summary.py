"""Summarize a benchmarks/fp8_bs1.py ``--ab s6`` record (bs1.json) by lever: each variant's captured forward, ms/token,
strict fraction, token check and the critical-path kernels the session-15 levers move; then per lever (a variant and
its ``_again`` repeats) the mean forward and its difference to the defaults' mean (the runs alternate, so the
defaults' spread is the noise to compare against).

    python benchmarks/fp8_s15_summary.py /path/to/fp89/bs1.json
"""

from __future__ import annotations

import json
import re
import sys

KERNELS = ("_rms_norm_quant_kernel", "_fp8_decode_one_kernel", "_rope_kernel", "_silu_and_mul_kernel", "o", "qkv",
           "down", "gate_up", "idle")


def lever(tag: str) -> str:
    """``nwf1_again2`` -> ``nwf1``; every ``default*`` -> ``default``."""
    return "default" if tag.startswith("default") else re.sub(r"_again\d*$", "", tag)


def main(path: str) -> None:
    with open(path) as f:
        res = json.load(f)
    print(f"card {res.get('card')}  copy {res.get('copy_bandwidth_TBps', 0):.3f} TB/s")
    rows = [(k, v) for k, v in res.items() if isinstance(v, dict) and "graph_forward_ms" in v]
    head = f"{'variant':22s} {'fwd ms':>7s} {'ms/tok':>7s} {'strict':>6s} tok " + " ".join(f"{k[:8]:>8s}" for k in KERNELS)
    print(head)
    groups: dict[str, list[float]] = {}
    for tag, v in rows:
        cp = v.get("critical_path_us") or {}
        cells = " ".join(f"{cp.get(k, float('nan')):8.1f}" for k in KERNELS)
        print(f"{tag:22s} {v['graph_forward_ms']:7.3f} {v['decode_ms_per_token']:7.3f} "
              f"{v['strict_fraction_of_roofline']:6.3f} {'=' if v.get('same_tokens_as_first_measure') else 'X':>3s} {cells}")
        groups.setdefault(lever(tag), []).append(v["graph_forward_ms"])
    for tag, v in res.items():
        if isinstance(v, dict) and ("error" in v or "skipped" in v):
            print(f"{tag:22s} {v}")
    base = groups.get("default", [])
    if not base:
        return
    b = sum(base) / len(base)
    print(f"\ndefault forward {b:.3f} ms (n={len(base)}, spread {max(base) - min(base):.3f})")
    for name, vals in sorted(groups.items(), key=lambda kv: sum(kv[1]) / len(kv[1])):
        m = sum(vals) / len(vals)
        print(f"{name:22s} n={len(vals)} mean {m:.3f} ms  {1e3 * (m - b):+7.1f} us vs default  "
              f"range {min(vals):.3f}-{max(vals):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
