"""`octavo serve` at C=1 against the offline batch-1 step, alternating in one run (issue 18's C=1 TPOT goal).

Why: the goal is a ratio (server TPOT <= 1.2x the offline batch-1 step) and the two numbers came from two commands
minutes apart, on a 2-vCPU VM whose speed moves with what else runs: one quiet rerun read 0.86x, 1.14x and 1.40x.
Here both sides run in turns in one process: each round decodes ``--tokens`` greedy tokens offline (the fused
batch-1 stack at ``--threads``, ``benchmarks/cpu_decode.py``'s ``octavo-fused``, while the servers idle), then
streams ``--requests`` completions of ``--tokens`` tokens to each server variant (one at a time, C=1). A request's
TPOT is (last chunk - first chunk) / (tokens - 1), as ``octavo bench serve`` defines it; the offline number is
(decode time - prefill and first token) / (tokens - 1). Each side's median over the rounds, and the ratio of
medians and per round, are printed and written to ``benchmarks/results/<name>.json``.

    python benchmarks/cpu_serve_c1.py --variants "" "OCTAVO_CPU_ADAPTIVE_THREADS=0 --num-threads 2" --rounds 6

A variant is a string of `octavo serve` flags led by optional NAME=VALUE environment words ('' = defaults).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from cpu_decode import OctavoEngine  # noqa: E402
from cpu_record import isa  # noqa: E402
from serve import first_answer, parse_variant  # noqa: E402

from octavo.server.launch import ServerProcess  # noqa: E402


def stream_tpot(url: str, prompt: list[int], tokens: int) -> float:
    """One streamed greedy completion; its TPOT in ms (first to last data chunk over tokens - 1)."""
    body = {"prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "stream": True, "temperature": 0}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                times.append(time.perf_counter())
    return (times[-1] - times[0]) / (len(times) - 1) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=[""], metavar="VARIANT")
    p.add_argument("--threads", type=int, default=2, help="offline engine's threads (the goal command's 2)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--requests", type=int, default=2, help="server requests per variant and round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--name", default="cpu_serve_c1")
    p.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args()
    from octavo.core.loader import default_model_path

    os.makedirs(args.out_dir, exist_ok=True)
    prompt = [1000 + (7 * i) % 20000 for i in range(args.prompt_len)]
    servers = []
    try:
        for i, text in enumerate(args.variants):
            env, flags = parse_variant(text)
            srv = ServerProcess(["--max-model-len", "1024", "--uvicorn-log-level", "warning", *flags], env=env,
                                log_path=os.path.join(tempfile.gettempdir(), f"{args.name}-variant{i}.log"))
            t0 = time.perf_counter()
            srv.start()
            first_answer(srv.url, t0)
            for _ in range(2):  # warm-up: the server's first steps (and the core's thread governor's first probes)
                stream_tpot(srv.url, prompt, 16)
            servers.append({"label": text or "default", "srv": srv, "tpot_ms": []})
        eng = OctavoEngine(default_model_path(), "bfloat16", None, False, args.threads, fused=True)
        eng.decode(prompt, 8)  # warm-up
        offline, loads = [], []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            order = servers if r % 2 == 0 else servers[::-1]
            if r % 2:
                offline.append(eng.decode(prompt, args.tokens)[0] * 1e3)
            for v in order:
                v["tpot_ms"].append(statistics.median(stream_tpot(v["srv"].url, prompt, args.tokens)
                                                      for _ in range(args.requests)))
            if r % 2 == 0:
                offline.append(eng.decode(prompt, args.tokens)[0] * 1e3)
            print(f"round {r} load {loads[-1]:.1f}: offline {offline[-1]:.2f} ms/token; "
                  + "; ".join(f"{v['label']!r} TPOT {v['tpot_ms'][-1]:.2f} ms" for v in servers), flush=True)
    finally:
        for v in servers:
            v["srv"].stop()
    off = statistics.median(offline)
    rows = [{"variant": v["label"], "tpot_ms_rounds": [round(x, 3) for x in v["tpot_ms"]],
             "tpot_ms": round(statistics.median(v["tpot_ms"]), 3),
             "ratio": round(statistics.median(v["tpot_ms"]) / off, 3),
             "ratio_rounds": [round(a / b, 3) for a, b in zip(v["tpot_ms"], offline)]} for v in servers]
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "isa": isa(), "load_avg_rounds": loads,
           "offline_ms_rounds": [round(x, 3) for x in offline], "offline_ms": round(off, 3), "servers": rows}
    path = os.path.join(args.out_dir, f"{args.name}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"\nwrote {path}\noffline batch-1 step {off:.2f} ms/token (threads {args.threads})")
    for row in rows:
        print(f"{row['variant']!r}: TPOT {row['tpot_ms']:.2f} ms = {row['ratio']:.2f}x offline "
              f"(per round {row['ratio_rounds']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
