"""CPU seconds per output token of `octavo serve` at C=1, front end and engine core apart (issue 18's C=1 TPOT).

Why: at C=1 the core's step is the token's critical path, and whatever the front end spends per token (zmq
receive, output processing, detokenizing, the SSE chunk, the HTTP write) runs on the CPU that a 2-thread core's
second OpenMP thread needs. CPU seconds, unlike wall time, hold up on a shared machine. Method: one streamed
completion at a time, short (16 tokens) and long (``--tokens``) requests alternating; the per-token cost is the
difference of the two (minimum over rounds) over the extra tokens, so per-request costs (HTTP request, prompt,
first step) cancel. Also prints the inter-token latency (ITL) median of the long requests.

    python benchmarks/serve_token_cost.py [--tokens 200] [--rounds 3] [-- extra `octavo serve` flags]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import httpx
import psutil

from octavo.server.launch import ServerProcess


def cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the front end (``pid``) and of its children together (the engine core)."""
    root = psutil.Process(pid)
    t = root.cpu_times()
    out = {"front_end": t.user + t.system, "core": 0.0}
    for c in root.children(recursive=True):
        tc = c.cpu_times()
        out["core"] += tc.user + tc.system
    return out


def stream(url: str, n: int) -> list[float]:
    """One streamed completion of ``n`` tokens (fixed 128-token prompt); arrival times of its data chunks."""
    body = {"prompt": list(range(1000, 1128)), "max_tokens": n, "ignore_eos": True, "stream": True, "temperature": 0}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                times.append(time.perf_counter())
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="write the JSON here too")
    p.add_argument("serve_args", nargs="*", help="extra `octavo serve` flags (after --)")
    args = p.parse_args()
    srv = ServerProcess(["--max-model-len", "1024", "--uvicorn-log-level", "warning", *args.serve_args])
    srv.start()
    rows: dict[int, list[dict]] = {16: [], args.tokens: []}
    try:
        for _ in range(2):
            stream(srv.url, 8)  # warm-up (and the thread governor's first probes)
        for _ in range(args.rounds):
            for n in rows:
                c0, w0 = cpu(srv.proc.pid), time.perf_counter()
                ts = stream(srv.url, n)
                c1, wall = cpu(srv.proc.pid), time.perf_counter() - w0
                itl = [(b - a) * 1e3 for a, b in zip(ts[1:], ts[2:])]
                rows[n].append({"front_end_s": c1["front_end"] - c0["front_end"], "core_s": c1["core"] - c0["core"],
                                "wall_s": wall, "itl_p50_ms": statistics.median(itl) if itl else None})
    finally:
        srv.stop()
    extra = args.tokens - 16
    per_token = {k: round((min(r[k] for r in rows[args.tokens]) - min(r[k] for r in rows[16])) / extra * 1e3, 3)
                 for k in ("front_end_s", "core_s", "wall_s")}
    result = {"serve_args": args.serve_args, "tokens": args.tokens, "rounds": args.rounds,
              "load_avg": os.getloadavg(), "per_token_ms": per_token,
              "itl_p50_ms_long": statistics.median(r["itl_p50_ms"] for r in rows[args.tokens]), "rows": rows}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
