"""MoE models end to end on one GPU: batch-1 decode against the roofline over the bytes a token actually
reads (the routed experts only), and offline throughput against transformers on the same shape in the same
process. Random weights (``load_format="dummy"``; transformers: random init on the GPU), bf16, CUDA graphs.

    python benchmarks/moe_e2e.py --tasks bs1:qwen3-30b-a3b:48 bs1:mixtral-8x7b:16 --out-dir /tmp/r
    python benchmarks/moe_e2e.py --tasks tput:qwen3-30b-a3b:8 tf:qwen3-30b-a3b:8 --out-dir /tmp/r

Each task is ``kind:shape:layers`` and writes ``<kind>_<shape>_<layers>L.json`` into ``--out-dir`` as soon as
it ends (a timeout keeps what finished). ``--deadline-s`` skips tasks that would start too late.

- ``bs1``: ms per output token at batch 1 as the difference of greedy generations of 1, n+1 and 2n+1 tokens
  after a 512-token prompt (the prefill cancels), best of two each. ``bytes_read_per_token`` = every weight
  except the experts and the embedding table (one row of it is read), plus ``top_k`` experts per MoE layer,
  plus the mean KV bytes attended; ``fraction_of_roofline`` = (bytes / copy bandwidth measured in the same
  process) / ms per token. ``graph_forward_ms`` replays the captured batch-1 forward alone (no host work).
- ``tput``: ``--prompts`` x ``--in-len``/``--out-len`` random prompts through ``LLM.generate`` (ignore_eos);
  also ``--short-out-len`` (or the length transformers ran, when ``tf`` came first).
- ``tf``: transformers ``generate`` (greedy, batch of all prompts, ``min_new_tokens = max_new_tokens``) on the
  same config and layer count. It first times 8 and 16 new tokens, then picks the first output length that
  fits ``--tf-budget-s`` among ``--out-len``, ``--short-out-len`` (octavo runs both) and anything shorter,
  and says so (``tf_out_len``); with ``--tf-fewer-prompts`` it first tries ``--out-len`` for fewer requests
  (128 .. 16, sized from a 16-request probe; ``tf_prompts``; the rate is per useful output token of that
  smaller batch); ``tf`` BEFORE ``tput`` of
  the same shape makes octavo run exactly that length (when transformers ran all prompts).
- ``both``: ``bs1`` then ``tput`` on one engine (the throughput engine's settings; one start instead of two).
- ``--tiny``: small shapes on whatever device is there (a CPU dry run of every code path; numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moe_common import SHAPES, _free, _sync, bandwidth, config, gen_timed, make_llm  # noqa: E402
from moe_tput import measure_tput, task_tf, task_tput  # noqa: E402


def bytes_read_per_token(model, cfg: dict, context: float) -> dict:
    """Weight bytes a batch-1 decode step must read: all but the experts and the embedding table, plus
    ``top_k`` experts per MoE layer; and the KV bytes of ``context`` cached tokens."""
    from octavo.nn.fused_moe import FusedMoE

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    moe = [m for m in model.modules() if isinstance(m, FusedMoE)]
    experts_all = sum(m.w13_weight.numel() * m.w13_weight.element_size() + m.w2_weight.numel() *
                      m.w2_weight.element_size() for m in moe)
    active = sum(m.top_k * 3 * m.hidden_size * m.intermediate_size * m.w13_weight.element_size() for m in moe)
    embed = model.model.embed_tokens.weight
    embed_bytes = embed.numel() * embed.element_size()
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv = cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2 * 2 * context
    return {"weights_GB": total / 1e9, "experts_GB": experts_all / 1e9, "active_experts_GB": active / 1e9,
            "moe_layers": len(moe), "kv_GB": kv / 1e9,
            "bytes_read": total - experts_all + active - embed_bytes + kv,
            "bytes_read_with_embedding_table": total - experts_all + active + kv}


def task_bs1(args, shape, layers, tmp) -> dict:
    cfg = config(shape, layers, args.tiny)
    bandwidth(args.tiny)  # before the engine: its 8 GiB of copy buffers do not fit beside 0.9 of an H100 (s10 b1 OOM)
    llm, load_s = make_llm(cfg, tmp, f"{shape}-{layers}", max_model_len=1024, max_num_seqs=args.bs1_max_num_seqs,
                           **({"async_scheduling": True} if args.async_scheduling else {}))
    res = measure_bs1(args, shape, layers, cfg, llm, load_s)
    llm.llm_engine.shutdown()
    del llm
    _free()
    return res


def task_both(args, shape, layers, tmp) -> dict:
    """bs1 then tput on ONE engine (the throughput engine's settings; its graph sizes include 1): one start."""
    cfg = config(shape, layers, args.tiny)
    bandwidth(args.tiny)  # before the engine (see task_bs1)
    llm, load_s = make_llm(cfg, tmp, f"{shape}-{layers}-both", max_model_len=args.in_len + args.out_len + 16,
                           max_num_seqs=args.prompts, gpu_memory_utilization=0.9,
                           **({"async_scheduling": True} if args.async_scheduling else {}))
    res = {"bs1": measure_bs1(args, shape, layers, cfg, llm, load_s)}
    print(json.dumps(res["bs1"], default=str), flush=True)
    res["tput"] = measure_tput(args, shape, layers, cfg, llm, load_s)
    llm.llm_engine.shutdown()
    del llm
    _free()
    return res


def measure_bs1(args, shape, layers, cfg, llm, load_s) -> dict:
    from octavo import SamplingParams

    bw = bandwidth(args.tiny)
    worker = llm.llm_engine.core.executor.driver
    notes = worker.prepared.notes if worker.prepared else {}
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(10, cfg["vocab_size"] - 10) for _ in range(args.prompt_len)]}
    n = args.bs1_tokens
    head_graphs = None
    if args.graph_head_ab or args.switch_ab:  # OCTAVO_GRAPH_HEAD=1: the headline runs the default (eager) head
        from octavo.plugins.platforms.cuda_graph_head import graph_head_state

        head_graphs = graph_head_state(worker, False).get("captured")
    gen_timed(llm, [prompt], SamplingParams(max_tokens=8, ignore_eos=True))  # warm-up

    def best(tokens, llm=llm):
        return min(gen_timed(llm, [prompt], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0))[0]
                   for _ in range(2))

    t1, t2, t3 = best(1), best(n + 1), best(2 * n + 1)
    per_tok = (t3 - t1) / (2 * n)
    b = bytes_read_per_token(worker.model, cfg, args.prompt_len + n)
    roof = b["bytes_read"] / bw
    res = {"shape": shape, "layers": layers, "layers_full_model": SHAPES[shape]["num_hidden_layers"],
           "async_scheduling": getattr(llm.llm_engine.core, "async_loop", None) is not None, "copy_bandwidth_TBps": bw / 1e12, "load_s": load_s,
           "moe": notes.get("moe"), "fused": notes.get("fused"), "graph_sizes": len(notes.get("graph_sizes") or []),
           **b, "decode_ms_per_token": per_tok * 1e3, "ms_per_token_first_half": (t2 - t1) / n * 1e3,
           "ms_per_token_second_half": (t3 - t2) / n * 1e3, "roofline_ms": roof * 1e3,
           "fraction_of_roofline": roof / per_tok,
           "fraction_of_roofline_with_embedding_table": b["bytes_read_with_embedding_table"] / bw / per_tok,
           "warm_up": "graphs captured at start; one untimed 8-token generation before the timed ones; every "
                      "re-captured A/B variant runs one eager forward before its capture"}
    if args.graph_head_ab:  # the LM head + sampler graphs (OCTAVO_GRAPH_HEAD=1) off / on, alternating, this engine
        from moe_head_ab import graph_head_ab

        print(json.dumps(res, default=str), flush=True)  # the headline (eager head) first
        res["graph_head_ab"] = graph_head_ab(worker, lambda: (best(2 * n + 1) - best(1)) / (2 * n) * 1e3)
        print(json.dumps(res["graph_head_ab"]), flush=True)
        if head_graphs:  # back to the default for what follows (host diagnostics, A/B by re-capture)
            graph_head_state(worker, False)
    if args.host_ab:  # GIL switch interval / blocking event wait, alternating, this engine (moe_host.py)
        from moe_host import host_ab

        if not args.graph_head_ab:
            print(json.dumps(res, default=str), flush=True)  # the headline first
        try:
            res["host_ab"] = host_ab(lambda: (best(2 * n + 1) - best(1)) / (2 * n) * 1e3)
        except Exception as e:  # noqa: BLE001 - an extra: the headline and what follows stand without it
            res["host_ab"] = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(res["host_ab"]), flush=True)
    per_token = lambda: (best(2 * n + 1) - best(1)) / (2 * n) * 1e3  # noqa: E731
    if args.switch_ab or args.engine_ab:  # session 12: staging x head graphs; MoE decode configs end to end
        import moe_engine_ab
        from moe_variants import E2E_ROWS

        if not (args.graph_head_ab or args.host_ab):
            print(json.dumps(res, default=str), flush=True)  # the headline first
        for key, run in (("switch_ab", lambda: moe_engine_ab.switch_ab(worker, per_token, args.ab_rounds)),
                         ("engine_ab", lambda: moe_engine_ab.engine_variant_ab(
                             worker, per_token, E2E_ROWS, args.engine_ab_rounds, stop_at=args.t0 + args.deadline_s - 30))):
            if getattr(args, key):
                try:
                    res[key] = run()
                except Exception as e:  # noqa: BLE001 - an extra: the headline and what follows stand without it
                    res[key] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
                print(json.dumps({key: res[key]}), flush=True)
    if args.staging_diag:  # the host diagnostics below with the step inputs staged (core/step_staging.py)
        from octavo.core import input_batch

        input_batch.STAGING = True
        res["staging_on_for_diag"] = True
    gr = getattr(worker.runner, "graph_runner", None)
    if gr is not None and 1 in getattr(gr, "graphs", {}):
        _sync()
        t = time.perf_counter()
        for _ in range(30):
            gr.graphs[1].replay()
        _sync()
        res["graph_forward_ms"] = (time.perf_counter() - t) / 30 * 1e3
        res["graph_forward_fraction_of_roofline"] = roof * 1e3 / res["graph_forward_ms"]
        res["host_gap_ms_per_token"] = res["decode_ms_per_token"] - res["graph_forward_ms"]
        if args.graph_gap_diag:  # the forward graph after a copy / a kernel / itself (moe_host.py, session 12)
            from moe_host import graph_gap_diag

            print(json.dumps(res, default=str), flush=True)  # the measurement first: the first JSON line is the key
            try:
                res["graph_gap_diag"] = graph_gap_diag(gr)
            except Exception as e:  # noqa: BLE001 - a diagnostic
                res["graph_gap_diag"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(json.dumps({"graph_gap_diag": res["graph_gap_diag"]}), flush=True)
    if args.host_diag:  # where the step goes outside the graph: CUPTI trace + cProfile (moe_host.py)
        from moe_host import host_diag

        print(json.dumps(res, default=str), flush=True)  # the measurement first: the first JSON line is the key
        res["host_diag"] = host_diag(llm, prompt)
        print(json.dumps(res["host_diag"], default=str)[:6000], flush=True)
    if gr is not None and 1 in getattr(gr, "graphs", {}):
        if args.profile:  # kernel table + A/B against the general MoE kernel at batch 1 (moe_profile.py)
            from moe_profile import profile_bs1

            print(json.dumps(res, default=str), flush=True)  # the measurement, should the profile run out of time

            try:
                res["profile"] = profile_bs1(gr, worker.model, pdl=args.profile_pdl)
            except Exception as e:  # noqa: BLE001 - the measurement above stands without it
                res["profile"] = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(res["profile"], default=str)[:6000], flush=True)
        if args.profile_attn:  # A/B of the batch-1 one-launch attention variants, same engine (moe_profile.py)
            from moe_profile import profile_attn

            print(json.dumps(res, default=str)[:3000], flush=True)
            try:
                res["attn_ab"] = profile_attn(gr, worker.model)
            except Exception as e:  # noqa: BLE001 - the measurement above stands without it
                res["attn_ab"] = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(res["attn_ab"], default=str)[:6000], flush=True)
        if args.profile_prefetch:  # A/B of the L2 prefetch hints, same engine (moe_profile.py, session 8)
            from moe_profile import profile_prefetch

            print(json.dumps(res, default=str)[:3000], flush=True)
            try:
                res["prefetch_ab"] = profile_prefetch(gr, worker.model, stop_at=args.t0 + args.deadline_s - 14)
            except Exception as e:  # noqa: BLE001 - the measurement above stands without it
                res["prefetch_ab"] = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(res["prefetch_ab"], default=str)[:6000], flush=True)
    return res


TASKS = {"bs1": task_bs1, "tput": task_tput, "tf": task_tf, "both": task_both}
EST_S = {"bs1": 20, "tput": 15, "tf": 10, "both": 25}  # least time left to start a task (seconds)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", required=True, help="kind:shape:layers (kinds: bs1, tput, tf, both)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="bs1 engines with async_scheduling=True (the default leaves the engine's choice; the JSON "
                         "records what ran)")
    ap.add_argument("--profile", action="store_true",
                    help="bs1: kernel table of the captured forward and an A/B without the batch-1 MoE path")
    ap.add_argument("--graph-head-ab", action="store_true",
                    help="bs1: ms per token with the LM head + sampler graphs off / on (needs OCTAVO_GRAPH_HEAD=1)")
    ap.add_argument("--host-diag", action="store_true",
                    help="bs1: CUPTI trace + cProfile of a 65-token generation: GPU idle per step, syncs (moe_host.py)")
    ap.add_argument("--host-ab", action="store_true",
                    help="bs1: ms per token with the GIL switch interval / blocking event wait switched (moe_host.py)")
    ap.add_argument("--switch-ab", action="store_true",
                    help="staging off/on x head graphs off/on, ms per token, alternating (moe_engine_ab.py)")
    ap.add_argument("--engine-ab", action="store_true",
                    help="moe_variants.E2E_ROWS with the engine's graphs re-captured per row, ms per token, alternating")
    ap.add_argument("--ab-rounds", type=int, default=3, help="rounds of --switch-ab")
    ap.add_argument("--engine-ab-rounds", type=int, default=2, help="rounds of --engine-ab")
    ap.add_argument("--graph-gap-diag", action="store_true",
                    help="the forward graph's replay after a copy / a kernel / itself (moe_host.graph_gap_diag)")
    ap.add_argument("--staging-diag", action="store_true", help="--host-diag with the step inputs staged")
    ap.add_argument("--profile-pdl", action="store_true", help="--profile also re-captures with OCTAVO_PDL on")
    ap.add_argument("--profile-attn", action="store_true",
                    help="bs1: A/B the batch-1 one-launch attention variants by re-capture (needs OCTAVO_MOE_DECODE_ATTN=1)")
    ap.add_argument("--profile-prefetch", action="store_true",
                    help="bs1: A/B the L2 prefetch hints of the batch-1 MoE kernels by re-capture (moe_prefetch.py)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--bs1-tokens", type=int, default=128)
    ap.add_argument("--bs1-max-num-seqs", type=int, default=8, help="few graph sizes: a fast start")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--in-len", type=int, default=512)
    ap.add_argument("--out-len", type=int, default=512)
    ap.add_argument("--tf-budget-s", type=float, default=12.0)
    ap.add_argument("--short-out-len", type=int, default=64,
                    help="tput also runs this output length (for transformers, which may not fit --out-len)")
    ap.add_argument("--tf-fewer-prompts", action="store_true",
                    help="tf: when --out-len does not fit --tf-budget-s for all prompts, run it for fewer (128 .. 16) "
                         "before shortening the output")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="skip tasks that would start after this")
    args = ap.parse_args(argv)
    t0 = args.t0 = time.monotonic()
    os.makedirs(args.out_dir, exist_ok=True)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.tasks:
            kind, shape, layers = spec.split(":")
            left = args.deadline_s - (time.monotonic() - t0)
            if left < EST_S[kind]:
                print(f"skip {spec}: {left:.0f} s left", flush=True)
                report[spec] = {"skipped": f"{left:.0f} s left"}
                continue
            print(f"== {spec} at {time.monotonic() - t0:.1f} s", flush=True)
            try:
                res = TASKS[kind](args, shape, int(layers), tmp)
            except Exception as e:  # noqa: BLE001 - record it and go on with the next task
                import traceback

                traceback.print_exc()
                res = {"error": f"{type(e).__name__}: {e}"}
                _free()
            res["task_s"] = time.monotonic() - t0
            report[spec] = res
            print(json.dumps(res, default=str), flush=True)
            with open(os.path.join(args.out_dir, f"{kind}_{shape}_{layers}L.json"), "w") as f:
                json.dump(res, f, indent=1, default=str)
    return report


if __name__ == "__main__":
    main()
