"""Paired, step-interleaved A/B of JSON-schema decoding vs unconstrained decoding (issue 11's per-token overhead),
built to give a trustworthy wall-clock number on a shared, loaded machine.

Why a second benchmark: ``benchmarks/structured_outputs.py`` interleaves its modes per *run* (32 requests x 16
steps, ~2-4 s each), so any load change between runs lands in one mode only: in session 7's quiet rerun a device
upload made the JSON mode +15.6% and the serial mode -21% in the same run, while the engine's own timers said
0.9%. Here two engines of the same model live in one process; one decodes the unconstrained batch, the other the
JSON batch, and their steps alternate one by one (ABBA order, so neither is always first after a pause). Each
JSON step is compared with the free step next to it (~0.1 s apart on a CPU), so load drift cancels in the paired
ratio; the engines swap roles every block (a systematic difference between the two engines cancels too); blocks
are short (fresh requests, a few decode steps), many of them. Reported per mode: median and quartiles of wall ms
per step; the median of the paired ratios with its quartiles, the per-block ratios (their spread is the run's
honest spread), and, as a second witness, the process CPU time per step (all threads, ``CLOCK_PROCESS_CPUTIME``;
other processes' load moves it much less than wall time) and each named thread's CPU per step (/proc schedstat).

    python benchmarks/structured_ab.py [--batches 32 1] [--blocks 8] [--steps 12] [--dtype float32]
        [--quantization none] [--device cpu] [--model PATH] [--load-format dummy] [--json-modes overlap serial]
        [--json OUT]

Only steps in which all requests of both engines decode are paired (prefill and the ragged tail are untimed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.structured_common import SCHEMA, thread_cpu_s  # noqa: E402 - same schema, same /proc reader


def quartiles(xs: list[float]) -> dict:
    if len(xs) < 2:
        return {"median": xs[0] if xs else None, "p25": None, "p75": None, "n": len(xs)}
    q = statistics.quantiles(xs, n=4)
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "n": len(xs)}


def _round(d: dict, k: float = 1.0, nd: int = 3) -> dict:
    return {a: (round(v * k, nd) if isinstance(v, float) else v) for a, v in d.items()}


def build_engines(args) -> list:
    from octavo import LLM

    kw = {"max_model_len": 512, "max_num_seqs": max(args.batches), "enable_prefix_caching": False,
          "async_scheduling": args.async_scheduling}
    for name in ("model", "tokenizer", "device", "quantization", "dtype", "load_format", "gpu_memory_utilization"):
        if getattr(args, name):
            kw[name] = getattr(args, name)
    return [LLM(**kw) for _ in range(2)]


def full(core, batch: int) -> bool:
    return sum(1 for r in core.scheduler.running if r.num_output_tokens >= 1) == batch


def _serial(self, batch, grammar):
    """The ``serial`` JSON mode: the fill on the engine thread first, then the step (no fill thread running
    beside torch's threads); the apply path is the same as the default's."""
    grammar.wait()
    return self.driver.execute(batch, grammar=grammar)


def run_block(cores, json_engine: int, prompts: list, args, ids, tok, samples: list | None,
              json_mode: str = "overlap") -> dict:
    """One block: fresh requests into both engines (engine ``json_engine`` gets the schema), prefill untimed,
    then decode steps alternating between the engines; returns the paired per-step measurements.
    ``json_mode``: ``overlap`` (the default path: the fill on the bitmask thread while the forward runs) or
    ``serial`` (fill first, on the engine thread)."""
    import types

    from octavo.core import grammar_device_gate

    ex = cores[json_engine].executor
    if json_mode == "serial":
        ex.execute_structured = types.MethodType(_serial, ex)
    gate = grammar_device_gate.DEVICE_GATE
    if json_mode in ("devgate", "park"):  # async on an accelerator: the device or the Python gate waits for the fill
        grammar_device_gate.DEVICE_GATE = json_mode == "devgate"
    try:
        return _block(cores, json_engine, prompts, args, ids, tok, samples)
    finally:
        vars(ex).pop("execute_structured", None)
        grammar_device_gate.DEVICE_GATE = gate


def _block(cores, json_engine: int, prompts: list, args, ids, tok, samples: list | None) -> dict:
    from octavo import SamplingParams
    from octavo.core.messages import EngineCoreRequest
    from octavo.structured_outputs import StructuredOutputsParams

    so = StructuredOutputsParams(json=SCHEMA)
    batch = len(prompts)
    for e, core in enumerate(cores):
        params = SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=e != json_engine,
                                structured_outputs=so if e == json_engine else None)
        for p in prompts:
            core.add_request(EngineCoreRequest(f"ab{next(ids)}", p, params, time.time(), eos_token_id=tok.eos_token_id))
    texts: dict[str, list[int]] = {}
    # prefill (and the first token) of each engine, untimed; both engines step in turn, never one alone while the
    # other has steps in flight: on one device a structured step's sampling may wait on the device for a fill that
    # only its own engine's next step() starts (core/grammar_device_gate.py), and the other engine's work would
    # queue behind that wait
    while any(c.has_unfinished_requests() and not full(c, batch) for c in cores):
        for core in cores:
            if core.has_unfinished_requests():
                core.step()
    out = {"free": [], "json": [], "free_cpu": [], "json_cpu": [], "threads": {"free": [], "json": []}}
    i = 0
    while all(c.has_unfinished_requests() for c in cores):
        order = (0, 1) if i % 4 in (0, 3) else (1, 0)  # ABBA: A first in half the pairs
        both_full = all(full(c, batch) for c in cores)
        pair = {}
        for e in order:
            core = cores[e]
            th0 = thread_cpu_s()
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = core.step()
            dt = time.perf_counter() - t0
            dc = time.process_time() - c0
            th1 = thread_cpu_s()
            pair[e] = (dt, dc, {k: v - th0.get(k, 0.0) for k, v in th1.items() if v - th0.get(k, 0.0) > 0})
            if e == json_engine and samples is not None:
                for o in res.outputs:
                    texts.setdefault(o.request_id, []).extend(o.new_token_ids)
        if both_full:
            for e, (dt, dc, th) in pair.items():
                m = "json" if e == json_engine else "free"
                out[m].append(dt)
                out[f"{m}_cpu"].append(dc)
                out["threads"][m].append(th)
        i += 1
    for core in cores:  # the ragged tail, untimed
        while core.has_unfinished_requests():
            core.step()
    if samples is not None and texts:
        samples.extend(tok.decode(t) for t in list(texts.values())[:2])
    return out


def summarize(blocks: list[dict], roles: list[int]) -> dict:
    free = [t for b in blocks for t in b["free"]]
    js = [t for b in blocks for t in b["json"]]
    ratios = [j / f for b in blocks for f, j in zip(b["free"], b["json"])]
    cfree = [t for b in blocks for t in b["free_cpu"]]
    cjs = [t for b in blocks for t in b["json_cpu"]]
    cratios = [j / f for b in blocks for f, j in zip(b["free_cpu"], b["json_cpu"]) if f > 0]
    per_block = [round((statistics.median(j / f for f, j in zip(b["free"], b["json"])) - 1) * 100, 2)
                 for b in blocks if b["free"] and b["json"]]  # each block's own median paired ratio
    by_role = {}  # the free engine's median step by which engine ran it: a systematic engine difference shows here
    for e in (0, 1):
        fr = [t for b, r in zip(blocks, roles) if r != e for t in b["free"]]
        if fr:
            by_role[f"free_on_engine{e}_ms"] = round(statistics.median(fr) * 1e3, 3)
    threads: dict[str, dict[str, float]] = {}
    for m in ("free", "json"):
        steps = [th for b in blocks for th in b["threads"][m]]
        names = {k for th in steps for k in th}
        threads[m] = {k: round(statistics.median(th.get(k, 0.0) for th in steps) * 1e3, 3) for k in sorted(names)}
        threads[m] = {k: v for k, v in threads[m].items() if v >= 0.005}
    rq, cq = quartiles(ratios), quartiles(cratios)
    return {
        "pairs": len(ratios), "blocks": len(blocks),
        "free_ms": _round(quartiles(free), 1e3), "json_ms": _round(quartiles(js), 1e3),
        "overhead_pct_median_of_paired_ratios": round((rq["median"] - 1) * 100, 2) if ratios else None,
        "overhead_pct_paired_p25_p75": [round((rq["p25"] - 1) * 100, 2), round((rq["p75"] - 1) * 100, 2)]
        if rq["p25"] is not None else None,
        "overhead_pct_ratio_of_medians": round((statistics.median(js) / statistics.median(free) - 1) * 100, 2)
        if free and js else None,
        "overhead_pct_per_block": per_block,
        "cpu_free_ms": _round(quartiles(cfree), 1e3), "cpu_json_ms": _round(quartiles(cjs), 1e3),
        "cpu_overhead_pct_median_of_paired_ratios": round((cq["median"] - 1) * 100, 2) if cratios else None,
        "cpu_overhead_pct_paired_p25_p75": [round((cq["p25"] - 1) * 100, 2), round((cq["p75"] - 1) * 100, 2)]
        if cq["p25"] is not None else None,
        "thread_cpu_ms_per_step": threads, **by_role,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[32])
    ap.add_argument("--blocks", type=int, default=8, help="request blocks per batch size (engines swap roles)")
    ap.add_argument("--steps", type=int, default=12, help="decode steps per block (max_tokens - 1)")
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2 GGUF")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--load-format", dest="load_format", default=None)
    ap.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=float, default=None,
                    help="per engine (two engines share the device: e.g. 0.4)")
    ap.add_argument("--async-scheduling", dest="async_scheduling", default=None,
                    type=lambda s: {"on": True, "off": False}[s], help="on/off (default: the platform's default)")
    ap.add_argument("--json-modes", dest="json_modes", nargs="+", default=["overlap"],
                    choices=["overlap", "serial", "devgate", "park"],
                    help="JSON paths compared with the free steps (blocks cycle through them; each has its own row): "
                         "overlap = the default path; serial = fill first; under async scheduling on an accelerator "
                         "devgate / park = the device gate on / off (core/grammar_device_gate.py)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    load0 = os.getloadavg()
    t_start = time.time()
    llms = build_engines(args)
    cores = [llm.llm_engine.core for llm in llms]
    tok = llms[0].llm_engine.tokenizer
    ids = iter(range(10**9))
    result = {"device": str(cores[0].model_info.device), "dtype": str(cores[0].model_info.dtype),
              "quantization": cores[0].model_info.quantization or "none",
              "async_scheduling": bool(cores[0].async_loop is not None), "steps_per_block": args.steps,
              "torch_threads": __import__("torch").get_num_threads(), "cpus": len(os.sched_getaffinity(0))}
    for batch in args.batches:
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe item number {i} as JSON with a "
                                             "name, tags and a score."}], add_generation_prompt=True, tokenize=True)
                   for i in range(batch)]
        prompts = [list(getattr(p, "input_ids", p)) for p in prompts]
        for e in (0, 1):  # warm-up, both roles: grammar compiled, buffers and kernels built
            run_block(cores, e, prompts, args, ids, tok, None)
        per_mode: dict[str, tuple[list, list]] = {m: ([], []) for m in args.json_modes}
        samples: list = []
        for b in range(args.blocks * len(args.json_modes)):
            mode = args.json_modes[(b // 2) % len(args.json_modes)]  # 0,1: mode A on engines 0,1; 2,3: mode B ...
            blocks, roles = per_mode[mode]
            roles.append(b % 2)
            blocks.append(run_block(cores, b % 2, prompts, args, ids, tok, samples if b == 0 else None, mode))
            s = summarize(blocks, roles)
            print(f"batch {batch} {mode} block {len(blocks)}/{args.blocks}: {s['pairs']} pairs, free "
                  f"{s['free_ms']['median']:.2f} json {s['json_ms']['median']:.2f} ms, paired overhead "
                  f"{s['overhead_pct_median_of_paired_ratios']}% (this block "
                  f"{s['overhead_pct_per_block'][-1] if s['overhead_pct_per_block'] else None}%), cpu "
                  f"{s['cpu_overhead_pct_median_of_paired_ratios']}%  load {os.getloadavg()[0]:.1f}", flush=True)
        result[f"batch_{batch}"] = {mode: summarize(blocks, roles) for mode, (blocks, roles) in per_mode.items()}
        result[f"batch_{batch}"]["sample_json_outputs"] = samples
    result["loadavg_start_end"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    result["wall_s"] = round(time.time() - t_start, 1)
    for llm in llms:
        llm.llm_engine.shutdown()
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
