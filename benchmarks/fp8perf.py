"""fp8 linear layers on one GPU, inside a hard time budget (one device call): where the batch-1 time goes.

    python benchmarks/fp8perf.py --out fp8perf.json [--budget 55] [--layers 32]

Sections, in the order ``--sections`` gives (default fp8, bf16, parity, fp8_async, linears: the headline first; the
engine checks each kernel against its reference on the device at load anyway), each skipped (and said so in
the JSON) when the budget's remainder is too small; the JSON is rewritten after each one:

- parity: the GPU checks of tests/quant/test_fp8_gemv.py and test_fp8_fused.py, in this process (fp8 GEMV
  vs float64 and ``_scaled_mm``; quantizing RMSNorm / SiLU-and-mul vs the plain fused kernels; CUDA-graph
  replays);
- fp8, bf16: end to end (``LLM``, dummy weights, Llama-3-8B shape with ``--layers`` layers): batch-1 decode
  ms/token (difference of 129- and 1-token generations of a 1000-token prompt, best of 2), the captured
  forward alone (graph replay), the fraction of the roofline on the bytes read (linear weights at 1 or 2
  bytes + the bf16 LM head, over the copy bandwidth measured here), and a short offline run;
- linears: the 4 x ``--linear-layers`` projections of the 8B shape (every layer its own weights, so nothing
  stays in L2) in one CUDA graph per (variant, rows), replayed: bf16 cuBLAS, bf16 Triton GEMV (1 row), fp8
  quantize + ``_scaled_mm`` (the path above the GEMV's rows), ``_scaled_mm`` on already quantized input (what
  fusing the quantization into the norm saves at most), the fp8 GEMV (1-16 rows); then per projection at one
  row and the GEMV without activation quantization. ms per step and fraction of the copy bandwidth.

- fp8_async: the fp8 batch-1 decode again with ``async_scheduling=True`` (host work of step N+1 overlapped
  with step N), if time is left.

``--dry-run`` runs the plumbing on CPU (tiny shapes, Triton interpreter, no graphs).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

LLAMA3_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
                 tie_word_embeddings=False, torch_dtype="bfloat16")
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
T0 = time.monotonic()
DEV = "cuda"  # --dry-run: "cpu" (tiny shapes, Triton interpreter, no graphs): checks this script's plumbing


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def left(budget: float) -> float:
    return budget - (time.monotonic() - T0)


def copy_bandwidth() -> float:
    """Device memory bandwidth in bytes/s from a 1 GiB copy (read + write), best of 5."""
    n = 1 << (29 if DEV == "cuda" else 22)
    a = torch.empty(n, dtype=torch.bfloat16, device=DEV)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(5):
        sync()
        t = time.perf_counter()
        b.copy_(a)
        sync()
        best = min(best, time.perf_counter() - t)
    del a, b
    return 2 * 2 * n / best


# ------------------------------------------------------------------------------------------------ 1. parity
def parity(budget: float, save=lambda part: None) -> dict:
    import tests.quant.test_fp8_gemv as g

    # the two shapes whose multi-row checks failed in batch 1 first
    shapes = sorted(g.LLAMA3_8B_SHAPES, key=lambda s: s not in ((4096, 4096), (28672, 4096)))
    tests = [(f"gemv_{n}x{k}", lambda n=n, k=k: g.test_fp8_gemv_on_cuda(n, k)) for n, k in shapes]
    tests += [(f"gemv_rows_{n}x{k}", lambda n=n, k=k: g.test_fp8_gemv_on_cuda(n, k, rows=(4, 16))) for n, k in shapes]
    tests.append(("cuda_graph_replay", g.gpu_graph_replay_check))
    try:
        import tests.quant.test_fp8_triton as t

        tests.append(("per_token_quant_vs_torch", t.test_fused_fp8_quant_on_cuda))
    except ImportError as e:
        tests.append(("per_token_quant_vs_torch", lambda e=e: (_ for _ in ()).throw(e)))
    try:
        import tests.quant.test_fp8_fused as f

        tests += [(name, fn) for name, fn in f.GPU_CHECKS.items()]
    except ImportError as e:
        tests.append(("fused_ops", lambda e=e: (_ for _ in ()).throw(e)))
    out = {}
    for name, fn in tests:
        if left(budget) < 2:
            out[name] = "skipped: time budget"
            continue
        t = time.perf_counter()
        try:
            fn()
            out[name] = {"ok": True}
        except Exception as e:  # noqa: BLE001 - reported in the JSON
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:600]}
        out[name]["s"] = round(time.perf_counter() - t, 2)
        save(out)
        print("parity", name, json.dumps(out[name]), flush=True)
    return out


# ----------------------------------------------------------------------------------------------- 2. linears
def linears(layers: int, bandwidth: float, rows: list[int], budget: float, save=lambda part: None) -> dict:
    from octavo.plugins.platforms.cuda_fusions import gemv as bf16_gemv
    from octavo.plugins.quant.fp8 import quantize_fp8_rows
    from octavo.plugins.quant.fp8_gemv import fp8_gemv
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    gen = torch.Generator(device=DEV).manual_seed(0)
    dense, fp8 = [], []
    for _ in range(layers):
        for name, (n, k) in SHAPES.items():
            w = (torch.randn(n, k, device=DEV, generator=gen, dtype=torch.bfloat16) * 0.02)
            q, s = quantize_fp8_rows(w)
            dense.append((name, w))
            fp8.append((name, q, s.reshape(1, -1)))
    bytes_bf16 = sum(w.numel() * 2 for _, w in dense)
    bytes_fp8 = sum(q.numel() for _, q, _ in fp8)

    def inputs(m):
        xs = {k: torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for k in {k for _, k in SHAPES.values()}}
        pre = {k: quantize_per_token(x) for k, x in xs.items()}
        return xs, pre

    def variants(m, xs, pre):
        v = {"bf16_cublas": lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for _, w in dense],
             "fp8_quant_scaled_mm": lambda: [_quant_mm(xs[q.shape[1]], q, s, quantize_per_token) for _, q, s in fp8],
             "fp8_prequantized_scaled_mm": lambda: [torch._scaled_mm(pre[q.shape[1]][0], q.t(),
                                                                     scale_a=pre[q.shape[1]][1], scale_b=s,
                                                                     out_dtype=torch.bfloat16) for _, q, s in fp8]}
        if m <= 16:
            v["fp8_gemv"] = lambda: [fp8_gemv(xs[q.shape[1]], q, s) for _, q, s in fp8]
        if m == 1:
            v["bf16_triton_gemv"] = lambda: [bf16_gemv(xs[w.shape[1]], w) for _, w in dense]
        return v

    def details(xs, pre):  # one row, after the sweep
        v = {"fp8_gemv_prequantized": lambda: [fp8_gemv(pre[q.shape[1]][0], q, s, x_scale=pre[q.shape[1]][1])
                                               for _, q, s in fp8]}
        for shape in SHAPES:  # per projection: which one is short of the bandwidth
            v[f"fp8_gemv_{shape}_only"] = lambda shape=shape: [fp8_gemv(xs[q.shape[1]], q, s)
                                                                for name, q, s in fp8 if name == shape]
            v[f"bf16_triton_gemv_{shape}_only"] = lambda shape=shape: [bf16_gemv(xs[w.shape[1]], w)
                                                                        for name, w in dense if name == shape]
        # bound: the GEMV without in-kernel activation quantization (W8A16): its ALU share (compiles 4 more)
        v["fp8_gemv_no_act_quant"] = lambda: [fp8_gemv(xs[q.shape[1]], q, s, quantize_input=False) for _, q, s in fp8]
        return v

    out = {"layers": layers, "weight_GB": {"bf16": bytes_bf16 / 1e9, "fp8": bytes_fp8 / 1e9}}
    for m in [*rows, "1_detail"]:
        if left(budget) < 4:
            out[f"m{m}"] = "skipped: time budget"
            break
        xs, pre = inputs(1 if m == "1_detail" else m)
        res = {}
        for name, fn in (details(xs, pre) if m == "1_detail" else variants(m, xs, pre)).items():
            if left(budget) < 3:
                res[name] = "skipped: time budget"
                continue
            try:
                with torch.inference_mode():
                    fn()  # eager warm-up: compiles and autotunes outside the graph
                    if DEV != "cuda":  # dry run: plumbing only
                        res[name] = {"ran": True}
                        continue
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        fn()
                    times = []
                    for _ in range(4):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        graph.replay()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end))
                    del graph
                ms = min(times[1:])
                nbytes = bytes_bf16 if name.startswith("bf16") else bytes_fp8
                if name.endswith("_only"):
                    n, k = SHAPES[name.split("_gemv_")[1].removesuffix("_only")]
                    nbytes = layers * n * k * (2 if name.startswith("bf16") else 1)
                res[name] = {"ms": round(ms, 4), "fraction_of_copy_bw": round(nbytes / bandwidth / (ms / 1e3), 3)}
            except Exception as e:  # noqa: BLE001 - reported in the JSON
                res[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        out[f"m{m}"] = res
        save(out)
        print("linears", m, json.dumps(res), flush=True)
    dense.clear()
    fp8.clear()
    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return out


def _quant_mm(x, q, s, quantize):
    xq, xs = quantize(x)
    return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s, out_dtype=torch.bfloat16)


# -------------------------------------------------------------------------------------------- 3. end to end
def step_bytes(cfg: dict, fp8: bool) -> tuple[int, int]:
    """(linear weight bytes, bf16 LM-head bytes) one batch-1 decode step reads."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    linear = n * (h * (h + 2 * kv) + h * h + 3 * h * i)
    return linear * (1 if fp8 else 2), cfg["vocab_size"] * h * 2


def e2e(name: str, cfg: dict, tmp: str, bandwidth: float, args, budget: float) -> dict:
    from octavo import LLM, SamplingParams

    d = os.path.join(tmp, f"llama3-8b-{cfg['num_hidden_layers']}l")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    t0 = time.perf_counter()
    memory = {"gpu_memory_utilization": 0.85} if DEV == "cuda" else {}
    extra = {"async_scheduling": True} if name.endswith("_async") else {}  # host work overlapped (issue 17)
    llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=2048,
              max_num_seqs=args.max_num_seqs, quantization="fp8" if name.startswith("fp8") else None, **memory,
              **extra)
    res: dict = {"load_s": round(time.perf_counter() - t0, 2)}
    worker = llm.llm_engine.core.executor.driver
    res["prepared"] = {k: v for k, v in (worker.prepared.notes or {}).items() if k != "graph_sizes"}
    res["graph_sizes"] = len(worker.prepared.notes.get("graph_sizes") or [])
    methods = [getattr(m, "quant_method", None) for m in worker.runner.model.modules()]
    res["fp8_layers_with_gemv"] = sum(1 for m in methods if getattr(m, "gemv_max_m", 0))
    res["fp8_layers"] = sum(1 for m in methods if type(m).__name__ == "_FP8Method")
    rng = random.Random(0)
    lo, hi = cfg["vocab_size"] // 100, cfg["vocab_size"] - 1
    one = [{"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(1000)]}]

    def timed(n, llm=llm):
        sync()
        t = time.perf_counter()
        llm.generate(one, SamplingParams(max_tokens=n, ignore_eos=True), use_tqdm=False)
        sync()
        return time.perf_counter() - t

    timed(8)  # warm-up (prefill compiled, prefix cached)
    t1, t129 = min(timed(1) for _ in range(2)), min(timed(129) for _ in range(2))
    per_tok = (t129 - t1) / 128
    linear_b, head_b = step_bytes(cfg, name.startswith("fp8"))
    roof = (linear_b + head_b) / bandwidth
    res.update({"bs1_ms_per_token": round(per_tok * 1e3, 4), "bs1_roofline_ms": round(roof * 1e3, 4),
                "bs1_fraction_of_roofline": round(roof / per_tok, 4)})
    gr = worker.runner.graph_runner
    res["graph_replays_during_decode"] = gr.num_replays if gr is not None else 0  # decode steps ran as graphs
    res["fp8_linked_producers"] = sum(1 for m in worker.runner.model.modules() if "_octavo_plain_forward" in vars(m))
    res["fp8_layers_gemv_on_prequantized"] = sum(1 for m in methods if getattr(m, "gemv_pre_ok", False))
    if gr is not None and 1 in gr.graphs:  # the captured forward alone (no LM head, no host work)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(30):
            gr.graphs[1].replay()
        torch.cuda.synchronize()
        g_ms = (time.perf_counter() - t) / 30 * 1e3
        res.update({"graph_forward_ms": round(g_ms, 4),
                    "graph_forward_fraction_of_linear_roofline": round(linear_b / bandwidth * 1e3 / g_ms, 4),
                    "outside_graph_ms_per_token": round(per_tok * 1e3 - g_ms, 4)})
    print("e2e", name, json.dumps(res, default=str), flush=True)
    if left(budget) > 10 and args.offline_prompts and not name.endswith("_async"):
        rng = random.Random(1)
        prompts = [{"prompt_token_ids": [rng.randrange(lo, hi) for _ in range(args.offline_in)]}
                   for _ in range(args.offline_prompts)]
        sync()
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=args.offline_out, ignore_eos=True), use_tqdm=False)
        sync()
        dt = time.perf_counter() - t
        res.update({"offline_output_tok_s": round(sum(len(o.outputs[0].token_ids) for o in outs) / dt, 1),
                    "offline_workload": f"{args.offline_prompts} x {args.offline_in}/{args.offline_out}, "
                                        f"max_num_seqs {args.max_num_seqs}"})
    else:
        res["offline"] = "skipped: time budget"
    try:  # releases the worker's model and KV cache (lead, 17:32); before that, del + gc had to do it
        llm.llm_engine.shutdown()
    except Exception as e:  # noqa: BLE001 - an older engine without the release: del + gc below
        res["shutdown"] = f"{type(e).__name__}: {e}"
    del llm, worker, gr
    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="fp8perf.json")
    ap.add_argument("--budget", type=float, default=55.0, help="seconds from start; later sections are skipped")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rows", default="1,2,4,8,16,64,256")
    ap.add_argument("--linear-layers", type=int, default=8, help="layers of the linear microbench (no L2 reuse "
                    "from 1 up: every layer has its own weights)")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--offline-prompts", type=int, default=32)
    ap.add_argument("--offline-in", type=int, default=512)
    ap.add_argument("--offline-out", type=int, default=128)
    ap.add_argument("--sections", default="fp8,bf16,parity,fp8_async,linears")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, interpreter: the plumbing only")
    args = ap.parse_args()
    os.environ.setdefault("OCTAVO_DISABLE_PROGRESS", "1")
    global DEV
    if args.dry_run:
        DEV = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
        SHAPES.update({"qkv": (96, 64), "o": (64, 64), "gate_up": (256, 64), "down": (64, 128)})
        LLAMA3_8B.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=512)
    record = {"card": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)", "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv), "gemv_max_m": os.environ.get("OCTAVO_FP8_GEMV_MAX_M", "1")}
    try:
        import triton

        record["triton"] = triton.__version__
    except ImportError:
        pass

    def save():
        with open(args.out, "w") as f:
            json.dump(record, f, indent=2, default=str)

    record["copy_bandwidth_GBps"] = round(copy_bandwidth() / 1e9, 1)
    bandwidth = record["copy_bandwidth_GBps"] * 1e9
    cfg = dict(LLAMA3_8B, num_hidden_layers=args.layers)
    minimum = {"parity": 4, "linears": 6, "fp8": 12, "bf16": 12, "fp8_async": 10}
    with tempfile.TemporaryDirectory() as tmp:
        for section in args.sections.split(","):
            if left(args.budget) < minimum.get(section, 12):
                record[section] = f"skipped: {left(args.budget):.0f} s of the budget left"
                save()
                continue
            t = time.monotonic()
            try:
                if section == "parity":
                    record[section] = parity(args.budget, lambda part: (record.update(parity=part), save()))
                elif section == "linears":
                    record[section] = linears(args.linear_layers, bandwidth, [int(r) for r in args.rows.split(",")],
                                              args.budget, lambda part: (record.update(linears=part), save()))
                else:
                    record[section] = e2e(section, cfg, tmp, bandwidth, args, args.budget)
            except Exception as e:  # noqa: BLE001 - reported in the JSON, the next section still runs
                record[section] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
                del e
                gc.collect()  # a failed engine's memory back before the next section
                if DEV == "cuda":
                    torch.cuda.empty_cache()
            print(f"== {section} done in {time.monotonic() - t:.1f} s ({left(args.budget):.0f} s left)", flush=True)
            save()
    for name in ("fp8", "fp8_async"):
        for key in ("bs1_ms_per_token", "offline_output_tok_s", "graph_forward_ms"):
            a, b = record.get(name, {}), record.get("bf16", {})
            if isinstance(a, dict) and isinstance(b, dict) and key in a and key in b:
                record[f"{name}_vs_bf16_{key}"] = round(a[key] / b[key], 4)
    save()
    print(json.dumps(record, indent=1, default=str))


if __name__ == "__main__":
    main()
