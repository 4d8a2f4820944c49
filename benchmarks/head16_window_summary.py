"""Condense benchmarks/head16_window.py's JSON (and head16.sh's nvidia-smi log beside it) into the lines that go into
docs/performance.md: per round the key's windows; per recorded generation of 257 / 513 tokens its first (prefill)
interval, the device's and the host's mean step per half, the device's waits for the host, the step-graph replays,
the time before the first and after the last step, and the card's SM clock / power / throttle reasons over it.

    python benchmarks/head16_window_summary.py win.json [smi_win.csv]
"""

from __future__ import annotations

import csv
import datetime
import json
import sys


def smi_rows(path: str) -> list[tuple[float, dict]]:
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f, skipinitialspace=True):
            try:
                ts = datetime.datetime.strptime(r["timestamp"], "%Y/%m/%d %H:%M:%S.%f").replace(
                    tzinfo=datetime.timezone.utc).timestamp()
            except (KeyError, ValueError):
                continue
            rows.append((ts, r))
    return rows


def span(smi: list, t0: float, t1: float) -> str:
    def num(v: str) -> float:
        return float(v.split()[0])

    inside = [r for ts, r in smi if t0 <= ts <= t1]
    if not inside:
        return ""
    def col(r: dict, *names: str) -> str:  # nvidia-smi names some columns differently from version to version
        return next((r[n] for n in names if n in r), "nan")

    sm = [num(col(r, "clocks.sm [MHz]", "clocks.current.sm [MHz]")) for r in inside]
    pw = [num(col(r, "power.draw [W]")) for r in inside]
    thr = sorted({col(r, "clocks_throttle_reasons.active", "clocks_event_reasons.active") for r in inside})
    return f" | smi n={len(inside)} sm {min(sm):.0f}-{max(sm):.0f} MHz, {min(pw):.0f}-{max(pw):.0f} W, throttle {thr}"


def gen_line(g: dict, smi: list) -> str:
    line = f"  {g['tokens']:4d} tok {g['s'] * 1e3:8.2f} ms"
    if "step_graph_replays" in g:
        line += f" step-graph {g['step_graph_replays']}"
    if g.get("to_first_return_ms") is not None:
        line += f" to_first {g['to_first_return_ms']:.2f} after_last {g['after_last_return_ms']:.2f}"
    if "prefill_launch_ms" in g:
        line += f" prefill launch {g['prefill_launch_start_ms']:.2f}+{g['prefill_launch_ms']:.2f}"
        if "prefill_device_end_ms" in g:
            line += f" dev end {g['prefill_device_end_ms']:.2f}"
    if "first_interval_ms" in g:
        line += f" first {g['first_interval_ms']:.2f} host halves {g['host_mean_ms_halves']}"
    if "device_mean_ms_halves" in g:
        line += (f" dev halves {g['device_mean_ms_halves']} dev_first {g['device_first_ms']:.2f} late "
                 f"{g['late_steps']} steps {g['late_ms_total']:.2f} ms ahead {g['host_ahead_ms_median']:.2f}"
                 f" slow {g['slow_device_steps']} gc {len(g.get('gc', []))}")
    if smi and "unix_end" in g:
        line += span(smi, g["unix_end"] - g["s"], g["unix_end"])
    return line


def main() -> None:
    res = json.load(open(sys.argv[1]))
    smi = smi_rows(sys.argv[2]) if len(sys.argv) > 2 else []
    print(res.get("card"), res.get("date"), "graph sizes", res.get("graph_sizes"), "step graph", res.get("step_graph"),
          "tokens equal", res.get("tokens_equal"))
    for rd in res["rounds"]:
        if "generations" not in rd:
            print(rd)
            continue
        print(f"round {rd['round']} {rd.get('label', 'recorded' if rd['recorded'] else 'plain')}: ms/token {rd['ms_per_token']:.4f} "
              f"windows {rd['ms_per_token_ctx_513_768']:.4f} / {rd['ms_per_token_ctx_769_1024']:.4f}")
        for g in rd["generations"]:
            print(gen_line(g, smi))
    for g in res.get("hot", []):
        print(f"after 2 s {g.get('before')}:", gen_line(g, smi))


if __name__ == "__main__":
    main()
