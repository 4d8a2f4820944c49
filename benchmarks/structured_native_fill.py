"""The device gate's word: how long after a batch-32 fill starts it opens, Python open vs the native fill + open
(session 14, ``OCTAVO_GRAMMAR_NATIVE_OPEN``: plugins/structured_output/xgrammar_native.py), with and without another
Python thread holding the GIL (the engine core thread's update + schedule, the runner's launches).

Why: under the device gate the GPU's sampler waits for that word. Python's open needs the GIL back after xgrammar's
native fill returns; the native shim stores the word from C. Same token walks as benchmarks/structured_fill.py (the
engine's grammar form, ``cap16_regex``), the same matcher states for every strategy (a fill does not move a matcher),
strategies alternating step by step. Per strategy: ms from the call to the word opened (median, p90) and whether the
rows equal the Python fill's.

    python benchmarks/structured_native_fill.py [--rows 32] [--steps 48] [--pool 1 2 4] [--busy 0 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from structured_fill import compiled_forms, load_tokenizer, walks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--pool", type=int, nargs="+", default=[1, 2, 4], help="native chunks (POOL_THREADS)")
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="1: a Python thread spins meanwhile")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    import xgrammar as xgr

    from octavo.plugins.structured_output.xgrammar_native import NativeFill

    tok = load_tokenizer(None)
    vocab = 49152
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiled = compiled_forms(xgr, xgr.GrammarCompiler(info, max_threads=2), ["cap16_regex"])["cap16_regex"]
    seqs = walks(xgr, compiled, args.rows, args.steps, vocab)
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(args.rows)]
    rows = torch.full((args.rows, (vocab + 31) // 32), -1, dtype=torch.int32)
    ref = rows.clone()
    words = torch.zeros(2, dtype=torch.int32)
    batch = xgr.BatchGrammarMatcher(max_threads=1)
    natives = {k: NativeFill(batch, k) for k in args.pool}
    seq = [0]

    def python_open() -> float:  # the engine's default: the native fill, then the word from Python
        t0 = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, rows)
        seq[0] += 1
        words.numpy()[0] = seq[0]
        return time.perf_counter() - t0

    def native_open(k: int) -> float:
        t0 = time.perf_counter()
        seq[0] += 1
        t_end = natives[k](matchers, rows, words, seq[0])
        assert t_end and words[0] == seq[0]
        return t_end - t0

    strategies = {"python": python_open, **{f"native_p{k}": (lambda k=k: native_open(k)) for k in args.pool}}
    result = {"rows": args.rows, "steps": args.steps, "cpus": len(os.sched_getaffinity(0)),
              "loadavg_start": open("/proc/loadavg").read().split()[:3]}
    for busy in args.busy:
        stop = threading.Event()
        if busy:
            def spin(stop: threading.Event = stop) -> None:  # pure Python: keeps the GIL until the switch interval
                x = 0
                while not stop.is_set():
                    x += 1
            threading.Thread(target=spin, daemon=True).start()
        times = {s: [] for s in strategies}
        equal = {s: True for s in strategies}
        for m in matchers:
            m.reset()
        for step in range(args.steps):
            for m, s in zip(matchers, seqs):  # (-1: that row's grammar ended the step before and starts over)
                if s[step] == -1:
                    m.reset()
            batch.batch_fill_next_token_bitmask(matchers, ref)
            for name, fn in (list(strategies.items()) if step % 2 == 0 else list(strategies.items())[::-1]):
                rows.fill_(0)
                times[name].append(fn())
                equal[name] &= bool(torch.equal(rows, ref))
            for m, s in zip(matchers, seqs):
                if s[step] != -1:
                    m.accept_token(s[step])
        stop.set()
        out = {}
        for name, t in times.items():
            q = statistics.quantiles(t, n=10)
            out[name] = {"median_ms": round(statistics.median(t) * 1e3, 3), "p90_ms": round(q[-1] * 1e3, 3),
                         "rows_equal_python": equal[name]}
            print(f"busy={busy} {name}: median {out[name]['median_ms']} ms, p90 {out[name]['p90_ms']} ms, "
                  f"equal {equal[name]}", flush=True)
        result[f"busy_{busy}"] = out
    result["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
