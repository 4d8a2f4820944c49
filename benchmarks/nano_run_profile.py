"""Where the whole nano-vllm run goes (issue 17: 18.0k tok/s warm, goal 20k), in ONE engine on one GPU.

The workload of ``gpu_e2e.py qwen3_nanovllm`` (Qwen3-0.6B shape, 256 x U[100, 1024] in/out, temperature 0.6),
warmed first with ``gpu_e2e.warm_up`` (every prompt length, short outputs: nothing compiles in a timed run), then:

1. ``timed``: the run as the headline times it (nothing hooked);
2. ``events``: the same run with three CUDA events per engine step (before the forward, after it, after the
   sampler) and two CUDA-only profiler windows of ``--window`` decode steps (early: full batch; late: about
   half). Per step kind (decode through a CUDA graph / with prefill tokens) it sums the GPU time of the forward
   and of logits + sampling, and the GPU's idle time between one step's sampler and the next step's forward
   (host time the GPU waited for). The windows give a kernel table and the GPU's busy share from the kernels'
   own start/end times;
3. ``--ab`` variants, each timed after switching every attention layer and recapturing the CUDA graphs:
   ``split_4_8`` (``OCTAVO_TRITON_SPLIT_KV=4,8``: the run's last few hundred steps, under 4 x SMs requests x KV
   heads, split their long contexts over ~8 programs per SM instead of running 1-4 programs per SM), ``old`` (the
   general kernel for decode rows, what ``OCTAVO_TRITON_DECODE_KERNEL=0`` selects at start), ``attn_pdl_off``
   (``OCTAVO_TRITON_PDL=0``: attention launches without programmatic dependent launch), ``gemm_off``
   (``OCTAVO_TRITON_GEMM=0``: cuBLAS for the projections ``cuda_gemm.TABLE`` lists), ``defaults``.

    python benchmarks/nano_run_profile.py --out /tmp/nano_run.json [--budget-s 60] [--ab split_4_8 old]

Every timed run starts with an empty prefix cache (``LLM.reset_prefix_cache``): the runs repeat the same
prompts, and a cached prompt would skip its prefill. Stages stop being started when ``--budget-s`` would be exceeded (device scripts are time-boxed); the JSON is
written after every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_e2e import (  # noqa: E402
    JitMisses,
    gen_timed,
    make_llm,
    nanovllm_workload,
    qwen3_config,
    warm_up,
    write_config,
)
from nano_sampler import kernel_table  # noqa: E402
from step_trace import busy_us  # noqa: E402

T0 = time.perf_counter()


class HostEvent:
    """``--dry`` (CPU): a host clock in place of a CUDA event (the work is done when the call returns)."""

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, other: HostEvent) -> float:
        return (other.t - self.t) * 1e3


class StepEvents:
    """CUDA events around every engine step's forward and sampler (hooks on the runner; no engine change)."""

    def __init__(self, worker, windows: tuple[int, ...], window: int) -> None:
        import torch

        self.torch, self.runner, self.model = torch, worker.runner, worker.runner.model
        self.cuda = torch.cuda.is_available()
        self.graphs = self.runner.graph_runner
        self.steps: list[dict] = []
        self.decode_seen = 0
        self.window_starts, self.window = set(windows), window
        self.prof, self.prof_left, self.prof_rows = None, 0, 0
        self.windows: list[dict] = []
        self.profs: list = []
        self.real_forward, self.real_sampler = self.runner.forward, self.runner.sampler
        rec = self

        class Sampler:  # the runner calls self.sampler(logits, batch)
            def __call__(self, logits, b):
                out = rec.real_sampler(logits, b)
                if rec.steps and "e2" not in rec.steps[-1]:
                    rec.steps[-1]["e2"] = rec._ev()
                    rec.steps[-1]["h2"] = time.perf_counter()
                rec._after_step()
                return out

            def __getattr__(self, name):
                return getattr(rec.real_sampler, name)

        self.runner.forward, self.runner.sampler = self._forward, Sampler()

    def _ev(self):
        e = self.torch.cuda.Event(enable_timing=True) if self.cuda else HostEvent()
        e.record()
        return e

    def _forward(self, inputs, *a, **k):
        before = self.graphs.num_replays if self.graphs else 0
        lay = inputs.layout
        step = {"rows": lay.num_reqs, "tokens": lay.num_tokens}
        if lay.max_query_len == 1:
            self.decode_seen += 1
            if self.decode_seen in self.window_starts and self.prof is None:
                self._open(lay.num_reqs)
        step["h0"] = time.perf_counter()
        step["e0"] = self._ev()
        out = self.real_forward(inputs, *a, **k)
        step["e1"] = self._ev()
        step["h1"] = time.perf_counter()
        step["graph"] = bool(self.graphs and self.graphs.num_replays > before)
        self.steps.append(step)
        return out

    def _open(self, rows: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._sync()
        act = ProfilerActivity.CUDA if self.cuda else ProfilerActivity.CPU
        self.prof, self.prof_left, self.prof_rows = profile(activities=[act]), self.window, rows
        self.prof.start()

    def _after_step(self) -> None:
        if self.prof is None:
            return
        self.prof_left -= 1
        if self.prof_left == 0:
            self._sync()
            self.prof.stop()
            self.profs.append((self.prof, self.prof_rows))  # read after the run: not on the engine's step thread
            self.prof = None

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def remove(self) -> None:
        del self.runner.forward
        self.runner.sampler = self.real_sampler
        if self.prof is not None:
            self.prof.stop()
            self.prof = None

    def summary(self) -> dict:
        """Seconds of GPU time per step kind: forward, logits + sampler, and idle before the next forward."""
        self._sync()
        self.windows = [window_summary(p, self.window, rows, dry=not self.cuda) for p, rows in self.profs]
        kinds: dict[str, dict] = {}
        steps = self.steps
        for i, s in enumerate(steps):
            kind = "decode_graph" if s["graph"] else ("decode_eager" if s["rows"] == s["tokens"] else "with_prefill")
            if kind == "decode_graph":  # by batch size: the run's long middle vs its small-batch tail
                lo = next(b for b in (129, 67, 34, 17, 1) if s["rows"] >= b)
                kind = f"decode_graph_rows_{lo}+"
            k = kinds.setdefault(kind, {"steps": 0, "rows": 0, "tokens": 0, "forward_s": 0.0,
                                        "logits_sampler_s": 0.0, "idle_after_s": 0.0, "host_forward_call_s": 0.0,
                                        "host_logits_sampler_calls_s": 0.0, "host_step_period_s": 0.0})
            fwd = s["e0"].elapsed_time(s["e1"]) / 1e3
            smp = s["e1"].elapsed_time(s["e2"]) / 1e3 if "e2" in s else 0.0
            k["steps"] += 1
            k["rows"] += s["rows"]
            k["tokens"] += s["tokens"]
            k["forward_s"] += fwd
            k["logits_sampler_s"] += smp
            k["host_forward_call_s"] += s["h1"] - s["h0"]
            k["host_logits_sampler_calls_s"] += s.get("h2", s["h1"]) - s["h1"]
            if i + 1 < len(steps):
                k["host_step_period_s"] += steps[i + 1]["h0"] - s["h0"]
                k["idle_after_s"] += max(0.0, s["e0"].elapsed_time(steps[i + 1]["e0"]) / 1e3 - fwd - smp)
        for k in kinds.values():
            k["rows_mean"] = k.pop("rows") / max(1, k["steps"])
        span = steps[0]["e0"].elapsed_time(steps[-1].get("e2", steps[-1]["e1"])) / 1e3 if steps else 0.0
        return {"gpu_span_s": span, "by_kind": kinds,
                "note": "forward = graph-input copies + replay (or the eager forward); idle_after = GPU time from "
                        "one step's sampler end to the next step's forward start not covered by either "
                        "(the GPU waited for the host); host_* = wall time on the step thread: inside the forward "
                        "call, from its return to the sampler's, and from one forward call to the next (the host's "
                        "step period; under async scheduling the host runs ahead of the GPU)"}


def window_summary(prof, steps: int, rows: int, dry: bool = False) -> dict:
    """Kernel table of a profiler window and the GPU's busy share inside it (kernel/memcpy intervals merged)."""
    spans = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") or (dry and e.cpu_parent is None):
            tr = e.time_range
            spans.append((tr.start, tr.end))
    spans.sort()
    busy = busy_us(spans)
    span = (spans[-1][1] - spans[0][0]) if spans else 0.0
    return {"steps": steps, "rows_at_start": rows, "gpu_span_us_per_step": span / steps,
            "gpu_busy_us_per_step": busy / steps, "busy_share": busy / span if span else None,
            "kernels": kernel_table(prof, steps, limit=30)}


def attention_impls(worker) -> list:
    from octavo.plugins.attention.triton import TritonAttentionBackend

    out = []
    for layer in worker.attn_layers:
        out += [v for v in vars(layer).values() if isinstance(v, TritonAttentionBackend)]
    return out


VARIANTS = {  # name: (general kernel for decode rows, triton.SPLIT_RULE, triton.ATTN_PDL, cuda_gemm on); None: default
    "defaults": (False, None, True, True),
    "old": (True, None, True, True),  # what OCTAVO_TRITON_DECODE_KERNEL=0 selects at start
    "split_4_8": (False, (4, 8), True, True),  # OCTAVO_TRITON_SPLIT_KV=4,8: small batches split, 8 programs/SM
    "split_2_8": (False, (2, 8), True, True),
    "attn_pdl_off": (False, None, False, True),  # OCTAVO_TRITON_PDL=0: plain attention launches
    "gemm_off": (False, None, True, False),  # OCTAVO_TRITON_GEMM=0: cuBLAS for every multi-row projection
}


def set_variant(worker, name: str) -> float:
    """Switch every triton attention layer to a variant (see ``VARIANTS``) and recapture the CUDA graphs."""
    from octavo.plugins.attention import triton as backend
    from octavo.plugins.platforms import cuda_gemm

    general, rule, pdl, gemm = VARIANTS[name]
    cuda_gemm.set_triton_gemm(gemm)
    impls = attention_impls(worker)
    if not impls:
        raise RuntimeError("no triton attention layers found")
    backend.SPLIT_RULE = rule or backend.DEFAULT_SPLIT_RULE
    backend.ATTN_PDL = pdl
    for impl in impls:
        impl.decode_kernel = False if general else None
        impl._launches.clear()
    t = time.perf_counter()
    worker.runner.graph_runner.capture()
    return time.perf_counter() - t


def main() -> None:
    import torch

    from octavo import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--ab", nargs="*", choices=sorted(VARIANTS), default=["split_4_8", "old", "split_2_8"],
                    help="variants timed after the defaults, in this order, each with the graphs recaptured")
    ap.add_argument("--window", type=int, default=16, help="decode steps per profiler window")
    ap.add_argument("--windows", type=int, nargs="*", default=[120, 600], help="decode step numbers opening a window")
    ap.add_argument("--no-events", action="store_true", help="skip stage 2 (the hooked run): A/B time only")
    ap.add_argument("--dry", action="store_true", help="CPU: a tiny Qwen3, 24 requests; checks the hooks")
    args = ap.parse_args()
    if args.dry:
        torch.cuda.synchronize = lambda *a: None  # gen_timed's syncs; nothing runs on a GPU here
    res: dict = {"card": "cpu (dry run)" if args.dry else torch.cuda.get_device_name(), "command": " ".join(["python", *sys.argv]), "runs": []}

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - T0
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    def fits(need: float) -> bool:
        return time.perf_counter() - T0 + need < args.budget_s

    with tempfile.TemporaryDirectory() as tmp:
        cfg, arch = qwen3_config()
        kw = dict(max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=8192)
        reqs = nanovllm_workload()
        if args.dry:
            cfg = dict(cfg, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, vocab_size=512, bos_token_id=1, eos_token_id=2)
            kw = dict(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=256)
            reqs = [([t % 500 for t in ids[:40]], 1 + n % 24) for ids, n in nanovllm_workload(num=24)]
        d = write_config(cfg, tmp, "qwen3-0.6b")
        jit = JitMisses()
        llm, worker, info = make_llm(d, **kw)
        res.update(architecture=arch, fused=info.get("fused"), start_s=time.perf_counter() - T0,
                   kv_blocks=worker.num_blocks)
        res["warmup_s"] = warm_up(llm, [(len(ids), 1 + i % 32) for i, (ids, _) in enumerate(reqs)], seed=11,
                                  temperature=0.6, ids=(3, 500) if args.dry else (20000, 120000))
        res["warmed"] = True
        print(f"engine ready + warmed in {time.perf_counter() - T0:.1f} s (warm-up {res['warmup_s']:.1f} s)",
              flush=True)
        save()
        prompts = [{"prompt_token_ids": ids} for ids, _ in reqs]
        params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.6) for _, n in reqs]
        last = 10.0

        def timed(name: str, **extra) -> None:
            nonlocal last
            reset = llm.reset_prefix_cache()  # every run prefills all its prompts, as the first one does
            mark = len(jit.log)
            dt, outs = gen_timed(llm, prompts, params)
            extra["triton_builds_in_run"] = jit.since(mark)
            if extra["triton_builds_in_run"]:
                extra["triton_build_keys_in_run"] = jit.keys_since(mark)
            last = dt
            total = sum(len(o.outputs[0].token_ids) for o in outs)
            run = {"run": name, "seconds": dt, "output_tokens": total,
                   "throughput_qwen3_0p6b_nanovllm_tok_s": total / dt, "prefix_cache_reset": reset, **extra}
            print(json.dumps(run), flush=True)
            res["runs"].append(run)
            save()

        timed("timed (defaults)")
        if not args.no_events and fits(last * 1.3 + 4):
            rec = StepEvents(worker, tuple(args.windows), args.window)
            try:
                timed("events (defaults, hooked: 3 CUDA events a step + profiler windows)")
            finally:
                rec.remove()
            res["steps"] = rec.summary()
            res["windows"] = rec.windows
            print(json.dumps(res["steps"], indent=1), flush=True)
            for w in rec.windows:
                print(f"--- window at {w['rows_at_start']} rows: GPU span {w['gpu_span_us_per_step']:.0f} us/step, "
                      f"busy {w['gpu_busy_us_per_step']:.0f}", flush=True)
                for r in w["kernels"][:18]:
                    print(f"{r['us_per_step']:9.1f} us/step {r['calls_per_step']:6.1f}x  {r['name']}", flush=True)
            save()
        for name in [] if args.dry else args.ab:
            if not fits(last + 3):  # a recapture takes 1-2 s
                res["runs"].append({"run": name, "skipped": "time budget"})
                continue
            cap = set_variant(worker, name)
            timed(name, recapture_s=cap, split_rule=list(VARIANTS[name][1] or []) or "default",
                  decode_rows="general kernel" if VARIANTS[name][0] else "launch table", attn_pdl=VARIANTS[name][2],
                  triton_gemm=VARIANTS[name][3])
        save()
        llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
