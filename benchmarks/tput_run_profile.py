"""Where the 8B 512 x 1000/1000 run goes (issue 17: ``throughput_8b_1000_1000_tok_s`` 7.3k, goal 7.8k), in ONE
engine on one GPU: the workload of ``gpu_e2e.py decode_bs1 --throughput`` (Llama-3-8B shape, dummy weights, bf16,
``max_num_seqs`` 512, 512 prompts of 1,000 random ids, 1,000 output tokens each, default sampling), warmed as
that script warms it, then run once with the hooks of ``nano_run_profile.StepEvents`` (three CUDA events a step:
forward, logits + sampler, the GPU's idle time before the next forward; profiler windows of ``--window`` decode
steps opened at the ``--windows`` decode-step numbers: by default one in the first ~211-row wave, one in the
~90-row tail wave). Each step also records its rows and the sum of its contexts, so the summary can set the
measured GPU time of each step kind against a byte/FLOP model of the same steps (weights beyond the embedding
table once a step at ``--read-tbps``, linear-layer FLOPs at ``--tflops``, KV bytes of every context at the read
rate): the per-step remainder the docs ask about (docs/performance.md "8B throughput, 1000/1000 x 512").

Then, as the budget allows, ``--ab`` variants run in the same engine, each with the step events (no profiler
windows) and its own split, graphs recaptured for each, the prefix cache emptied before every run. A variant is
``+``-joined settings applied to the defaults (``variant@N``: that run takes the first N prompts): a ``nano_run_profile.VARIANTS`` name (``defaults``, ``gemm_off``, ...),
``launch:<OCTAVO_TRITON_DECODE_LAUNCH value>`` (the decode rows' attention launch), ``blas:cublaslt`` (torch's
preferred BLAS library for every cuBLAS GEMM) or ``env:NAME=VALUE`` (a setting read at each lookup). A short
workload (``--prompts 211 --out-len 256``: one wave) keeps each run near 10 s.

    python benchmarks/tput_run_profile.py --out /tmp/tput.json [--budget-s 140]
    python benchmarks/tput_run_profile.py --out /tmp/ab.json --no-events --prompts 211 --out-len 256 \
        --ab defaults blas:cublaslt defaults blas:cublaslt
    python benchmarks/tput_run_profile.py --out /tmp/tput.json --dry   # CPU: a tiny Llama, checks the hooks
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import LLAMA3_8B, JitMisses, gen_timed, make_llm, warm_up, write_config  # noqa: E402
from nano_run_profile import VARIANTS, StepEvents, set_variant  # noqa: E402

BLAS_AT_START: dict = {}  # torch's preferred BLAS library before the first variant (restored by each)
ENV_SET: set[str] = set()  # names an ``env:`` / ``launch:`` setting put into os.environ (undone by the next variant)

T0 = time.perf_counter()


class Stopped(Exception):
    """SIGTERM (the device script's ``timeout``) inside the hooked run: summarize the steps recorded so far."""


def _on_term(signum, frame):
    raise Stopped(f"signal {signum} after {time.perf_counter() - T0:.1f} s")


class ContextEvents(StepEvents):
    """``StepEvents`` + each step's summed context (the KV tokens its attention reads), and a profiler window
    opened at the ``prefill_at``-th step that carries prompt tokens (``StepEvents`` opens them at decode steps)."""

    def __init__(self, worker, windows: tuple[int, ...], window: int, prefill_at: int = 0) -> None:
        super().__init__(worker, windows, window)
        self.prefill_seen, self.prefill_at = 0, prefill_at

    def _forward(self, inputs, *a, **k):
        lay = inputs.layout
        if lay.max_query_len > 1:
            self.prefill_seen += 1
            if self.prefill_seen == self.prefill_at and self.prof is None:
                self._open(lay.num_reqs)
        out = super()._forward(inputs, *a, **k)
        self.steps[-1]["ctx"] = int(lay.seq_lens.sum())
        self.steps[-1]["window"] = self.prof is not None  # a profiled step (its idle is the profiler's)
        return out


def model_split(steps: list[dict], weight_bytes: float, kv_per_token: float, lin_flops_per_token: float,
                read_bps: float, flops: float) -> dict:
    """Measured GPU seconds vs the byte/FLOP model, per step kind: ``wave`` (decode graph, >= 160 rows),
    ``tail`` (decode graph, fewer rows), ``with_prefill`` (eager, prompt tokens); plus a coarse series."""
    kinds: dict[str, dict] = {}
    series, outliers = [], []
    for i, s in enumerate(steps):
        if s["graph"]:
            kind = "wave" if s["rows"] >= 160 else "tail"
        else:
            kind = "decode_eager" if s["rows"] == s["tokens"] else "with_prefill"
        fwd = s["e0"].elapsed_time(s["e1"]) / 1e3
        smp = s["e1"].elapsed_time(s["e2"]) / 1e3 if "e2" in s else 0.0
        idle = 0.0
        if i + 1 < len(steps):
            idle = max(0.0, s["e0"].elapsed_time(steps[i + 1]["e0"]) / 1e3 - fwd - smp)
        lin = max(weight_bytes / read_bps, lin_flops_per_token * s["tokens"] / flops)
        kv = s.get("ctx", 0) * kv_per_token / read_bps
        k = kinds.setdefault(kind, {"steps": 0, "rows": 0, "ctx": 0, "forward_s": 0.0, "logits_sampler_s": 0.0,
                                    "idle_after_s": 0.0, "model_linear_s": 0.0, "model_kv_s": 0.0})
        k["steps"] += 1
        k["rows"] += s["rows"]
        k["ctx"] += s.get("ctx", 0)
        k["forward_s"] += fwd
        k["logits_sampler_s"] += smp
        k["idle_after_s"] += idle
        k["model_linear_s"] += lin
        k["model_kv_s"] += kv
        if idle > 2e-3:  # the GPU waited > 2 ms for this step's successor (a profiler window's start/stop does)
            outliers.append({"step": i, "kind": kind, "rows": s["rows"], "idle_ms": round(idle * 1e3, 2),
                             "window": bool(s.get("window"))})
        if i % 50 == 0 or i == len(steps) - 1:
            series.append({"step": i, "kind": kind, "rows": s["rows"], "ctx": s.get("ctx", 0),
                           "forward_ms": round(fwd * 1e3, 3), "sampler_ms": round(smp * 1e3, 3),
                           "idle_ms": round(idle * 1e3, 3), "model_ms": round((lin + kv) * 1e3, 3)})
    for k in kinds.values():
        n = max(1, k["steps"])
        k["rows_mean"] = k.pop("rows") / n
        k["ctx_mean_per_row"] = k.pop("ctx") / max(1.0, k["rows_mean"] * n)
        gpu = k["forward_s"] + k["logits_sampler_s"]
        k["gpu_s"] = gpu
        k["model_s"] = k["model_linear_s"] + k["model_kv_s"]
        k["remainder_ms_per_step"] = (gpu + k["idle_after_s"] - k["model_s"]) / n * 1e3
        k["gpu_over_model_ms_per_step"] = (gpu - k["model_s"]) / n * 1e3
        k["idle_ms_per_step"] = k["idle_after_s"] / n * 1e3
    tot = {f: sum(k[f] for k in kinds.values()) for f in ("gpu_s", "idle_after_s", "model_s")}
    tot["idle_in_outliers_s"] = sum(o["idle_ms"] for o in outliers) / 1e3
    return {"by_kind": kinds, "totals": tot, "series": series, "idle_outliers": outliers[:200],
            "model": {"weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token,
                      "linear_flops_per_token": lin_flops_per_token, "read_TBps": read_bps / 1e12,
                      "TFLOPs": flops / 1e12}}


def apply_variant(worker, spec: str) -> float:
    """Back to the defaults, then each ``+``-joined setting of ``spec``; recaptures the graphs (seconds)."""
    import torch

    from octavo.plugins.attention import triton as backend

    for name in ENV_SET:
        os.environ.pop(name, None)
    ENV_SET.clear()
    torch.backends.cuda.preferred_blas_library(BLAS_AT_START.setdefault("lib", torch.backends.cuda.preferred_blas_library()))
    nano = "defaults"
    for part in spec.split("+"):
        kind, _, value = part.partition(":")
        if part in VARIANTS:
            nano = part
        elif kind == "launch":
            os.environ["OCTAVO_TRITON_DECODE_LAUNCH"] = value
            ENV_SET.add("OCTAVO_TRITON_DECODE_LAUNCH")
        elif kind == "blas" and value in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(value)
        elif kind == "env" and "=" in value:
            key, _, val = value.partition("=")
            os.environ[key] = val
            ENV_SET.add(key)
        else:
            raise ValueError(f"variant {spec!r}: {part!r} is not a VARIANTS name, launch:, blas:cublas(lt) or env:K=V")
    for impl in [v for layer in worker.attn_layers for v in vars(layer).values()
                 if isinstance(v, backend.TritonAttentionBackend)]:
        impl._launches.clear()
    return set_variant(worker, nano)  # clears the launches again, recaptures


def main() -> None:
    import torch

    from octavo import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=140.0)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--out-len", type=int, default=1000)
    ap.add_argument("--kv-blocks", type=int, default=0,
                    help="KV blocks (num_gpu_blocks_override): an H100's cache on a bigger card (0: sized as usual)")
    ap.add_argument("--window", type=int, default=8, help="decode steps per profiler window")
    ap.add_argument("--windows", type=int, nargs="*", default=[300, 2600], help="decode step numbers opening one")
    ap.add_argument("--prefill-window", type=int, default=30,
                    help="the step with prompt tokens (counted from 1) opening a window of --window steps; 0: none")
    ap.add_argument("--ab", nargs="*", default=[], help="variants (see above), in this order")
    ap.add_argument("--ab-prompts", type=int, default=0, help="the A/B runs take the first N prompts (0: all)")
    ap.add_argument("--no-events", action="store_true", help="no hooked defaults run with profiler windows first")
    ap.add_argument("--read-tbps", type=float, default=3.02, help="the card's read rate (docs: 3.02-3.03)")
    ap.add_argument("--tflops", type=float, default=700.0, help="dense bf16 ceiling (docs: 697 measured)")
    ap.add_argument("--dry", action="store_true", help="CPU: a tiny Llama, 24 requests; checks the hooks")
    args = ap.parse_args()
    if args.dry:
        torch.cuda.synchronize = lambda *a: None  # gen_timed's syncs; nothing runs on a GPU here
    res: dict = {"card": "cpu (dry run)" if args.dry else torch.cuda.get_device_name(),
                 "command": " ".join(["python", *sys.argv]), "runs": []}

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - T0
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def fits(need: float) -> bool:
        return time.perf_counter() - T0 + need < args.budget_s

    cfg = dict(LLAMA3_8B)
    kw = dict(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=512, max_num_batched_tokens=8192)
    num, in_len, out_len, ids = args.prompts, 1000, args.out_len, (1000, 120000)
    if args.dry:
        cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512, bos_token_id=1, eos_token_id=2)
        kw = dict(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=256)
        num, in_len, out_len, ids = 24, 40, 24, (3, 500)
    if args.kv_blocks:
        kw["num_gpu_blocks_override"] = args.kv_blocks
    with tempfile.TemporaryDirectory() as tmp:
        jit = JitMisses()
        llm, worker, info = make_llm(write_config(cfg, tmp, "llama3-8b"), **kw)
        model = worker.runner.model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) \
            - model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_per_token = cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 2 * 2
        lin_flops = 2 * weight_bytes / 2  # 2 FLOPs per bf16 weight element per token (attention excluded)
        res.update(fused=info.get("fused"), graph_sizes=info.get("graph_sizes"), kv_blocks=worker.num_blocks,
                   kv_blocks_override=args.kv_blocks or None, kv_sizing=getattr(worker, "kv_sizing", None),
                   start_s=time.perf_counter() - T0)
        rng = random.Random(0)  # the timed prompts of gpu_e2e.py (its bs1 prompt is drawn first)
        _ = [rng.randrange(*ids) for _ in range(512)]
        prompts = [{"prompt_token_ids": [rng.randrange(*ids) for _ in range(in_len)]} for _ in range(num)]
        # the same warm-up as gpu_e2e.py's throughput (64 prompts of the length, 1-32 outputs, short lone prefills)
        res["warmup_s"] = warm_up(llm, [(in_len, 1 + i % 32) for i in range(min(num, 64))], seed=11, ids=ids)
        for n in (2, 3, 5):
            res["warmup_s"] += warm_up(llm, [(n, 1)], seed=12 + n, ids=ids)
        res["warmed"] = True
        print(f"engine ready + warmed in {time.perf_counter() - T0:.1f} s (warm-up {res['warmup_s']:.1f} s)",
              flush=True)
        save()
        params = SamplingParams(max_tokens=out_len, ignore_eos=True)
        per_prompt = 75.0 / 512  # seconds a prompt of the last run took (the A/B runs' budget check)

        def timed(name: str, use: list, **extra) -> None:
            nonlocal per_prompt
            reset = llm.reset_prefix_cache()
            mark = len(jit.log)
            before = llm.llm_engine.get_stats()
            dt, outs = gen_timed(llm, use, params)
            after = llm.llm_engine.get_stats()
            extra["triton_builds_in_run"] = jit.since(mark)
            per_prompt = dt / max(1, len(use))
            total = sum(len(o.outputs[0].token_ids) for o in outs)
            run = {"run": name, "prompts": len(use), "seconds": dt, "output_tokens": total, "tok_s": total / dt,
                   "prefix_cache_reset": reset,
                   **{k: getattr(after, k) - getattr(before, k) for k in ("num_steps", "num_preemptions")}, **extra}
            print(json.dumps(run), flush=True)
            res["runs"].append(run)
            save()

        if not args.no_events:
            rec = ContextEvents(worker, tuple(args.windows), args.window, args.prefill_window)
            signal.signal(signal.SIGTERM, _on_term)
            try:
                timed("events (defaults, hooked: 3 CUDA events a step + profiler windows)", prompts)
            except Stopped as e:  # partial: the steps so far (the run's JSON says so)
                res["runs"].append({"run": "events (stopped)", "stopped": str(e), "steps_recorded": len(rec.steps)})
                args.ab = []
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                if rec.prof is not None:  # a window still open (the run was stopped inside it)
                    try:
                        rec.prof.stop()
                    except Exception as e:  # noqa: BLE001 - stopped before the window's start: drop it
                        res["window_error"] = repr(e)[:200]
                    rec.prof = None
                rec.remove()
            if rec.steps and "e2" not in rec.steps[-1]:
                rec.steps.pop()  # a step cut mid-way
            res["steps"] = rec.summary()
            res["windows"] = rec.windows
            res["split"] = model_split(rec.steps, weight_bytes, kv_per_token, lin_flops,
                                       args.read_tbps * 1e12, args.tflops * 1e12)
            print(json.dumps({k: v for k, v in res["split"].items() if k != "series"}, indent=1), flush=True)
            for w in rec.windows:
                print(f"--- window at {w['rows_at_start']} rows: GPU span {w['gpu_span_us_per_step']:.0f} us/step, "
                      f"busy {w['gpu_busy_us_per_step']:.0f}", flush=True)
                for r in w["kernels"][:24]:
                    print(f"{r['us_per_step']:9.1f} us/step {r['calls_per_step']:6.1f}x  {r['name']}", flush=True)
            save()
        for name in args.ab:
            spec, _, n_use = name.partition("@")  # "variant@N": this run takes the first N prompts
            use = prompts[:int(n_use) if n_use else (args.ab_prompts or None)]
            if not fits(per_prompt * len(use) + 5):
                res["runs"].append({"run": name, "skipped": "time budget"})
                continue
            cap = 0.0 if args.dry else apply_variant(worker, spec)
            rec = ContextEvents(worker, (), args.window)
            try:
                timed(name, use, recapture_s=cap)
            finally:
                rec.remove()
            split = model_split(rec.steps, weight_bytes, kv_per_token, lin_flops, args.read_tbps * 1e12,
                                args.tflops * 1e12)
            res["runs"][-1]["split"] = {k: split[k] for k in ("by_kind", "totals")}
            print(json.dumps({kind: {f: round(v, 4) for f, v in k.items()} for kind, k in split["by_kind"].items()}),
                  flush=True)
            save()
        save()
        llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
