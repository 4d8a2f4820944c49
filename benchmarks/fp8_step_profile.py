"""Where an engine step of the big-batch 8B run goes (issue 9: fp8 + fp8 KV reached 7.7k tok/s, goal 10k).

Runs the Llama-3-8B shape with ``--layers`` layers (default 8: every layer's kernels are the 32-layer model's,
and the load / prefill fit a 75 s device slot; per-step host work does not shrink with the layers, so the
summary also extrapolates the GPU part to 32 layers) through ``LLM.generate`` on ``--prompts`` x
``--in-len`` / ``--out-len`` with ``max_num_seqs=512``, and records per engine step, from hooks on the model
runner (no change to the engine):

- its kind (decode-only through a CUDA graph, decode-only eager, or with prefill tokens), rows and tokens;
- GPU time of the forward and of logits + sampling (CUDA events, read after the run), and the wall time of
  ``ModelRunner.execute`` and of ``EngineCore.step`` (the rest is the core's host work);
- a torch.profiler kernel table of a few decode steps at the full batch replayed from the graph, then of two
  steps run eagerly (same kernels, launched one by one), so kernels are named either way; and of one step that
  carries prefill tokens next to hundreds of decodes.

    python benchmarks/fp8_step_profile.py --variant fp8 --out /tmp/fp8_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.perf_counter()
CUDA = torch.cuda.is_available()


class _Event:
    """torch.cuda.Event with timing; on a CPU dry run a host clock (the device work is already done)."""

    def __init__(self) -> None:
        self.ev = torch.cuda.Event(enable_timing=True) if CUDA else None
        self.t = 0.0

    def record(self) -> None:
        if self.ev is not None:
            self.ev.record()
        else:
            self.t = time.perf_counter()

    def elapsed_time(self, other: _Event) -> float:
        return self.ev.elapsed_time(other.ev) if self.ev is not None else (other.t - self.t) * 1e3


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def kernel_table(prof, steps: int, limit: int = 30) -> list[dict]:
    """Per-kernel device time (µs per step) of a profiled window, largest first."""
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0.0)
        if not CUDA:  # dry run: host time of the operators
            dev_us = e.self_cpu_time_total
        if dev_us and dev_us > 0:
            rows.append({"name": e.key[:120], "us_per_step": dev_us / steps, "calls_per_step": e.count / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:limit]


class StepRecorder:
    """Hooks on ModelRunner.execute / forward and the runner's host transfer; profiler windows."""

    def __init__(self, runner, full_batch: int, graph_window: int = 3, eager_window: int = 2) -> None:
        from octavo.core import model_runner as mr

        self.runner, self.full_batch = runner, full_batch
        self.steps: list[dict] = []
        self.pending: dict | None = None
        self.full_seen = 0
        self.windows = {"graph": graph_window, "eager": eager_window, "mixed": 1}
        self.profiles: dict = {}
        self.prof = None
        self.prof_kind = None
        self.prof_left = 0
        self.on_window = lambda: None  # called after each profiled window (partial results, in case of a timeout)
        recorder = self
        orig_execute, orig_forward, orig_to_host = type(runner).execute, type(runner).forward, mr._to_host

        def execute(self_, batch, grammar=None):
            return recorder.execute(orig_execute, self_, batch, grammar)

        def forward(self_, inputs, mm_embeds=None):
            ev0 = _Event()
            ev0.record()
            out = orig_forward(self_, inputs, mm_embeds)
            ev1 = _Event()
            ev1.record()
            if recorder.pending is not None:
                recorder.pending["ev"] = [ev0, ev1]
            return out

        def to_host(pending, synchronize):
            if recorder.pending is not None and "ev" in recorder.pending:
                ev2 = _Event()
                ev2.record()
                recorder.pending["ev"].append(ev2)
            return orig_to_host(pending, synchronize)

        runner.execute = execute.__get__(runner)
        runner.forward = forward.__get__(runner)
        mr._to_host = to_host

    def execute(self, orig, runner, batch, grammar):
        sched = batch.scheduled
        tokens = sum(len(s.token_ids) for s in sched)
        decode_only = tokens == len(sched) and len(sched) > 0
        full = decode_only and len(sched) >= self.full_batch
        kind = None
        if full and self.prof is None and self.full_seen >= 5:  # a few full steps in: open the next window
            for k in ("graph", "eager"):
                if k not in self.profiles:
                    kind = k
                    break
        elif self.prof is None and not decode_only and len(sched) >= self.full_batch // 2 \
                and "mixed" not in self.profiles:  # a prefill chunk riding with hundreds of decodes
            kind = "mixed"
        if kind is not None:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
            self.prof, self.prof_kind, self.prof_left = profile(activities=acts), kind, self.windows[kind]
            self.prof.start()
        gr = runner.graph_runner
        eager = self.prof_kind == "eager" and self.prof is not None
        if eager:
            runner.graph_runner = None
        replays = gr.num_replays if gr is not None else 0
        self.pending = {"rows": len(sched), "tokens": tokens, "decode_only": decode_only}
        t = time.perf_counter()
        try:
            result = orig(runner, batch, grammar)
        finally:
            runner.graph_runner = gr
        self.pending["execute_s"] = time.perf_counter() - t
        self.pending["graph"] = gr is not None and gr.num_replays > replays
        if "ev" in self.pending and len(self.pending["ev"]) == 2:
            ev2 = _Event()
            ev2.record()
            self.pending["ev"].append(ev2)
        self.steps.append(self.pending)
        self.pending = None
        self.full_seen += full
        if self.prof is not None:
            self.prof_left -= 1
            if self.prof_left == 0:
                _sync()
                self.prof.stop()
                n = self.windows[self.prof_kind]
                self.profiles[self.prof_kind] = {"steps": n, "rows": len(sched), "tokens": tokens,
                                                 "kernels": kernel_table(self.prof, n)}
                self.prof = None
                self.on_window()
        return result

    def resolve(self) -> None:
        _sync()
        for s in self.steps:
            ev = s.pop("ev", None)
            if ev and len(ev) == 3:
                s["forward_ms"] = ev[0].elapsed_time(ev[1])
                s["logits_sample_ms"] = ev[1].elapsed_time(ev[2])


def summarize(steps: list[dict], core_steps: list[float], layers: int) -> dict:
    out = {}
    groups = {"decode_graph": [s for s in steps if s["decode_only"] and s["graph"]],
              "decode_eager": [s for s in steps if s["decode_only"] and not s["graph"]],
              "with_prefill": [s for s in steps if not s["decode_only"]]}
    for name, g in groups.items():
        if not g:
            continue
        fwd = [s.get("forward_ms", 0.0) for s in g]
        smp = [s.get("logits_sample_ms", 0.0) for s in g]
        out[name] = {"steps": len(g), "rows_mean": sum(s["rows"] for s in g) / len(g),
                     "tokens_total": sum(s["tokens"] for s in g),
                     "execute_s_total": sum(s["execute_s"] for s in g), "forward_ms_total": sum(fwd),
                     "logits_sample_ms_total": sum(smp)}
    big = [s for s in groups["decode_graph"] if s["rows"] >= max(s2["rows"] for s2 in steps) - 16] if steps else []
    if big:
        n = len(big)
        fwd = sum(s.get("forward_ms", 0.0) for s in big) / n
        smp = sum(s.get("logits_sample_ms", 0.0) for s in big) / n
        exe = sum(s["execute_s"] for s in big) / n * 1e3
        out["full_batch_decode"] = {
            "steps": n, "rows": big[0]["rows"], "forward_ms": fwd, "logits_sample_ms": smp, "execute_wall_ms": exe,
            "runner_host_ms (execute wall - GPU)": exe - fwd - smp,
            "forward_ms_extrapolated_to_32_layers": fwd * 32 / layers}
    if core_steps:
        out["engine_step_wall_s_total"] = sum(core_steps)
        out["engine_steps"] = len(core_steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--in-len", type=int, default=1000)
    ap.add_argument("--out-len", type=int, default=100)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry", action="store_true", help="CPU: a tiny model (bf16), small workload; checks the hooks")
    args = ap.parse_args()

    from benchmarks.gpu_e2e import LLAMA3_8B, write_config
    from octavo import LLM, SamplingParams
    from octavo.core.engine_core import EngineCore

    cfg = dict(LLAMA3_8B, num_hidden_layers=args.layers)
    llm_kw = dict(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=8192, async_scheduling=False)  # sync: each step's host and GPU parts apart
    if args.dry:
        cfg.update(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=1024, bos_token_id=1, eos_token_id=2)
        args.prompts, args.in_len, args.out_len, args.max_num_seqs = 24, 40, 24, 16
        llm_kw = dict(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=256, async_scheduling=False)
    res = {"card": torch.cuda.get_device_name() if CUDA else "cpu (dry run)", "torch": torch.__version__,
           "args": vars(args)}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    tmp = tempfile.mkdtemp()
    d = write_config(cfg, tmp, "llama3-8b")
    kw = dict(quantization="fp8", kv_cache_dtype="fp8") if args.variant == "fp8" else {}
    print(f"[{time.perf_counter() - T0:.1f} s] imports done, building the engine", flush=True)
    t = time.perf_counter()
    llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, **llm_kw, **kw)
    core = llm.llm_engine.core
    worker = core.executor.driver
    info = worker.prepared.notes if worker.prepared is not None else {}
    res.update(load_s=time.perf_counter() - t, kv_blocks=worker.num_blocks, fused=info.get("fused"),
               graph_sizes=len(info.get("graph_sizes") or []),
               async_scheduling=core.async_loop is not None)
    print(json.dumps(res), flush=True)
    save()
    rng = random.Random(0)
    hi = cfg["vocab_size"] - 1
    prompts = [{"prompt_token_ids": [rng.randrange(3, hi) for _ in range(args.in_len)]}
               for _ in range(args.prompts)]
    llm.generate(prompts[:4], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up

    rec = StepRecorder(worker.runner, full_batch=min(args.prompts, args.max_num_seqs) - 16)
    core_steps: list[float] = []
    orig_step = EngineCore.step

    def step(self_):
        t0 = time.perf_counter()
        out = orig_step(self_)
        core_steps.append(time.perf_counter() - t0)
        return out

    core.step = step.__get__(core)

    def partial():
        rec.resolve()
        res.update(partial=True, summary=summarize(rec.steps, core_steps, args.layers), profiles=rec.profiles)
        save()

    rec.on_window = partial
    timers0 = dict(core.step_timers.as_dict())
    _sync()
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=args.out_len, ignore_eos=True), use_tqdm=False)
    _sync()
    wall = time.perf_counter() - t
    rec.resolve()
    timers = {k: v - timers0.get(k, 0) for k, v in core.step_timers.as_dict().items()}
    total = sum(len(o.outputs[0].token_ids) for o in outs)
    res.update(partial=False, run_s=wall, output_tokens=total, output_tok_s=total / wall, step_timers=timers,
               preemptions=core.scheduler.stats.num_preemptions,
               summary=summarize(rec.steps, core_steps, args.layers), profiles=rec.profiles,
               steps=[{k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()} for s in rec.steps])
    save()
    print(json.dumps({k: res[k] for k in ("run_s", "output_tok_s", "step_timers", "preemptions", "summary")},
                     indent=1), flush=True)
    for kind, p in rec.profiles.items():
        print(f"--- {kind} window: {p['steps']} steps at {p['rows']} rows, device us per step")
        for r in p["kernels"][:20]:
            print(f"{r['us_per_step']:10.1f}  x{r['calls_per_step']:6.1f}  {r['name']}")
    print(f"done in {time.perf_counter() - T0:.1f} s", flush=True)
    del llm


if __name__ == "__main__":
    main()
