"""Summary of benchmarks/device/dist8.sh's JSON (issue 12; the summaries of dist6.sh and dist7.sh folded in): per TP
config and all-reduce mode the batch-1 ms/token, its ratio to TP=1 of the same call, the decode graph replayed
alone, rank 0's kernel table and per-layer kernel trace of that graph, and the GEMV tile sweep with its A/B.

    python3 benchmarks/device/dist_summary.py $OUT/dist/dist8   # writes summary.json there and prints it
"""

import glob
import json
import os
import sys

K, G, T = "decode_bs1_ms_per_token_async_on", "graph_replay_bs1_ms_by_rank", "bs1_tokens_async_on"


def _max(v) -> float:
    return max(v) if v else float("nan")


def _table(by_rank) -> dict:
    t = (by_rank or [{}])[0]
    if not t:
        return {}
    return {"total_us": t.get("kernels_us_total"), "launches": t.get("launches"), "wall_us": t.get("wall_us_profiled"),
            "top": [f"{r['us']:8.1f} us x{r['calls']:5.1f} {r['name'][:70]}" for r in t.get("kernels", [])[:16]]}


def summarize(r: str) -> dict:
    runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{r}/*_tp*.json"))}
    one = runs.get("8b_tp1", {})
    out: dict = {}
    for name, run in runs.items():
        row = {"ms_per_token": run.get(K), "graph_ms": _max(run.get(G)),
               "graph_ms_no_allreduce": _max(run.get("graph_replay_bs1_ms_no_allreduce_by_rank")),
               "logits_ms": _max(run.get("logits_bs1_ms_by_rank")), "as_started": run.get("ar_as_started_by_rank"),
               "kernels": _table(run.get("graph_kernels_bs1_by_rank"))}
        if one.get(K) and run.get(K) and name.startswith("8b_"):  # the 8B shape's TP configs only
            row["over_tp1"] = run[K] / one[K]
        if run.get("roofline_ms") and run.get(K):  # the 70B TP=4 number: weights per GPU over the copy rate
            row.update({"weights_GB_per_gpu": run.get("weights_GB_per_gpu"), "roofline_ms": run["roofline_ms"],
                        "fraction_of_roofline": run["roofline_ms"] / run[K],
                        "copy_rate_Bps_assumed": run.get("copy_rate_Bps"),
                        "copy_rate_Bps_measured_by_rank": run.get("measured_copy_rate_Bps_by_rank"),
                        "fraction_of_measured_roofline": run.get("decode_bs1_fraction_of_measured_roofline_async_on")})
        if run.get("throughput_tok_s_async_on"):
            row["throughput_tok_s"] = run["throughput_tok_s_async_on"]
        out[name] = row
        for key in sorted(k for k in run if k.startswith("ar_") and isinstance(run[k], dict)):
            mode, m = key[3:], run[key]
            if m.get("decode_bs1_ms_per_token") is not None:
                out[f"{name}/{mode}"] = {"ms_per_token": m.get("decode_bs1_ms_per_token"), "graph_ms": _max(m.get(G)),
                                         "over_tp1": m["decode_bs1_ms_per_token"] / one[K] if one.get(K) else None,
                                         "switched": m.get("switched_by_rank"),
                                         "tokens_equal_as_started": m.get("bs1_tokens") == run.get(T),
                                         "kernels": _table(m.get("graph_kernels_bs1_by_rank"))}
    pairs = {"defaults (fused+pdl+silu / pdl+silu)": ("8b_tp2_ab", "8b_tp1"),
             "custom / off": ("8b_tp2_ab/custom", "8b_tp1/custom"),
             "fused+pdl+silu+ll / pdl+silu": ("8b_tp2_ab/fused+pdl+silu+ll", "8b_tp1")}
    out["tp2_over_tp1_like_for_like"] = {
        name: out[a]["ms_per_token"] / out[b]["ms_per_token"] for name, (a, b) in pairs.items()
        if out.get(a, {}).get("ms_per_token") and out.get(b, {}).get("ms_per_token")}
    ar = os.path.join(r, "allreduce.json")
    if os.path.exists(ar):
        a = json.load(open(ar))
        out["allreduce_checks"] = {x: a.get(f"{x}_all_bitwise_equal") for x in ("symm_mem", "custom")}
        out["allreduce_graph_us"] = {s: {x: v.get("graph_us_per_call") for x, v in row.items()}
                                     for s, row in a.get("sizes", {}).items()}
    return out


def _trace(by_rank) -> dict:
    t = (by_rank or [{}])[0]
    if not t or "layer" not in t:
        return t or {}
    return {"layer_wall_us": t.get("layer_wall_us"), "layer_kernels_us": t.get("layer_kernels_us"),
            "layers_folded": t.get("layers_folded"),
            "rows": [f"{r['us']:7.2f} us (gap {r['gap_us']:6.2f}) {r['name'][:50]}" for r in t["layer"]],
            **({"per_step": t["per_step"]} if "per_step" in t else {})}


def summarize_all(r: str) -> dict:
    out = summarize(r)
    pairs = {"as started": ("8b_tp2_ab", "8b_tp1"), "as started (goal part's TP=2 engine)": ("8b_tp2_goal", "8b_tp1"),
             "TP=2 early part as started": ("8b_tp2_early", "8b_tp1"),
             "tp2 part as started (max_num_seqs 8, as tp1's)": ("8b_tp2", "8b_tp1"),
             "pdl off": ("8b_tp2_ab/fused+silu", "8b_tp1/custom+silu")}
    for tp2 in ("fused+pdl+silu", "fused+pdl+silu+push"):  # TP=2 with / without the push, TP=1 re-captured defaults
        pairs[f"{tp2} / TP=1 re-captured"] = (f"8b_tp2_ab/{tp2}", "8b_tp1/custom+pdl+silu")
    for name, run in ((os.path.basename(p)[:-5], json.load(open(p))) for p in sorted(glob.glob(f"{r}/*_tp*.json"))):
        out.setdefault(name, {})["layer_trace"] = _trace(run.get("graph_layer_trace_by_rank"))
        out[name]["decode_layer_trace"] = _trace(run.get("decode_layer_trace_by_rank"))
        for key in (k for k in run if k.startswith("ar_") and isinstance(run[k], dict)):
            out.setdefault(f"{name}/{key[3:]}", {})["layer_trace"] = _trace(run[key].get("graph_layer_trace_by_rank"))
            if name.startswith("8b_tp2") and "pdl" in key and f"{name}/{key[3:]}" not in {a for a, _ in
                                                                                     pairs.values()}:
                pairs[key[3:]] = (f"{name}/{key[3:]}", "8b_tp1/custom+pdl+silu")
    out["tp2_over_tp1_like_for_like"] = {
        n: out[a]["ms_per_token"] / out[b]["ms_per_token"] for n, (a, b) in pairs.items()
        if (out.get(a) or {}).get("ms_per_token") and (out.get(b) or {}).get("ms_per_token")}
    return out


def gemv_rows(r: str) -> dict:
    """The GEMV tile sweep (benchmarks/gpu_tp_gemv.py) per rank and shape: the autotuner's tile and time, the best,
    and the A/B rounds in the engine (graph ms per rank, ms/token, tokens equal to the first round's)."""
    out = {}
    one = json.load(open(f"{r}/8b_tp1.json")) if os.path.exists(f"{r}/8b_tp1.json") else {}
    tp1 = [one.get(K), *(m.get("decode_bs1_ms_per_token") for k, m in one.items() if k.startswith("ar_") and isinstance(m, dict))]
    tp1 = [v for v in tp1 if v]  # TP=1 as started and re-captured: ratios against the mean (and each in the list)
    for name, run in ((os.path.basename(p)[:-5], json.load(open(p))) for p in sorted(glob.glob(f"{r}/*_tp*.json"))):
        if "gemv_sweep_by_rank" not in run and "table_ab" not in run:
            continue
        ab = run.get("gemv_ab") or run.get("table_ab") or []
        sweep = {f"rank{i}/{shape}": {k: row.get(k) for k in ("auto_key", "auto_us", "best", "best_us", "best_TBps",
                                                              "MB")}
                 for i, s in enumerate(run.get("gemv_sweep_by_rank", [])) for shape, row in s.get("shapes", {}).items()}
        first = ab[0]["bs1_tokens"] if ab else None
        out[name] = {"sweep": sweep, "tiles": run.get("gemv_tiles"), "sweep_s": run.get("gemv_sweep_s"),
                     "as_started_ms_per_token": run.get(K), "as_started_graph_ms": _max(run.get(G)),
                     "ab": [{"label": x["label"], "graph_ms": _max(x.get(G)), "ms_per_token": x["decode_bs1_ms_per_token"],
                             "tokens_equal_first": x["bs1_tokens"] == first,
                             "tokens_equal_as_started": x["bs1_tokens"] == run.get(T),
                             "over_tp1_mean": x["decode_bs1_ms_per_token"] / (sum(tp1) / len(tp1)) if tp1 else None}
                            for x in ab], "tp1_ms_per_token": tp1}
    return out


if __name__ == "__main__":
    res = summarize_all(sys.argv[1])
    res["gemv"] = gemv_rows(sys.argv[1])
    json.dump(res, open(os.path.join(sys.argv[1], "summary.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))
