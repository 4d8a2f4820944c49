"""Host cost of one step's xgrammar bitmask fill, by grammar form and by threading (issue 11's batch-32 goal).

Why: on the H100 host a batch-32 JSON step's fill (~2-3 ms on random-weight outputs) outlasted the whole
forward. This replays the SAME token walks through differently built grammars and fill strategies, so each
number is the host cost alone, with no model and no GPU:

1. Walks: ``--rows`` requests walk the benchmark schema (benchmarks/structured_outputs.py ``SCHEMA``), each
   taking at every step the allowed token with the highest score of a per-row random preference plus noise
   (what a random-weight model's argmax does); a row whose grammar ends starts over. Recorded once per
   grammar form (the forms differ in what whitespace they allow, so their walks differ).
2. Forms: ``cap16`` = xgrammar's ``max_whitespace_cnt=16`` (octavo's setting: a rule repetition
   ``ws{0, 16}``), ``nocap`` = unbounded whitespace (vLLM's default; random walks then stay in whitespace),
   ``compact`` = ``disable_any_whitespace``, ``cap16_regex`` / ``cap16_nested`` / ``cap16_chain`` = the same
   16-character cap as one regex rule / 16 nested rules / 16 optional characters
   (plugins/structured_output/xgrammar_whitespace.py).
3. Fill strategies per step over all rows: xgrammar's ``BatchGrammarMatcher`` with 1..N threads, and one
   ``fill_next_token_bitmask`` per row serially, and ``pool_tN``: N Python threads, each a 1-thread batch fill
   over every N-th row (only parallel if xgrammar releases the GIL); ``engine_tN``: the engine's own fill
   (core/grammar_step.py: contiguous chunks of >= 8 rows, the first on the calling thread, the others on a
   persistent pool of N - 1 threads). Median and mean ms per step, per row.
5. ``--apply-device cuda``: host ms of the mask apply (core/grammar_step.py ``apply_packed``), GPU idle and GPU
   busy (a hidden sync would add the queued work's ~2 ms).
4. A GIL probe: how fast a pure-Python loop runs on the main thread while another thread fills batches
   (1.0: the fill released the GIL; ~0: it held it), relative to the loop alone.

    python benchmarks/structured_fill.py [--tokenizer DIR] [--rows 32] [--steps 48] [--threads 1 2 4 8]
        [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from structured_outputs import SCHEMA  # noqa: E402


def load_tokenizer(path: str | None):
    if path:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_tokenizer as load

    return load(OctavoSettings.from_kwargs().model)


def compiled_forms(xgr, compiler, forms: list[str]) -> dict:
    from octavo.plugins.structured_output.xgrammar_backend import _schema
    from octavo.plugins.structured_output.xgrammar_whitespace import capped_whitespace_grammar
    from octavo.structured_outputs import StructuredOutputsParams

    text = _schema(StructuredOutputsParams(json=SCHEMA))  # with the maxLength -> pattern rewrite
    out = {}
    for form in forms:
        t0 = time.perf_counter()
        if form == "cap16":
            out[form] = compiler.compile_json_schema(text, any_whitespace=True, max_whitespace_cnt=16)
        elif form == "nocap":
            out[form] = compiler.compile_json_schema(text, any_whitespace=True)
        elif form == "compact":  # disable_any_whitespace=True
            out[form] = compiler.compile_json_schema(text, any_whitespace=False)
        elif form.startswith("cap16_"):
            out[form] = compiler.compile_grammar(capped_whitespace_grammar(xgr, text, 16, form[6:]))
        else:
            raise SystemExit(f"unknown form {form!r}")
        print(f"compiled {form} in {(time.perf_counter() - t0) * 1e3:.0f} ms", flush=True)
    return out


def walks(xgr, compiled, rows: int, steps: int, vocab: int) -> list[list[int]]:
    """Per row, the tokens of ``steps`` steps (a restart after the grammar ended is recorded as -1)."""
    import numpy as np

    bitmask = xgr.allocate_token_bitmask(1, vocab)
    out = []
    for r in range(rows):
        rng = np.random.default_rng(1000 + r)
        pref = rng.standard_normal(vocab).astype(np.float32)
        m = xgr.GrammarMatcher(compiled)
        seq = []
        for _ in range(steps):
            if m.is_terminated():
                m.reset()
                seq.append(-1)
                continue
            m.fill_next_token_bitmask(bitmask, 0)
            allowed = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab].astype(bool)
            score = pref + rng.standard_normal(vocab).astype(np.float32)
            score[~allowed] = -np.inf
            tok = int(score.argmax())
            if not m.accept_token(tok):
                raise RuntimeError(f"row {r}: token {tok} refused right after its mask allowed it")
            seq.append(tok)
        out.append(seq)
    return out


def replay(xgr, compiled, seqs: list[list[int]], vocab: int, strategy: str, threads: int,
           slowest: list | None = None) -> list[float]:
    """Seconds per step to fill every row's mask (rows restarted at -1 are filled from the start state); the
    serial strategy also appends each step's slowest single row to ``slowest`` (the floor of any parallel fill)."""
    rows, steps = len(seqs), len(seqs[0])
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    bitmask = xgr.allocate_token_bitmask(rows, vocab)
    batch = xgr.BatchGrammarMatcher(max_threads=threads) if strategy == "batch" else None
    pool = chunks = None
    if strategy == "pool":  # our own Python threads, each a 1-thread batch fill over an interleaved chunk of rows
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(threads)
        chunks = [(xgr.BatchGrammarMatcher(max_threads=1), list(range(k, rows, threads))) for k in range(threads)]

        def fill_chunk(chunk):
            b, idx = chunk
            b.batch_fill_next_token_bitmask([matchers[i] for i in idx], bitmask, indices=idx)
    step = None
    if strategy == "engine":  # the engine's own fill: contiguous chunks, the first on this thread (grammar_step.py)
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from octavo.core.grammar_step import GrammarStep

        class Shim:  # what XGrammarBackend.fill_bitmasks does for live rows (a 1-thread batch per filling thread)
            local = threading.local()

            def fill_bitmasks(self, ms, bm):
                b = getattr(self.local, "b", None) or setattr(self.local, "b", xgr.BatchGrammarMatcher(1)) or self.local.b
                b.batch_fill_next_token_bitmask(ms, bm)
        pool = ThreadPoolExecutor(max(1, threads - 1))
        step = GrammarStep(Shim(), list(range(rows)), [str(i) for i in range(rows)], matchers, bitmask, pool,
                           (threads, pool) if threads > 1 else None)
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        if batch is not None:
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
        elif step is not None:
            step._fill_rows()
        elif pool is not None:
            list(pool.map(fill_chunk, chunks))
        else:
            worst = 0.0
            for i, m in enumerate(matchers):
                t1 = time.perf_counter()
                m.fill_next_token_bitmask(bitmask, i)
                worst = max(worst, time.perf_counter() - t1)
            if slowest is not None:
                slowest.append(worst)
        times.append(time.perf_counter() - t0)
        for m, seq in zip(matchers, seqs):
            tok = seq[s]
            if tok < 0:
                m.reset()
            elif not m.accept_token(tok):
                raise RuntimeError("replay diverged")
    if pool is not None:
        pool.shutdown()
    return times


def gil_probe(xgr, compiled, rows: int, vocab: int, seconds: float = 0.3) -> dict:
    """Main-thread Python loop speed while a thread fills (one row at a time, then 1-thread batches)."""
    import threading

    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    bitmask = xgr.allocate_token_bitmask(rows, vocab)
    batch = xgr.BatchGrammarMatcher(max_threads=1)

    def spin() -> int:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += 1
        return n

    out = {}
    for kind in ("per_row", "batch_t1"):
        stop = threading.Event()

        def work(kind=kind, stop=stop) -> None:
            while not stop.is_set():
                if kind == "batch_t1":
                    batch.batch_fill_next_token_bitmask(matchers, bitmask)
                else:
                    for i, m in enumerate(matchers):
                        m.fill_next_token_bitmask(bitmask, i)

        alone = spin()
        th = threading.Thread(target=work)
        th.start()
        busy = spin()
        stop.set()
        th.join()
        out[kind] = round(busy / alone, 2)
    return out


def apply_timing(device: str, rows: int, vocab: int, reps: int = 30) -> dict:
    """Host ms of ``apply_packed`` (core/grammar_step.py) for ``rows`` rows on ``device``, with the GPU idle and
    with a ~2 ms matmul still queued (a host-side sync inside the apply would then show up as ~2 ms)."""
    import torch

    from octavo.core.grammar_step import apply_packed

    dev = torch.device(device)
    logits = torch.randn(rows, vocab, device=dev, dtype=torch.bfloat16)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) if dev.type == "cuda" else None
    packed = torch.randint(-2**31, 2**31 - 1, (rows, (vocab + 31) // 32), dtype=torch.int32)
    pinned = packed.pin_memory() if dev.type == "cuda" else packed
    sub = list(range(0, rows, 4)) + list(range(1, rows, 4))
    out = {}
    for name, idx, src in (("all_rows", list(range(rows)), packed), ("half_rows", sub, packed[:len(sub)]),
                           ("all_rows_prepinned", list(range(rows)), pinned)):
        for busy in ((False, True) if dev.type == "cuda" else (False,)):
            times = []
            for _ in range(reps):
                torch.cuda.synchronize() if dev.type == "cuda" else None
                if busy:
                    for _ in range(8):
                        a @ a  # ~0.2-0.3 ms each on an H100 in bf16
                t0 = time.perf_counter()
                apply_packed(logits, idx, src)
                times.append(time.perf_counter() - t0)
            out[f"{name}{'_gpu_busy' if busy else ''}_host_ms"] = round(statistics.median(times) * 1e3, 3)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
        out["busy_queue_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return out


def accept_timing(xgr, compiled, seqs: list[list[int]]) -> dict:
    """ms to advance all rows by one step's tokens: one ``accept_token`` per row vs one ``batch_accept_token``."""
    out = {}
    for mode in ("loop", "batch"):
        matchers = [xgr.GrammarMatcher(compiled) for _ in seqs]
        times = []
        for s in range(len(seqs[0])):
            toks = [q[s] for q in seqs]
            for m, t in zip(matchers, toks):
                if t < 0:
                    m.reset()
            live = [i for i, t in enumerate(toks) if t >= 0]
            t0 = time.perf_counter()
            if mode == "loop":
                for i in live:
                    matchers[i].accept_token(toks[i])
            else:
                xgr.BatchGrammarMatcher.batch_accept_token([matchers[i] for i in live], [toks[i] for i in live])
            times.append(time.perf_counter() - t0)
        out[f"accept_{mode}_median_ms"] = round(statistics.median(times) * 1e3, 3)
        out[f"accept_{mode}_mean_ms"] = round(statistics.fmean(times) * 1e3, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=None, help="a tokenizer dir (default: the embedded SmolLM2's)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8], help="BatchGrammarMatcher threads")
    ap.add_argument("--pool-threads", dest="pool_threads", type=int, nargs="*", default=None,
                    help="our own fill threads (default: the --threads above 1)")
    ap.add_argument("--forms", nargs="+", default=["cap16", "cap16_regex", "cap16_nested", "compact"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--engine-threads", dest="engine_threads", type=int, nargs="*", default=[],
                    help="also the engine's own chunked fill (core/grammar_step.py) with these thread counts")
    ap.add_argument("--apply-device", dest="apply_device", default=None,
                    help="also time the mask apply's host part on this device (e.g. cuda)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import xgrammar as xgr

    tok = load_tokenizer(args.tokenizer)
    vocab = 49152 if len(tok) <= 49152 else len(tok)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    from importlib.metadata import version

    res = {"rows": args.rows, "steps": args.steps, "cpu_count": os.cpu_count(), "xgrammar": version("xgrammar"),
           "forms": {}}

    def save() -> None:  # after every section: a time limit keeps what was measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2)

    forms = compiled_forms(xgr, compiler, args.forms)
    first = next(iter(forms.values()))
    res["gil_probe_main_thread_speed"] = gil_probe(xgr, first, args.rows, vocab, seconds=0.3)
    print("GIL probe (main-thread loop speed while filling; 1.0 = GIL released):", res["gil_probe_main_thread_speed"],
          flush=True)
    save()
    if args.apply_device:
        res["apply"] = apply_timing(args.apply_device, args.rows, vocab)
        print("apply host ms:", res["apply"], flush=True)
        save()
    pool_threads = args.pool_threads if args.pool_threads is not None else [t for t in args.threads if t > 1]
    for form, compiled in forms.items():
        t0 = time.perf_counter()
        seqs = walks(xgr, compiled, args.rows, args.steps, vocab)
        row = {"walk_s": round(time.perf_counter() - t0, 2)}
        row["row0_text"] = tok.decode([t for t in seqs[0] if t >= 0])[:160]
        res["forms"][form] = row
        row.update(accept_timing(xgr, compiled, seqs))
        print(f"{form:12s} accept {dict((k, v) for k, v in row.items() if k.startswith('accept'))}", flush=True)
        strategies = ([("serial", 1)] + [("batch", t) for t in args.threads] + [("pool", t) for t in pool_threads]
                      + [("engine", t) for t in args.engine_threads])
        slowest: list[float] = []
        for strategy, threads in strategies:
            times = []
            for _ in range(args.repeats):
                times += replay(xgr, compiled, seqs, vocab, strategy, threads, slowest)
            name = "serial" if strategy == "serial" else f"{strategy}_t{threads}"
            row[name] = {"median_ms": round(statistics.median(times) * 1e3, 3),
                         "mean_ms": round(statistics.fmean(times) * 1e3, 3),
                         "p90_ms": round(sorted(times)[int(0.9 * len(times))] * 1e3, 3),
                         "mean_us_per_row": round(statistics.fmean(times) / args.rows * 1e6, 1)}
            print(f"{form:12s} {name:10s} {row[name]}", flush=True)
            save()
        row["slowest_row_per_step"] = {"median_ms": round(statistics.median(slowest) * 1e3, 3),
                                       "mean_ms": round(statistics.fmean(slowest) * 1e3, 3)}
        print(f"{form:12s} slowest row per step {row['slowest_row_per_step']}", flush=True)
        save()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
