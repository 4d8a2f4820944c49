"""Batch-1 fp8 decode of the full Llama-3-8B shape: ms/token vs the fp8-bytes roofline, and where the captured
forward's time goes, kernel by kernel (issue 9 goal b: >= 0.85 of the roofline).

One engine (dummy weights, ``quantization="fp8"``, ``kv_cache_dtype="fp8"``, ``max_num_seqs=1`` so only the
one-row graph is captured). Measured as benchmarks/gpu_e2e.py's ``decode_bs1`` (same roofline formula: every
parameter byte + the KV bytes at the mean context, over the copy bandwidth; per token = the difference of
generations of 1 and ``1 + n`` tokens after a 512-token prompt, best of 2), plus

- ``graph_forward_ms``: replays of the captured one-row forward alone (no LM head, sampler, host work);
- a torch.profiler kernel table of 10 replays (us per forward by kernel name and launches per forward) and of
  one generation step outside the graph (LM head, sampling);
- ``--ab s6``: the session-6 A/B (``S6_VARIANTS``: quantizing-norm warps at one row, the GEMVs' L2 prefetch chain
  and programmatic dependent launch, plugins/quant/fp8_prefetch.py), the graph recaptured for each;
- ``--ab tc``: every fp8 linear switched to the tensor-core GEMV (fp8_gemv_tc.py; tiles from ``--tiles``, the
  JSON of benchmarks/fp8_gemv_bench.py, else the default), the graph recaptured, and the same numbers again;
  then once more with programmatic dependent launch (``OCTAVO_FP8_GEMV_PDL``).

    python benchmarks/fp8_bs1.py --out /tmp/bs1.json [--ab s6 --budget 50 | --ab tc --tiles /tmp/gemv.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.perf_counter()


def kernel_table(prof, per: int, limit: int = 40) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
        if us and us > 0:
            rows.append({"name": e.key[:110], "us": round(us / per, 2), "calls": e.count / per})
    rows.sort(key=lambda r: -r["us"])
    return rows[:limit]


GEMV_ORDER = ("qkv", "o", "gate_up", "down")  # the 8B layer's one-row GEMVs in forward order


def critical_path(prof, replays: int) -> dict:
    """us per forward that each kernel adds to the running end of all kernels before it (time order): with PDL a
    kernel's own duration includes its wait, this does not. GEMVs named by their place in the layer (GEMV_ORDER,
    counted through all replays; the GEMV with the norm in its tail, fp8_gemv_norm.py, as ``<name>+norm``); ``idle`` =
    time no kernel ran (launch gaps; between replays too)."""
    ev = []
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA") \
                and e.time_range.end > e.time_range.start:
            ev.append((e.time_range.start, e.time_range.end, e.name))
    ev.sort()
    out, end, g = {}, None, 0
    for start, stop, name in ev:
        if any(k in name for k in ("_fp8_gemv_kernel", "_fp8_gemv_norm_kernel")):
            name, g = GEMV_ORDER[g % 4] + ("+norm" if "_norm_" in name else ""), g + 1
        else:
            name = name[:40]
        if end is not None and start > end:
            out["idle"] = out.get("idle", 0.0) + (start - end)
        add = stop - max(start, end) if end is not None else stop - start
        if add > 0:
            out[name] = out.get(name, 0.0) + add
        end = stop if end is None else max(end, stop)
    return {k: round(v / replays, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def gemv_by_shape(prof, replays):
    from benchmarks.fp8_bs1_tiles import gemv_by_shape as by_shape

    return by_shape(prof, replays)


PROBE = {"tokens": 0}  # --probe-tokens


def measure(llm, gr, prompt, res: dict, tag: str, bw: float, weight_bytes: int, profile: bool) -> None:
    from octavo import SamplingParams

    tokens_out = []

    def gen(tokens):
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate([prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0),
                            use_tqdm=False)
        torch.cuda.synchronize()
        tokens_out.append(list(outs[0].outputs[0].token_ids))
        return time.perf_counter() - t

    n = 256
    gen(8)
    t1 = min(gen(1) for _ in range(2))
    t2 = min(gen(n + 1) for _ in range(2))
    per_tok = (t2 - t1) / n
    kv_bytes = (512 + n // 2) * 32 * 8 * 128 * 2 * 2  # gpu_e2e.py's formula (16-bit KV bytes)
    roof = (weight_bytes + kv_bytes) / bw
    strict = res["strict"]["strict_bytes"] / bw  # what a step reads: no embedding table, fp8 KV at 1 byte
    r = {"decode_ms_per_token": per_tok * 1e3, "roofline_ms": roof * 1e3, "fraction_of_roofline": roof / per_tok,
         "strict_roofline_ms": strict * 1e3, "strict_fraction_of_roofline": strict / per_tok}
    # the prefetch / PDL variants compute the same bits as the first measure (only L2 hints and launch order
    # differ): their greedy tokens must be its tokens exactly. norm4 and nosilu may differ (another summation order)
    first = res.setdefault("_greedy_tokens", tokens_out[-1])
    r["same_tokens_as_first_measure"] = tokens_out[-1] == first and tokens_out[-2] == first
    if not r["same_tokens_as_first_measure"]:  # where they part, and how close the first measure's top two were there
        r["first_differing_token"] = next((i for i, (a, b) in enumerate(zip(tokens_out[-1], first)) if a != b), None)
    if PROBE["tokens"]:  # greedy with the top-2 log-probabilities: a near tie where tokens part = summation order
        outs = llm.generate([prompt], SamplingParams(max_tokens=PROBE["tokens"], ignore_eos=True, temperature=0,
                                                     logprobs=2), use_tqdm=False)[0].outputs[0]
        gaps = [round(sorted((lp.logprob for lp in d.values()), reverse=True)[0]
                      - sorted((lp.logprob for lp in d.values()), reverse=True)[-1], 5) for d in outs.logprobs]
        probe = res.setdefault("_probe", {"tokens": list(outs.token_ids), "gaps": gaps})
        at = next((i for i, (a, b) in enumerate(zip(outs.token_ids, probe["tokens"])) if a != b), None)
        r["probe"] = {"first_differing": at, "top2_gap_there_first_measure": None if at is None else probe["gaps"][at],
                      "top2_gap_there": None if at is None else gaps[at], "min_gap_before": min(gaps[:at or None]),
                      "tokens": list(outs.token_ids)[:16]}
    if gr is not None and 1 in gr.graphs:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            gr.graphs[1].replay()
        torch.cuda.synchronize()
        r["graph_forward_ms"] = (time.perf_counter() - t) / 50 * 1e3
        r["outside_graph_ms"] = r["decode_ms_per_token"] - r["graph_forward_ms"]
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as prof_ctx

            with prof_ctx(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    gr.graphs[1].replay()
                torch.cuda.synchronize()
            table = kernel_table(prof, 10)
            r["graph_kernels"] = table
            r["gemv_us_by_shape"] = gemv_by_shape(prof, 10)  # with PDL a kernel's time includes its wait
            r["graph_kernels_us_total"] = round(sum(x["us"] for x in table), 1)
            try:
                r["critical_path_us"] = critical_path(prof, 10)
            except Exception as e:  # noqa: BLE001 - a diagnostic; the measure stands without it
                r["critical_path_us"] = {"error": f"{type(e).__name__}: {e}"[:200]}
    res[tag] = r
    print(tag, json.dumps({k: v for k, v in r.items() if k not in ("graph_kernels", "critical_path_us")}), flush=True)
    if "gemv_us_by_shape" in r:
        print("   gemv us by shape", json.dumps(r["gemv_us_by_shape"]), flush=True)
    if "critical_path_us" in r:
        print("   critical path us", json.dumps(r["critical_path_us"]), flush=True)
    for row in r.get("graph_kernels", [])[:25]:
        print(f"   {row['us']:8.2f} us  x{row['calls']:5.1f}  {row['name']}", flush=True)


def seed_tiles(flags: dict) -> int:
    """Give the one-row GEMV's autotuner, for the kernel flags a variant passes (``W_BITS`` / ``REG_PF`` /
    ``ACC_SPLIT``), the tiles it chose for the defaults: the A/B then changes only the kernel, not the tile, and
    skips a re-tuning on a fresh machine (~1 s per config and shape). Returns the entries added."""
    from octavo.plugins.quant import fp8_gemv

    tuner = fp8_gemv._fp8_gemv_tuned
    extra = tuple(v for name, v in (("W_BITS", flags.get("W_BITS")), ("REG_PF", flags.get("REG_PF")),
                                    ("ACC_SPLIT", flags.get("ACC_SPLIT"))) if v)
    added = 0
    for key, cfg in list(tuner.cache.items()):
        if len(key) > 6 and isinstance(key[6], str) and extra:  # a defaults key: 6 values, then dtypes
            new = key[:6] + extra + key[6:]
            if new not in tuner.cache:
                tuner.cache[new] = cfg
                added += 1
    return added


def fp8_methods(model):
    from octavo.plugins.quant.fp8 import _FP8Method

    for mod in model.modules():
        m = getattr(mod, "quant_method", None)
        if isinstance(m, _FP8Method):
            yield mod, m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ab", choices=("none", "tc", "s6"), default="none",
                    help="s6: S6_VARIANTS (norm warps, L2 prefetch chain, PDL), graph recaptured for each")
    ap.add_argument("--budget", type=float, default=1e9, help="s6: start no variant after this many seconds")
    ap.add_argument("--variants", default="", help="s6: comma-separated names of S6_VARIANTS (default: all)")
    ap.add_argument("--tiles", default=None, help="fp8_gemv_bench.py JSON: its best tensor-core tile per shape")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--sweep", type=float, default=0.0,
                    help="seconds for the in-graph tile sweep per shape (fp8_bs1_tiles.py); then --variants "
                         "may name swept / swept_again (the best tiles pinned)")
    ap.add_argument("--table-sweep", type=float, default=0.0,
                    help="seconds for this card's table sweep (fp8_bs1_tiles.sweep_table: tile + loop per shape in the "
                         "graph, the table path); then --variants may name tsweep / tsweep_again*")
    ap.add_argument("--probe-tokens", type=int, default=0,
                    help="after each measure, that many greedy tokens with top-2 log-probabilities (untimed): where "
                         "a variant's tokens part from the first measure's, and the top-2 gap there")
    args = ap.parse_args()
    PROBE["tokens"] = args.probe_tokens
    from benchmarks.fp8_bs1_tiles import pin, strict_bytes, sweep, tuned_tiles, unpin
    from benchmarks.fp8_bs1_variants import S6_VARIANTS
    from benchmarks.gpu_e2e import LLAMA3_8B, copy_bandwidth, make_llm, write_config

    res = {"card": torch.cuda.get_device_name(), "torch": torch.__version__}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    bw = copy_bandwidth()
    res["copy_bandwidth_TBps"] = bw / 1e12
    tmp = tempfile.mkdtemp()
    d = write_config(LLAMA3_8B, tmp, "llama3-8b")
    t0 = time.perf_counter()
    llm, worker, info = make_llm(d, max_model_len=4096, gpu_memory_utilization=0.9, max_num_seqs=1,
                                 quantization="fp8", kv_cache_dtype="fp8")
    res["load_s"] = time.perf_counter() - t0
    res["fused"] = info.get("fused")
    model = worker.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    res["weights_GB"] = weight_bytes / 1e9
    kinds = {}
    for _, m in fp8_methods(model):
        k = "tc" if getattr(m, "gemv_tc", None) else ("cuda" if m.gemv_max_m else "scaled_mm")
        kinds[k] = kinds.get(k, 0) + 1
    res["gemv_kinds_default"] = kinds
    print("loaded", f"{res['load_s']:.1f} s", kinds, flush=True)
    save()
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(512)]}
    gr = worker.runner.graph_runner
    res["strict"] = strict_bytes(model, weight_bytes, 512 + 128, torch.empty((), dtype=worker._kv_dtype()).element_size())
    with torch.inference_mode():
        measure(llm, gr, prompt, res, "default", bw, weight_bytes, not args.no_profile)
    res["tuned_tiles"] = tuned_tiles()
    from octavo.plugins.quant import fp8_gemv_tiles as gt

    # the measured tiles the GEMV launches instead of the autotuner's, where on
    res["table_tiles"] = {f"{n}x{k}": v for (card, n, k), v in gt.TILES.items() if card == res["card"] and gt.TABLE_ON}
    save()
    if args.sweep and gr is not None:  # the tiles in the graph; "swept" (S6_VARIANTS) then pins the best per shape
        try:
            res["sweep"] = sweep(gr, budget_s=args.sweep)
            S6_VARIANTS["swept"] = S6_VARIANTS["swept_again"] = {"tiles": res["sweep"]["best"], "table": False}
            S6_VARIANTS["silu_rope_swept"] = {"silu": True, "rope": True, "tiles": res["sweep"]["best"], "table": False}
        except Exception as e:  # noqa: BLE001 - record why; the variants still run
            res["sweep"] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print("sweep", res["sweep"], flush=True)
        save()
    if args.table_sweep and gr is not None:  # this card's table rows chosen in the graph: "tsweep*" variants run them
        from benchmarks.fp8_bs1_tiles import rows_variant, sweep_table, swept_rows

        try:
            res["table_sweep"] = sweep_table(gr, budget_s=args.table_sweep)
            swept = rows_variant(swept_rows(res["table_sweep"]))
            for suffix in ("", "_again", "_again2", "_again3"):
                S6_VARIANTS["tsweep" + suffix] = swept
        except Exception as e:  # noqa: BLE001 - record why; the variants still run
            res["table_sweep"] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print("table sweep", res["table_sweep"], flush=True)
        save()
    if args.ab == "s6" and gr is not None:
        from octavo.plugins.platforms import cuda_pdl
        from octavo.plugins.quant import (
            fp8_fused,
            fp8_gemv,
            fp8_gemv_norm,
            fp8_gemv_tiles,
            fp8_prefetch,
            fp8_rope_gemv,
            fp8_silu_gemv,
        )

        base = (fp8_fused.SMALL_ROWS_WARPS, fp8_prefetch.PREFETCH_MB, fp8_prefetch.PDL, fp8_prefetch.SELF_PREFETCH,
                fp8_silu_gemv.STATE["on"])
        base_pdl_w, base_rope, base_table = fp8_prefetch.PDL_W, fp8_rope_gemv.STATE["on"], fp8_gemv_tiles.TABLE_ON
        base_pwb, base_pw_shape = fp8_prefetch.PDL_W_BLOCKS, dict(fp8_prefetch.PDL_W_BY_SHAPE)
        base_tiles, base_amax, base_norm_pdl = dict(fp8_gemv_tiles.TILES), fp8_gemv.AMAX_ONE, fp8_fused.NORM_PDL
        base_loop2, base_loops = fp8_gemv.LOOP2, dict(fp8_gemv_tiles.LOOPS)
        base_gnorm = fp8_gemv_norm.STATE["on"]
        res["gemv_norm_pairs"] = sum(1 for m in model.modules() if "_octavo_norm_tail" in vars(m))
        res["loop_table"] = {f"{n}x{k}": v for (_, n, k), v in base_loops.items()}
        res["pdl_w_blocks_default"] = base_pwb
        base_bits, base_reg_pf, base_acc, base_x2d = fp8_gemv.W_BITS, fp8_gemv.REG_PF, fp8_gemv.ACC_SPLIT, fp8_gemv.X2D
        res["w_bits_default"], res["reg_pf_default"], res["acc_split_default"] = base_bits, base_reg_pf, base_acc
        platform_pdl = cuda_pdl.pdl_on()  # the platform's setting (on by default on sm_90+ since session 6)
        res["platform_pdl_default"] = platform_pdl
        from octavo.plugins.attention import _fp8_kv_decode_bs1 as one_mod

        base_one, base_one_env = dict(one_mod.DEFAULT_LAUNCH), os.environ.get("OCTAVO_FP8_DECODE_ONE")
        chosen = args.variants.split(",") if args.variants else list(S6_VARIANTS)
        saved = {}  # a variant's "set" attributes before it changed them
        for tag in chosen:
            v = S6_VARIANTS.get(tag)
            if v is None:  # "swept" without a sweep
                res[tag] = {"skipped": "no such variant (swept needs --sweep)"}
                continue
            if time.perf_counter() - T0 > args.budget:
                res[tag] = {"skipped": "budget"}
                continue
            pinned = {}
            try:
                fp8_fused.SMALL_ROWS_WARPS = v.get("warps", 16)
                fp8_prefetch.PREFETCH_MB, fp8_prefetch.PDL = v.get("mb", 0), v.get("pdl", base[2])
                fp8_prefetch.SELF_PREFETCH = v.get("self", False)
                fp8_prefetch.PDL_W = v.get("pdlw", base_pdl_w)
                fp8_prefetch.PDL_W_BLOCKS = v.get("pwb", base_pwb)
                fp8_prefetch.PDL_W_BY_SHAPE = dict(v.get("pw_shape", base_pw_shape))
                cuda_pdl.set_pdl(v.get("pdl_all", platform_pdl))
                fp8_silu_gemv.STATE["on"] = v.get("silu", base[4])
                if fp8_silu_gemv.STATE["on"] and "silu_fused" not in res:
                    with torch.inference_mode():
                        res["silu_fused"] = fp8_silu_gemv.fuse_fp8_silu_gemv(model, torch.device("cuda"))
                fp8_rope_gemv.STATE["on"] = v.get("rope", base_rope)
                fp8_gemv_tiles.TABLE_ON = v.get("table", base_table)  # off: the autotuner's tiles (or pinned ones)
                if fp8_rope_gemv.STATE["on"] and "rope_fused" not in res:
                    with torch.inference_mode():
                        res["rope_fused"] = fp8_rope_gemv.fuse_fp8_rope_gemv(model, torch.device("cuda"))
                fp8_gemv.W_BITS, fp8_gemv.REG_PF = v.get("bits", base_bits), v.get("reg_pf", base_reg_pf)
                fp8_gemv.ACC_SPLIT, fp8_gemv.X2D = v.get("acc", base_acc), v.get("x2d", base_x2d)
                fp8_gemv.AMAX_ONE, fp8_fused.NORM_PDL = v.get("amax", base_amax), v.get("norm_pdl", base_norm_pdl)
                fp8_gemv.LOOP2 = v.get("loop2", base_loop2)
                fp8_gemv_norm.STATE["on"] = v.get("gnorm", base_gnorm)
                one_mod.DEFAULT_LAUNCH.clear()
                one_mod.DEFAULT_LAUNCH.update(base_one, **v.get("one", {}))
                if "one" in v:
                    os.environ["OCTAVO_FP8_DECODE_ONE"] = "1"
                elif base_one_env is None:
                    os.environ.pop("OCTAVO_FP8_DECODE_ONE", None)
                else:
                    os.environ["OCTAVO_FP8_DECODE_ONE"] = base_one_env
                res.setdefault("seeded_tiles", {})[tag] = seed_tiles(
                    {"W_BITS": fp8_gemv.W_BITS and not fp8_gemv.ACC_SPLIT, "REG_PF": fp8_gemv.REG_PF,
                     "ACC_SPLIT": fp8_gemv.ACC_SPLIT})
                card = torch.cuda.get_device_name()
                for (n, k), tile in v.get("table_tiles", {}).items():  # restored from base_tiles below
                    fp8_gemv_tiles.TILES[(card, n, k)] = tile
                for (n, k), trip in v.get("table_loops", {}).items():  # restored from base_loops below
                    fp8_gemv_tiles.LOOPS[(card, n, k)] = trip
                for name, value in v.get("set", {}).items():  # "module:ATTR" -> value, restored below
                    mod, attr = name.split(":")
                    mod = importlib.import_module(mod)
                    saved.setdefault((mod, attr), getattr(mod, attr))
                    setattr(mod, attr, value)
                if v.get("install"):  # "module:function"(model, device): wrappers a variant's switch needs
                    mod, fn = v["install"].split(":")
                    res.setdefault("installed", {})[v["install"]] = getattr(importlib.import_module(mod), fn)(
                        model, torch.device("cuda"))
                pinned = pin(v["tiles"]) if "tiles" in v else {}
                res.setdefault("pinned_tiles", {})[tag] = v.get("tiles")
                with torch.inference_mode():
                    gr.capture()
                    measure(llm, gr, prompt, res, tag, bw, weight_bytes, not args.no_profile)
            except Exception as e:  # noqa: BLE001 - record why
                res[tag] = {"error": f"{type(e).__name__}: {e}"[:400]}
                print(tag, res[tag], flush=True)
            finally:
                for (mod, attr), value in saved.items():
                    setattr(mod, attr, value)
                saved.clear()
                unpin(pinned)
                fp8_gemv_tiles.TILES.clear()
                fp8_gemv_tiles.TILES.update(base_tiles)
                fp8_gemv_tiles.LOOPS.clear()
                fp8_gemv_tiles.LOOPS.update(base_loops)
            save()
        (fp8_fused.SMALL_ROWS_WARPS, fp8_prefetch.PREFETCH_MB, fp8_prefetch.PDL, fp8_prefetch.SELF_PREFETCH,
         fp8_silu_gemv.STATE["on"]) = base
        fp8_prefetch.PDL_W, fp8_prefetch.PDL_W_BLOCKS, fp8_prefetch.PDL_W_BY_SHAPE = base_pdl_w, base_pwb, base_pw_shape
        fp8_rope_gemv.STATE["on"], fp8_gemv_tiles.TABLE_ON = base_rope, base_table
        fp8_gemv.W_BITS, fp8_gemv.REG_PF, fp8_gemv.ACC_SPLIT, fp8_gemv.X2D = base_bits, base_reg_pf, base_acc, base_x2d
        fp8_gemv.AMAX_ONE, fp8_fused.NORM_PDL, fp8_gemv.LOOP2 = base_amax, base_norm_pdl, base_loop2
        fp8_gemv_norm.STATE["on"] = base_gnorm
        cuda_pdl.set_pdl(platform_pdl)
        one_mod.DEFAULT_LAUNCH.clear()
        one_mod.DEFAULT_LAUNCH.update(base_one)
    if args.ab == "tc" and gr is not None:
        tiles = {}
        if args.tiles and os.path.exists(args.tiles):
            with open(args.tiles) as f:
                best = json.load(f).get("best_tc", {})
            for name, (n, k) in {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                                 "down": (4096, 14336)}.items():
                if name in best:
                    dot, *cfg = best[name]["config"]
                    tiles[(n, k)] = (dot == "fp8", tuple(cfg))
        res["ab_tiles"] = {f"{n}x{k}": [("fp8" if v[0] else "f16"), *v[1]] for (n, k), v in tiles.items()}
        switched = 0
        with torch.inference_mode():
            for mod, m in fp8_methods(model):
                if not m.gemv_max_m:
                    continue
                choice = tiles.get(tuple(mod.weight.shape), (True, (16, 512, 4, 3)))
                m.gemv_tc = choice
                switched += 1
            res["ab_switched"] = switched
            t = time.perf_counter()
            gr.capture()
            res["ab_recapture_s"] = time.perf_counter() - t
            print("switched", switched, "linears to the tensor-core GEMV; recaptured in",
                  f"{res['ab_recapture_s']:.1f} s", flush=True)
            measure(llm, gr, prompt, res, "tc_gemv", bw, weight_bytes, not args.no_profile)
            save()
            try:  # the same with programmatic dependent launch (OCTAVO_FP8_GEMV_PDL)
                from octavo.plugins.quant import fp8_gemv_tc

                fp8_gemv_tc.PDL = True
                t = time.perf_counter()
                gr.capture()
                res["pdl_recapture_s"] = time.perf_counter() - t
                measure(llm, gr, prompt, res, "tc_gemv_pdl", bw, weight_bytes, False)
            except Exception as e:  # noqa: BLE001 - record why
                res["tc_gemv_pdl"] = {"error": f"{type(e).__name__}: {e}"[:400]}
                print("pdl", res["tc_gemv_pdl"], flush=True)
    res["seconds"] = time.perf_counter() - T0
    save()
    del llm
    print(f"done in {res['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
