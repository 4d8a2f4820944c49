"""One line per A/B of benchmarks/structured_knob_ab.py --pair records (session 16): the paired ratio, its spread,
the medians, whether tokens matched, and the share of steps the chained fill took (core/grammar_chain.py).

    python benchmarks/structured_pairs_summary.py RECORD.json [...]
"""

from __future__ import annotations

import json
import sys


def records(paths: list[str]):
    """Each readable JSON record of ``paths`` after its header line (path, device, load before -> after); an
    unreadable one is said and skipped. Also benchmarks/structured_rotate_summary.py's loader."""
    for path in paths:
        try:
            rec = json.load(open(path))
        except (OSError, ValueError) as e:
            print(f"{path}: not read ({e})")
            continue
        print(f"{path} ({rec.get('device')}, load {rec.get('loadavg_start')} -> {rec.get('loadavg_end')})")
        yield rec


def main() -> None:
    for rec in records(sys.argv[1:]):
        pairs = {rec.get("knob", "ab"): rec} if "values" in rec else rec  # (one A/B: the session-15 layout)
        for label, res in pairs.items():
            if not isinstance(res, dict) or "values" not in res:
                continue
            for key, b in res.items():
                if not key.startswith("batch_"):
                    continue
                frac = b["B_host_ms_per_step"].get("chained_frac")
                print(f"  {label:11s} {key}: A {b['A_ms_per_step']:.3f} B {b['B_ms_per_step']:.3f} ms, B vs A "
                      f"{b['B_vs_A_pct_median_of_round_ratios']:+.2f} % (p25..p75 {b['B_vs_A_pct_round_p25_p75']}), "
                      f"tokens equal {b['tokens_equal']}, chained {frac if frac is None else round(frac, 3)}")


if __name__ == "__main__":
    main()
