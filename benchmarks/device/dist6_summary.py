"""Summary of benchmarks/device/dist6.sh's JSON (issue 12): per TP config and all-reduce mode the batch-1 ms/token,
its ratio to TP=1 of the same call, the decode graph replayed alone, and rank 0's kernel table of that graph.

    python3 benchmarks/device/dist6_summary.py $OUT/dist6   # writes summary.json there and prints it
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
        if one.get(K) and run.get(K):
            row["over_tp1"] = run[K] / one[K]
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


if __name__ == "__main__":
    res = summarize(sys.argv[1])
    json.dump(res, open(os.path.join(sys.argv[1], "summary.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))
