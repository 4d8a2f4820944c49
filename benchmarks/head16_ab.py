"""Batch-1 fp8 decode: what a token costs outside the captured forward, and the levers on it, in ONE engine
(session 16, issue 9's ``decode_bs1_strict_fraction_of_roofline``; benchmarks/device/head16.sh).

The engine is the headline's (benchmarks/gpu_e2e.py decode_bs1 as e2e_fp8.sh runs it: Llama-3-8B shape, dummy
weights, fp8 weights + fp8 KV, ``max_num_seqs=512`` so 51 graph sizes, ``max_num_batched_tokens=8192``, async
scheduling), started with the LM head + sampler graphs and the one-graph step captured (``OCTAVO_GRAPH_HEAD=1``,
``OCTAVO_GRAPH_STEP=1``) so that they can be switched on and off in the same process. Variants (switched at run time, nothing recaptured; ``_again``,
``_again2``... repeat one), alternating:

- ``default``: as shipped (eager head: gather, head GEMV, float cast, torch.argmax, 4 sampler column copies);
- ``argmax``: the eager greedy argmax in two launches (``OCTAVO_CUDA_GREEDY_ARGMAX``, cuda_argmax.greedy_argmax);
- ``const``: kept decode inputs (``OCTAVO_DECODE_CONST_INPUTS``: no copies of the query starts, logits rows and
  greedy sampler columns, no gather of the hidden rows); ``lean`` = argmax + const;
- ``head``: the head graphs (``GraphHead.active``); ``head_const``: head graphs + const;
- ``step``: a batch-1 greedy step as ONE graph (``OCTAVO_GRAPH_STEP``, cuda_step_graph.py: one pinned copy of the
  step's row, fill + body + head + argmax in one replay, the input id read on the device); ``step_zc``: the same
  zero-copy (``OCTAVO_GRAPH_STEP_ZERO_COPY``: the row read from pinned host memory and the id written there by the
  graph, no copies on the stream);
- ``step_raw``: ``step`` with the argmax of the head's raw 16-bit logits written into the id buffer
  (``OCTAVO_GRAPH_STEP_RAW_ARGMAX``, session 17: no cast kernel, no copy node; the step graph recaptured at each switch);
- ``step_tile``: ``step`` with the LM head GEMV's best tile of a sweep on the head weight alone
  (benchmarks/head_tile_sweep.py, run once after the start when a ``step_tile`` is asked for; the step graph
  recaptured at each switch; skipped when no tile beats the current one by 1 %).

Per measure: ms/token = (257 - 1 tokens) / 256 after a 512-token prompt, best of two (contexts 513..768); with
``--windows`` also 769..1024 (gpu_e2e.py's second half); the strict fraction (issue 9's key: no embedding table, KV
in its own element size, LM head counted); the batch-1 graph replayed alone; greedy tokens vs the first measure
(exact levers: must be equal); head replays; and a CUDA-only trace of ``--trace-steps`` steps
(benchmarks/step_trace.py): GPU busy / idle a step, the idle gaps, and every op outside the body graph (the
``--windows`` variants also at contexts 897.., after an 896-token prompt).

    python benchmarks/head16_ab.py --variants default,lean,head,default_again --out /tmp/h16.json
    python benchmarks/head16_ab.py --dry --out /tmp/h16.json     # CPU: a tiny model, checks the plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.perf_counter()
VARIANTS = {"default": {}, "argmax": {"argmax": True}, "const": {"const": True},
            "lean": {"argmax": True, "const": True}, "head": {"head": True}, "head_const": {"head": True, "const": True},
            "step": {"step": True}, "step_zc": {"step": True, "zc": True}, "step_tile": {"step": True, "tile": True},
            "step_raw": {"step": True, "raw": True}}
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            max_position_embeddings=4096, torch_dtype="float32")


def base_name(tag: str) -> str:
    while tag.rsplit("_", 1)[-1].startswith("again"):
        tag = tag.rsplit("_", 1)[0]
    return tag


class Switches:
    """The run-time switches of one in-process engine (uni executor: the worker is this process's)."""

    def __init__(self, worker) -> None:
        from octavo.core import input_batch

        self.ib = input_batch
        self.runner = worker.runner
        self.head = getattr(self.runner.graph_runner, "head", None)
        self.step = getattr(self.runner.graph_runner, "step_graph", None)
        self.base_argmax = self.runner.sampler.greedy_argmax
        self.base_const = input_batch.CONST_INPUTS
        self.tile = None  # (N, K) -> tile of the head sweep's best (step_tile), and whether it is installed now
        self.tile_on = False
        try:
            from octavo.plugins.platforms.cuda_argmax import greedy_argmax
        except ImportError:
            greedy_argmax = None
        self.argmax = greedy_argmax

    def apply(self, v: dict) -> dict:
        self.ib.CONST_INPUTS = bool(v.get("const"))
        self.runner.sampler.greedy_argmax = self.argmax if v.get("argmax") else self.base_argmax
        if self.head is not None:
            self.head.active = bool(v.get("head"))
        if self.step is not None:
            self.step.active, self.step.zero_copy = bool(v.get("step")), bool(v.get("zc"))
        for what, obj in (("head", self.head), ("step", self.step)):
            if v.get(what) and obj is None:
                return {"skipped": f"no {what} graph captured"}
        raw = bool(v.get("raw"))
        if self.step is not None and raw != self.step.raw:  # the copy graph recaptured with / without it
            self.step.raw = raw
            self.step.capture(self.runner.graph_runner.pool)
        want = bool(v.get("tile"))
        if want and self.tile is None:
            return {"skipped": "no head tile beat the current one"}
        if want != self.tile_on and self.step is not None:
            from octavo.plugins.platforms import cuda_gemv_table

            cuda_gemv_table.set_override(self.tile if want else None)
            self.step.capture(self.runner.graph_runner.pool)  # the head GEMV's tile is fixed at capture
            self.tile_on = want
        return {}

    def restore(self) -> None:
        self.apply({})
        self.ib.CONST_INPUTS, self.runner.sampler.greedy_argmax = self.base_const, self.base_argmax
        if self.head is not None:
            self.head.active = False
        if self.step is not None:
            self.step.active = False

    def replays(self) -> int:
        n = sum(self.head.num_replays.values()) if self.head is not None else 0
        return n + (self.step.replays if self.step is not None else 0)


def replay_ms(graphs: list, iters: int = 50) -> float:
    import torch

    for _ in range(3):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="default,lean,head,default_again,lean_again,head_again")
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--budget", type=float, default=1e9, help="start no measure after this many seconds")
    ap.add_argument("--windows", default="default", help="variants (base names) also timed at contexts 769..1024")
    ap.add_argument("--trace-steps", type=int, default=16, help="0: no trace")
    ap.add_argument("--no-head-graphs", action="store_true", help="start without OCTAVO_GRAPH_HEAD=1 / _STEP=1")
    ap.add_argument("--dry", action="store_true", help="CPU: a tiny float32 model, 24-token runs")
    ap.add_argument("--stall-diag", default="", help="a variant: after the A/B, 4 generations of 257 tokens with the "
                    "engine's step intervals and the GC recorded (benchmarks/host_stalls.py)")
    ap.add_argument("--prefill-profile", action="store_true", help="after the A/B: the prefill step of 1-token "
                    "generations profiled (benchmarks/head16_prefill.py: launch times, cProfile, device busy time)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not args.no_head_graphs:
        os.environ.setdefault("OCTAVO_GRAPH_HEAD", "1")
        os.environ.setdefault("OCTAVO_GRAPH_STEP", "1")
        os.environ.setdefault("OCTAVO_GRAPH_STEP_ZERO_COPY", "1")
    import torch

    from benchmarks.gpu_e2e_common import LLAMA3_8B, copy_bandwidth, make_llm, write_config
    from octavo import SamplingParams

    cuda = torch.cuda.is_available() and not args.dry
    res: dict = {"card": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                 "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    bw = copy_bandwidth() if cuda else 1e11
    res["copy_bandwidth_TBps"] = bw / 1e12
    d = write_config(TINY if args.dry else LLAMA3_8B, tempfile.mkdtemp(), "tiny" if args.dry else "llama3-8b")
    kw = {} if args.dry else {"quantization": "fp8", "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.9}
    t = time.perf_counter()
    llm, worker, info = make_llm(d, max_model_len=4096, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192,
                                 **kw)
    res["load_s"] = time.perf_counter() - t
    res["fused"], res["graph_sizes"] = info.get("fused"), len(info.get("graph_sizes") or [])
    sw = Switches(worker)
    res["head_graphs"] = sorted({s for s, _ in sw.head.graphs}) if sw.head is not None else []
    res["step_graph"] = sw.step is not None and sw.step.graph is not None
    model = worker.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_elem = torch.empty((), dtype=worker._kv_dtype()).element_size() if hasattr(worker, "_kv_dtype") else 2
    from benchmarks.fp8_bs1_tiles import strict_bytes

    strict = {w: strict_bytes(model, weight_bytes, ctx, kv_elem)["strict_bytes"] / bw * 1e3
              for w, ctx in (("513_768", 640), ("769_1024", 896))}
    res["strict_roofline_ms"] = strict
    print("loaded", json.dumps(res), flush=True)
    save()
    gr = worker.runner.graph_runner
    graph = None
    if cuda and gr is not None and 1 in gr.graphs and args.trace_steps:
        from torch.profiler import ProfilerActivity, profile

        from benchmarks.step_trace import graph_counts

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                gr.graphs[1].replay()
            torch.cuda.synchronize()
        graph = graph_counts(prof, 5)
        res["graph_ops_per_replay"] = round(sum(graph.values()), 1)
    rng = random.Random(0)
    lo, hi = (1, 500) if args.dry else (1000, 120000)
    prompt = {"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(512)]}
    n = 24 if args.dry else 256
    first: dict = {}

    late = {"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(896)]}  # a trace at contexts 897..

    def gen(tokens: int, p=prompt) -> tuple[float, list]:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = llm.generate([p], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0), use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t, list(out[0].outputs[0].token_ids)

    windows = set(args.windows.split(",")) if args.windows else set()
    if cuda and any(base_name(t) == "step_tile" for t in args.variants.split(",")):
        from benchmarks.head_tile_sweep import sweep

        try:
            res["head_tiles"] = sweep(model.lm_head.weight)
            h = res["head_tiles"]
            print("head tiles", json.dumps(h), flush=True)
            if h["best_ms"] < 0.99 * h["ms"]["current"]:
                sw.tile = {tuple(model.lm_head.weight.shape): h["best_tile"]}
        except Exception as e:  # noqa: BLE001 - the other variants still run
            res["head_tiles"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        save()
    sw.apply(VARIANTS["default"])
    gen(64)  # the first generation after the start runs slower (allocator, first replays): not in any measure
    for tag in args.variants.split(","):
        base = base_name(tag)
        if base not in VARIANTS:
            res[tag] = {"error": f"unknown variant {base!r} (one of {', '.join(VARIANTS)})"}
            continue
        if time.perf_counter() - T0 > args.budget:
            res[tag] = {"skipped": "budget"}
            continue
        r = sw.apply(VARIANTS[base])
        if r:
            res[tag] = r
            continue
        try:
            before = sw.replays()
            gen(8)
            t1 = min(gen(1)[0] for _ in range(2))
            runs = [gen(n + 1) for _ in range(2)]
            t2 = min(dt for dt, _ in runs)
            r = {"ms_per_token": (t2 - t1) / n * 1e3}
            r["strict_fraction"] = strict["513_768"] / r["ms_per_token"]
            toks = [tk for _, tk in runs]
            if base in windows:
                runs3 = [gen(2 * n + 1) for _ in range(2)]
                t3 = min(dt for dt, _ in runs3)
                r["ms_per_token_769_1024"] = (t3 - t2) / n * 1e3
                r["ms_per_token_513_1024"] = (t3 - t1) / (2 * n) * 1e3
                r["strict_fraction_513_1024"] = (strict["513_768"] + strict["769_1024"]) / 2 / r["ms_per_token_513_1024"]
            ref = first.setdefault("tokens", toks[0])
            r["tokens_equal_first"] = all(tk == ref for tk in toks)
            r["head_replays"] = sw.replays() - before
            if cuda and gr is not None and 1 in gr.graphs:
                r["graph_forward_ms"] = replay_ms([gr.graphs[1]])
                r["outside_graph_ms"] = r["ms_per_token"] - r["graph_forward_ms"]
                if VARIANTS[base].get("head") and (1, "greedy") in sw.head.graphs:
                    r["graph_body_head_ms"] = replay_ms([gr.graphs[1], sw.head.graphs[(1, "greedy")]])
                if VARIANTS[base].get("step"):  # (re-runs the last step's row: its KV slot, of a finished request)
                    r["graph_step_ms"] = replay_ms([sw.step.graph])
                    r["step_from_prev"] = sw.step.from_prev
            if cuda and args.trace_steps:
                from torch.profiler import ProfilerActivity, profile

                from benchmarks.step_trace import step_table

                for key, p in (("trace", prompt), ("trace_ctx897", late))[:2 if base in windows else 1]:
                    gen(8, p)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        gen(args.trace_steps + 4, p)
                        torch.cuda.synchronize()
                    r[key] = step_table(prof, graph)
        except Exception as e:  # noqa: BLE001 - record why; the other variants still run
            r = {"error": f"{type(e).__name__}: {e}"[:400]}
        res[tag] = r
        print(tag, json.dumps({k: v for k, v in r.items() if not k.startswith("trace")}), flush=True)
        for key in ("trace", "trace_ctx897"):
            if key in r:
                print("  ", key, json.dumps(r[key])[:1500], flush=True)
        save()
    if args.prefill_profile and time.perf_counter() - T0 < args.budget + 10:
        from benchmarks.head16_prefill import prefill_profile

        sw.apply({"step": True})  # the default engine's state
        try:
            res["prefill"] = prefill_profile(llm, lambda: gen(1)[0], cuda)
        except Exception as e:  # noqa: BLE001 - a diagnostic
            res["prefill"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print("prefill", json.dumps(res["prefill"])[:4000], flush=True)
        save()
    if args.stall_diag in VARIANTS and not sw.apply(VARIANTS[args.stall_diag]):
        from benchmarks.host_stalls import stall_diag

        try:
            res["stalls"] = {"variant": args.stall_diag, "runs": stall_diag(llm, lambda: gen(n + 1))}
        except Exception as e:  # noqa: BLE001 - a diagnostic
            res["stalls"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print("stalls", json.dumps(res["stalls"]), flush=True)
        save()
    sw.restore()
    by: dict = {}
    for tag in args.variants.split(","):
        if isinstance(res.get(tag), dict) and "ms_per_token" in res[tag]:
            by.setdefault(base_name(tag), []).append(round(res[tag]["ms_per_token"], 4))
    res["summary_ms_per_token"] = by
    res["greedy_tokens_equal"] = all(res[t].get("tokens_equal_first", True) for t in args.variants.split(",")
                                     if isinstance(res.get(t), dict))
    res["seconds"] = time.perf_counter() - T0
    save()
    print("summary", json.dumps(by), "tokens equal:", res["greedy_tokens_equal"], f"{res['seconds']:.0f} s", flush=True)
    llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
