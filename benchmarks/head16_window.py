"""gpu_e2e.py decode_bs1's two windows, step by step (session 17, engineer head17; benchmarks/device/head16.sh s17a).

The key ``decode_bs1_strict_fraction_of_roofline`` = (t(513 tokens) - t(1 token)) / 512, best of two generations
each, after a 512-token prompt; its second window (t(513) - t(257)) / 256 read 0.09-0.13 ms/token over the first
(sessions 15-16) while the device step grows only 3-10 us from context 640 to 897. This runs the same engine (8B
shape, dummy weights, fp8 weights + fp8 KV, ``max_num_seqs`` 512 = 51 graph sizes, ``max_num_batched_tokens`` 8192,
async scheduling, prefix caching as default) and the same sequence (warm-up of 16 tokens, then 1, 1, 257, 257, 513,
513 tokens), ``--rounds`` times, alternating: even rounds plain (nothing wrapped: the key as gpu_e2e.py
reads it), odd rounds with every step recorded (benchmarks/head16_steps.py: host and device intervals, whether
the device waited for the host, the GC, the time before the first and after the last step). Per generation also
the one-graph step's replays (``OCTAVO_GRAPH_STEP``: how many decode steps fell back to the plain path).
``--extras``: a recorded round with the one-graph step off, and 513-token generations after 2 s idle vs after 2 s
of device-to-device copies (does the device step depend on how long the card has been busy: clocks, power, heat).

    python benchmarks/head16_window.py --out /tmp/w.json             # GPU
    python benchmarks/head16_window.py --dry --out /tmp/w.json       # CPU: a tiny model, the plumbing
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
T0 = time.perf_counter()
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            max_position_embeddings=4096, torch_dtype="float32")
SEQUENCE = (1, 1, 257, 257, 513, 513)  # gpu_e2e.py task_decode_bs1: best(1), best(n + 1), best(2n + 1)
EXTRA_S = {"plain_path": 9, "stacks": 4, "hot": 17}  # seconds each extra takes on an H100 (what the rounds leave it)


def key_of(times: dict, n: int = 256) -> dict:
    """gpu_e2e.py's windows and per-token mean from ``{tokens: [seconds, seconds]}`` (best of two)."""
    t1, t2, t3 = (min(times[k]) for k in (1, n + 1, 2 * n + 1))
    return {"ms_per_token": (t3 - t1) / (2 * n) * 1e3, "ms_per_token_ctx_513_768": (t2 - t1) / n * 1e3,
            "ms_per_token_ctx_769_1024": (t3 - t2) / n * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="sequences run; even ones plain, odd ones recorded")
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--budget", type=float, default=1e9, help="start no round after this many seconds")
    ap.add_argument("--extras", default="plain_path,stacks,hot", help="after the rounds: plain_path (a recorded round with "
                    "the one-graph step off), stacks (a recorded 513-token generation with the host's threads sampled "
                    "every 2 ms), hot (513-token generations after 2 s idle vs 2 s of device copies)")
    ap.add_argument("--dry", action="store_true", help="CPU: a tiny float32 model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from gpu_e2e_common import LLAMA3_8B, make_llm, write_config
    from head16_steps import StepRecorder, summarize

    from octavo import SamplingParams

    cuda = torch.cuda.is_available() and not args.dry
    res: dict = {"card": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                 "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "rounds": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    d = write_config(TINY if args.dry else LLAMA3_8B, tempfile.mkdtemp(), "tiny" if args.dry else "llama3-8b")
    # (async scheduling is the default on a GPU; the dry run asks for it, so it checks the same plumbing)
    kw = {"async_scheduling": True} if args.dry else {"quantization": "fp8", "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.9}
    t = time.perf_counter()
    llm, worker, info = make_llm(d, max_model_len=4096, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=8192,
                                 **kw)
    res["load_s"] = time.perf_counter() - t
    res["graph_sizes"] = len(info.get("graph_sizes") or [])
    res["async_scheduling"] = llm.llm_engine.core.async_loop is not None
    gr = worker.runner.graph_runner
    sg = getattr(gr, "step_graph", None)
    res["step_graph"] = sg is not None and sg.graph is not None
    rng = random.Random(0)
    lo, hi = (1, 500) if args.dry else (1000, 120000)
    prompt = {"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(512)]}
    rec = StepRecorder(llm, cuda)

    def gen(tokens: int) -> tuple[float, float, float, list]:
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0),
                           use_tqdm=False)
        if cuda:
            torch.cuda.synchronize()
        return t, time.perf_counter(), list(out[0].outputs[0].token_ids)

    gen(16)  # gpu_e2e.py's warm-up
    ref_tokens: dict = {}
    print("loaded", json.dumps({k: v for k, v in res.items() if k != "rounds"}), flush=True)

    def gen_row(n: int, recorded: bool) -> tuple[dict, float]:
        before = (sg.replays, sg.from_prev) if sg is not None else (0, 0)
        g_before = gr.num_replays if gr is not None else 0
        t0 = rec.start() if recorded else None
        t_s, t_e, toks = gen(n)
        row = {"tokens": n, "s": round(t_e - t_s, 6), "tokens_equal": ref_tokens.setdefault(n, toks) == toks,
               "unix_end": round(time.time(), 3)}  # to place it in head16.sh's nvidia-smi log
        if sg is not None:
            row["step_graph_replays"] = sg.replays - before[0]
            row["from_prev"] = sg.from_prev - before[1]
        if gr is not None:
            row["graph_replays"] = gr.num_replays - g_before
        if recorded:
            row.update(summarize(rec, t0, t_e))
        return row, t_e - t_s

    def show(tag: str, gens: list) -> None:
        for g in gens:
            if g["tokens"] > 1 and "slowest" in g:
                print(f"  {tag} {g['tokens']}:", json.dumps({k: v for k, v in g.items() if k not in ("slowest", "gc")}),
                      flush=True)
                print("     slowest:", json.dumps(g["slowest"][:6]), flush=True)

    def one_round(r, recorded: bool, label: str) -> None:
        times: dict = {}
        gens = []
        if recorded:
            rec.install()
        try:
            for n in SEQUENCE:
                row, dt = gen_row(n, recorded)
                times.setdefault(n, []).append(dt)
                gens.append(row)
        finally:
            rec.remove()
        entry = {"round": r, "recorded": recorded, "label": label, **key_of(times, 256), "generations": gens}
        res["rounds"].append(entry)
        print(f"round {r} ({label}): " + json.dumps({k: round(v, 4) for k, v in entry.items() if k.startswith("ms_")}),
              flush=True)
        show(label, gens)
        save()

    extras = [e for e in args.extras.split(",") if e]
    for r in range(args.rounds):
        if time.perf_counter() - T0 > args.budget - sum(EXTRA_S.get(e, 10) for e in extras):
            res["rounds"].append({"skipped": "budget"})
            break
        one_round(r, r % 2 == 1, "recorded" if r % 2 else "plain")
    if "plain_path" in extras and sg is not None and time.perf_counter() - T0 < args.budget - 10:
        sg.active = False  # every decode step on the body graph + eager head (OCTAVO_GRAPH_STEP=0's path)
        try:
            one_round(len(res["rounds"]), True, "recorded, step graph off")
        finally:
            sg.active = True
    if "stacks" in extras and time.perf_counter() - T0 < args.budget - 5:
        # one recorded 513-token generation with the host's threads sampled every 2 ms: what ran around the slow steps
        from head16_steps import StackSampler

        sampler = StackSampler()
        rec.install()
        sampler.start()
        try:
            row, _ = gen_row(513, True)
        finally:
            sampler.stop()
            rec.remove()
        for r in row.get("slowest", []):
            k = r["step"]
            if k < len(rec.ex_in):
                r["host_stacks"] = sampler.between(rec.ex_in[k - 1], rec.ex_out[k])
        row["host_stacks_all"] = sampler.between(0.0, float("inf"), top=12)
        if len(rec.returns) > 1:  # from the generation's start to the prefill step's outputs
            row["prefill_stacks"] = sampler.between(rec.t_ref, rec.returns[1], top=10)
        res["stacks"] = row
        show("stacks", [row])
        save()
    if "hot" in extras and time.perf_counter() - T0 < args.budget - 10:
        # the device's step after 2 s idle vs after 2 s of copies at the memory's rate (clocks, power, heat)
        res["hot"] = []
        buf = torch.empty(2 << 28, dtype=torch.uint8, device="cuda" if cuda else "cpu")
        dst = torch.empty_like(buf)
        rec.install()
        try:
            for mode in ("idle", "hot", "idle", "hot"):
                if time.perf_counter() - T0 > args.budget:
                    break
                t = time.perf_counter()
                while time.perf_counter() - t < (2.0 if cuda else 0.2):
                    if mode == "hot":
                        for _ in range(20):
                            dst.copy_(buf)
                        if cuda:
                            torch.cuda.synchronize()
                    else:
                        time.sleep(0.05)
                row, _ = gen_row(513, True)
                row["before"] = mode
                res["hot"].append(row)
                show(f"after 2 s {mode}", [row])
                save()
        finally:
            rec.remove()
            del buf, dst
    res["tokens_equal"] = all(g.get("tokens_equal", True) for rd in res["rounds"] for g in rd.get("generations", []))
    res["seconds"] = time.perf_counter() - T0
    save()
    print("done", json.dumps({"tokens_equal": res["tokens_equal"], "seconds": round(res["seconds"], 1)}), flush=True)


if __name__ == "__main__":
    main()
