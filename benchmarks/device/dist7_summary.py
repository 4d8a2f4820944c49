"""Summary of benchmarks/device/dist7.sh's JSON (issue 12): dist6_summary's rows (ms/token, graph, TP=2 over TP=1
like for like) plus rank 0's per-layer kernel trace of each engine and mode (gpu_tp_profile.graph_layer_trace).

    python3 benchmarks/device/dist7_summary.py $OUT/dist/dist7   # writes summary.json there and prints it
"""

import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist6_summary import summarize  # noqa: E402


def _trace(by_rank) -> dict:
    t = (by_rank or [{}])[0]
    if not t or "layer" not in t:
        return t or {}
    return {"layer_wall_us": t.get("layer_wall_us"), "layer_kernels_us": t.get("layer_kernels_us"),
            "layers_folded": t.get("layers_folded"),
            "rows": [f"{r['us']:7.2f} us (gap {r['gap_us']:6.2f}) {r['name'][:50]}" for r in t["layer"]],
            **({"per_step": t["per_step"]} if "per_step" in t else {})}


def summarize7(r: str) -> dict:
    out = summarize(r)
    pairs = {"as started": ("8b_tp2_ab", "8b_tp1"),
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


if __name__ == "__main__":
    res = summarize7(sys.argv[1])
    json.dump(res, open(os.path.join(sys.argv[1], "summary.json"), "w"), indent=1)
    print(json.dumps(res, indent=1))
