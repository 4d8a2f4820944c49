"""Batch-1 decode with the LM head + sampler inside the CUDA graphs vs after them (issue 17 item 2; issues 9, 12).

One engine per run (Llama-3-8B shape, dummy weights, bf16 or fp8 weights + fp8 KV, TP=1 in process or TP=2 through
``mp``, async scheduling as by default, ``max_num_seqs=8``: head graphs at 1, 2, 4, 8 rows). The head graphs are
switched on and off between alternating measurements (``graph_head_state`` on every rank: same process, same
graphs, same weights), ``on off off on ...``:

- ms/token: the difference of 1- and 257-token greedy generations after a 512-token prompt, best of two (the
  prefill cancels; contexts 513..768), and its fraction of the roofline: every parameter byte of a rank + the
  16-bit KV bytes at the mean context, over the copy rate (benchmarks/fp8_bs1.py's and gpu_e2e.py's formula);
- the greedy tokens of every measurement (they must all be equal) and the head graph replays of each mode;
- per rank: the one-row body graph replayed alone vs body + greedy head graph (device time, no host), and the
  head's one-row GEMM alone, cuBLAS (what the head runs) vs the body's Triton GEMV (cuda_fusions.gemv), and one
  row's argmax, torch's vs cuda_argmax.argmax_rows (eager launches back to back: device time plus launch gaps);
- ``--gemv-ab`` (with ``OCTAVO_HEAD_GEMV=1``): each mode also with the head's one-row GEMM through the Triton GEMV
  (cuda_head_gemv.py) vs cuBLAS, the head graphs re-captured at each switch;
- exactness checks: seeded temperature-0.8 sampling, unseeded sampling after ``torch.manual_seed`` (TP=1: the key
  base comes from this process's generator), and a logprobs request (falls back to the eager head), each on vs off.

    python benchmarks/graph_head_ab.py --dtype bf16 --out /tmp/bf16.json
    python benchmarks/graph_head_ab.py --dtype fp8 --out /tmp/fp8.json
    python benchmarks/graph_head_ab.py --dtype bf16 --tp 2 --copy-rate 3.01e12 --out /tmp/tp2.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks.* for the workers

RPC = "octavo.plugins.platforms.cuda_graph_head:graph_head_state"
GEMV_RPC = "octavo.plugins.platforms.cuda_head_gemv:set_head_gemv"


def weight_bytes(worker) -> int:
    """Every parameter byte on this rank (a ``collective_rpc`` target)."""
    return sum(p.numel() * p.element_size() for p in worker.model.parameters())


def graph_ms(worker, iters: int) -> dict:
    """ms per replay of the one-row body graph alone, then of body + greedy head graph, on this rank (a
    ``collective_rpc`` target: every rank replays at once, so the collectives inside pair up)."""
    import torch

    gr = worker.runner.graph_runner
    head = getattr(gr, "head", None)
    out = {}
    variants = {"body": [gr.graphs[1]]}
    if head is not None and (1, "greedy") in head.graphs:
        variants["body_head"] = [gr.graphs[1], head.graphs[(1, "greedy")]]
    for name, graphs in variants.items():
        for _ in range(5):
            for g in graphs:
                g.replay()
        torch.cuda.synchronize(worker.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            for g in graphs:
                g.replay()
        end.record()
        end.synchronize()
        out[name] = start.elapsed_time(end) / iters
    head_w = getattr(getattr(worker.model, "lm_head", None), "weight", None)
    if head_w is not None:  # the head's one-row GEMM alone: cuBLAS (the eager head's F.linear) vs the Triton GEMV
        from octavo.plugins.platforms.cuda_argmax import argmax_rows
        from octavo.plugins.platforms.cuda_fusions import gemv

        x = gr.outputs[1]
        logits = torch.randn(1, head_w.shape[0], device=x.device)
        for name, fn in (("head_cublas", lambda: torch.nn.functional.linear(x, head_w)),
                         ("head_gemv", lambda: gemv(x, head_w)),
                         ("argmax_torch", lambda: logits.argmax(dim=-1)), ("argmax_rows", lambda: argmax_rows(logits))):
            try:
                for _ in range(3):
                    fn()
                torch.cuda.synchronize(worker.device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(50):
                    fn()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / 50
                out[name] = ms
                if name.startswith("head"):
                    out[name + "_TBps"] = head_w.numel() * head_w.element_size() / (ms * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001 - a timing, not the A/B
                out[name] = f"{type(e).__name__}: {e}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="on/off pairs (alternating order)")
    ap.add_argument("--gemv-ab", action="store_true", help="also switch the LM head's one-row GEMM between cuBLAS and "
                    "the Triton GEMV (needs OCTAVO_HEAD_GEMV=1; head graphs re-captured): four modes per round")
    ap.add_argument("--copy-rate", type=float, default=0.0, help="bytes/s read+written; 0: measure (TP=1 only)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    # the head graphs alone: the one-graph batch-1 step (on by default since session 16) would take the steps first
    os.environ.setdefault("OCTAVO_GRAPH_STEP", "0")
    import torch

    from benchmarks.gpu_e2e import LLAMA3_8B, copy_bandwidth, write_config
    from octavo import LLM, SamplingParams

    res: dict = {"dtype": args.dtype, "tp": args.tp, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "torch": torch.__version__, "command": " ".join(sys.argv)}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if args.tp == 1:
        res["card"] = torch.cuda.get_device_name()
    bw = args.copy_rate or copy_bandwidth()
    res["copy_rate_TBps"] = bw / 1e12
    d = write_config(LLAMA3_8B, tempfile.mkdtemp(), "llama3-8b")
    quant = {"quantization": "fp8", "kv_cache_dtype": "fp8"} if args.dtype == "fp8" else {}
    t0 = time.perf_counter()
    llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=4096,
              gpu_memory_utilization=0.9, max_num_seqs=8, max_num_batched_tokens=8192,
              tensor_parallel_size=args.tp, **quant)
    res["start_s"] = time.perf_counter() - t0
    res["head_as_started"] = llm.collective_rpc(RPC)
    wb = max(llm.collective_rpc("benchmarks.graph_head_ab:weight_bytes"))
    res["weights_GB_per_rank"] = wb / 1e9
    print("started", json.dumps(res), flush=True)
    save()
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(512)]}

    def gen(n, **kw):
        t = time.perf_counter()
        outs = llm.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True, **{"temperature": 0, **kw}),
                            use_tqdm=False)
        return time.perf_counter() - t, outs[0].outputs[0]

    def set_head(on: bool) -> list:
        return llm.collective_rpc(RPC, args=[on])

    n = 256
    kv_bytes = (512 + n // 2) * 32 * 8 * 128 * 2 * 2 / args.tp  # 16-bit KV at the mean context, per rank
    roof_ms = (wb + kv_bytes) / bw * 1e3
    res["roofline_ms"] = roof_ms
    set_head(True)
    gen(16)
    set_head(False)
    gen(16)  # warm-up of both modes (the prefill's prefix-cache hits too)
    modes = [(True, None), (False, None)]
    if args.gemv_ab:
        res["head_gemv_as_started"] = llm.collective_rpc(GEMV_RPC, args=[True])
        modes = [(True, True), (False, True), (True, False), (False, False)]
    gemv_now = None if not args.gemv_ab else True
    rows, firsts = [], {}
    for r in range(args.rounds):
        for on, gemv in (modes if r % 2 == 0 else modes[::-1]):
            if gemv is not None and gemv != gemv_now:
                llm.collective_rpc(GEMV_RPC, args=[gemv])  # head graphs re-captured with the other GEMM
                gemv_now = gemv
                gen(16)
            before = set_head(on)[0].get("replays", {})
            gen(4)
            t1 = min(gen(1)[0] for _ in range(2))
            runs = [gen(n + 1) for _ in range(2)]
            per_tok = (min(dt for dt, _ in runs) - t1) / n * 1e3
            after = llm.collective_rpc(RPC)[0].get("replays", {})
            tokens = list(runs[-1][1].token_ids)
            first = firsts.setdefault(gemv, tokens)  # the same head GEMM must give the same tokens
            row = {"head_in_graph": on, "head_gemv": gemv, "ms_per_token": per_tok, "fraction_of_roofline": roof_ms / per_tok,
                   "head_replays": {k: after.get(k, 0) - before.get(k, 0) for k in after},
                   "tokens_equal_first": tokens == first}
            rows.append(row)
            print("round", r, json.dumps(row), flush=True)
            res["rounds"] = rows
            save()
    for on, gemv in modes:
        ms = [x["ms_per_token"] for x in rows if x["head_in_graph"] == on and x["head_gemv"] == gemv]
        tag = ("on" if on else "off") + ("" if gemv is None else ("_gemv" if gemv else "_cublas"))
        res[f"mean_ms_{tag}"] = sum(ms) / len(ms)
        res[f"fraction_{tag}"] = roof_ms / (sum(ms) / len(ms))
    if args.gemv_ab:  # the checks below and the graph timings with cuBLAS, the default head
        llm.collective_rpc(GEMV_RPC, args=[False])
    res["greedy_tokens_identical"] = all(x["tokens_equal_first"] for x in rows)
    res["graph_ms_by_rank"] = llm.collective_rpc("benchmarks.graph_head_ab:graph_ms", args=[200])
    save()
    checks = {}
    for name, kw, seed in (("seeded_t0.8", {"temperature": 0.8, "seed": 7}, None),
                           ("unseeded_t0.8", {"temperature": 0.8}, 1234),
                           ("greedy_logprobs2", {"logprobs": 2}, None)):
        if seed is not None and args.tp > 1:
            continue  # the workers' generators are not this process's
        got = {}
        for on in (True, False):
            before = set_head(on)[0].get("replays", {})
            if seed is not None:
                torch.manual_seed(seed)
            out = gen(48, **kw)[1]
            after = llm.collective_rpc(RPC)[0].get("replays", {})
            lp = [sorted(d.items()) for d in (out.logprobs or [])]
            got[on] = (list(out.token_ids), str(lp), sum(after.get(k, 0) - before.get(k, 0) for k in after))
        checks[name] = {"tokens_equal": got[True][0] == got[False][0], "logprobs_equal": got[True][1] == got[False][1],
                        "head_replays_on": got[True][2], "head_replays_off": got[False][2]}
    res["checks"] = checks
    set_head(True)
    save()
    print("done", json.dumps({k: v for k, v in res.items() if k != "rounds"}), flush=True)
    llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
