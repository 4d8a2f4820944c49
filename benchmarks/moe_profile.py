"""Where a captured batch-1 decode forward spends its time: the kernel table of a CUDA-graph replay, and the same
forward re-captured without the batch-1 MoE fusions (norm + router in one launch, ``moe_norm_router.py``; the
two-launch expert path, ``moe_decode_kernels.py``): an A/B in one engine, so no second 60 GB start.

Used by ``benchmarks/moe_e2e.py --profile`` on the engine's graph runner (``plugins/platforms/cuda_graphs.py``).
The kernel table comes from ``torch.profiler`` (CUPTI records the kernels a graph launches one by one):
per kernel name, launches and device microseconds per forward; ``kernel_us`` summed against the replay's wall
time shows the gaps between kernels inside the graph. Optionally the forward re-captured with programmatic
dependent launch on (``plugins/platforms/cuda_pdl.py``, opt-in in the engine).
"""

from __future__ import annotations

import json
import time

import torch


def _replay_ms(replay, iters: int = 30) -> float:
    replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def kernel_table(replay, iters: int = 10, top: int = 30) -> dict:
    """Kernels of ``iters`` calls of ``replay``, per call: ``[{name, launches, us}]`` by time, and totals."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            replay()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        us = getattr(ev, "cuda_time_total", 0) if us is None else us
        if us > 0 and ev.count > 0:
            rows.append({"name": ev.key[:110], "launches": round(ev.count / iters, 2), "us": round(us / iters, 2)})
    rows.sort(key=lambda r: -r["us"])
    return {"kernel_launches": round(sum(r["launches"] for r in rows), 1),
            "kernel_us": round(sum(r["us"] for r in rows), 1), "table": rows[:top]}


@torch.inference_mode()
def recapture(runner, size: int = 1):
    """A fresh graph of the runner's ``size`` forward with the model as it is now (own memory pool)."""
    from octavo.model import ForwardContext

    layout = runner._layout(size)
    ctx = ForwardContext(attn_metadata=runner.metadata[size], query_start_loc=layout.query_start_loc)
    ids, pos = runner.input_ids[:size], runner.positions[:size]
    runner.model(ids, pos, ctx)  # warm-up: compiles whatever the new path needs
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph.out = runner.model(ids, pos, ctx)  # the captured output buffer, compared with the engine's graph
    return graph


def _rel_diff(graph, runner) -> float:
    """Max |difference| of this graph's forward and the engine's captured one on the same static inputs, over the
    engine's output scale (bf16 noise is ~1e-2; a broken fusion gives O(1))."""
    runner.graphs[1].replay()
    want = runner.outputs[1].float().clone()
    graph.replay()
    torch.cuda.synchronize()
    return round(float((graph.out.float() - want).abs().max() / (want.abs().max() + 1e-6)), 5)


def profile_bs1(runner, model, with_table: bool = True, pdl: bool = False) -> dict:
    """Graph-replay time and kernel table of the batch-1 forward as captured; re-captured with the norm + router
    fusion off; then also with every MoE layer's two-launch path off (the general kernel); then restored. With
    ``pdl`` also re-captured with programmatic dependent launch on (new PDL variants of every taking-part kernel
    compile: seconds)."""
    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms import cuda_moe

    res = {"captured_ms": round(_replay_ms(runner.graphs[1].replay), 4)}
    if with_table:
        res["captured_kernels"] = kernel_table(runner.graphs[1].replay)
    from octavo.plugins.platforms.moe_norm_router import set_norm_router

    pairs = [(m, m._moe_block) for m in model.modules() if "_moe_block" in vars(m)]
    layers = [m for m in model.modules() if isinstance(m, FusedMoE) and "forward" in m.__dict__]
    res["layers_on_two_launch_path"], res["layers_with_norm_router"] = len(layers), len(pairs)
    if pairs:  # A: the post-attention norm and the router GEMV apart again
        for norm, block in pairs:
            set_norm_router(norm, block, False)
        try:
            graph = recapture(runner)
            res["norm_router_off_ms"] = round(_replay_ms(graph.replay), 4)
            res["norm_router_off_rel_diff"] = _rel_diff(graph, runner)
            del graph
        except Exception:
            for norm, block in pairs:
                set_norm_router(norm, block, True)
            raise
    saved = [(m, m.__dict__["forward"], m._moe_decode) for m in layers]
    for m in layers:  # B: and the general kernel at batch 1 (routing launch, w13, w2, sum): session 4's forward
        cuda_moe._decode_off(m)
    try:
        if layers:
            graph = recapture(runner)
            res["general_kernel_ms"] = round(_replay_ms(graph.replay), 4)
            res["general_kernel_rel_diff"] = _rel_diff(graph, runner)
            if with_table:
                res["general_kernel_kernels"] = kernel_table(graph.replay)
            del graph
    finally:
        for m, fwd, dec in saved:
            m.forward, m._moe_decode = fwd, dec
        for norm, block in pairs:
            set_norm_router(norm, block, True)
    if "norm_router_off_ms" in res:
        res["norm_router_saves_ms"] = round(res["norm_router_off_ms"] - res["captured_ms"], 4)
    if "general_kernel_ms" in res:
        res["all_batch1_moe_fusions_save_ms"] = round(res["general_kernel_ms"] - res["captured_ms"], 4)
    if not pdl:
        return res
    try:  # programmatic dependent launch (cuda_pdl.py, opt-in): what it would give this forward
        from octavo.plugins.platforms import cuda_pdl

        if not cuda_pdl.pdl_on():
            cuda_pdl.set_pdl(True)
            try:
                graph = recapture(runner)
                res["pdl_on_ms"] = round(_replay_ms(graph.replay), 4)
                del graph
            finally:
                cuda_pdl.set_pdl(False)
    except Exception as e:  # noqa: BLE001 - an extra: the numbers above stand without it
        res["pdl_on_error"] = f"{type(e).__name__}: {e}"
    return res


def profile_attn(runner, model, variants=None, with_table: bool = True) -> dict:
    """Session 7 A/B of the batch-1 one-launch attention (``plugins/platforms/moe_attention.py``) in one engine:
    the forward re-captured with it off (the four-launch path: q/k norm + rope, KV write, split-KV attention,
    merge) and with each launch variant on; replay ms and the output's difference from the engine's graph each;
    the kernel table of the fastest variant. Restores the installed settings."""
    from octavo.plugins.platforms.moe_attention import DEFAULTS, set_attn_one

    mods = [m for m in model.modules() if "_attn_one" in vars(m)]
    res = {"layers_with_one_launch_attention": len(mods), "captured_ms": round(_replay_ms(runner.graphs[1].replay), 4)}
    if not mods:
        return res
    saved = dict(mods[0]._attn_one)
    res["captured_settings"] = saved
    # session 7 batch 1 (H100): off 3.098 ms, splits 16 3.161, 8 3.271, 8 without early 3.253, 4 3.441, 4 x 128 4.452
    variants = variants or [{"on": False}, {"splits": 16, "dot16": False}, {"splits": 16, "dot16": True}, {"splits": 8, "dot16": True},
                            {"splits": 16, "dot16": True, "early": False}, {"splits": 16, "dot16": True, "num_warps": 8}]
    rows, best = [], None
    try:
        for v in variants:
            set_attn_one(model, **{"on": True, **DEFAULTS, **v})
            try:
                graph = recapture(runner)
                ms = round(min(_replay_ms(graph.replay) for _ in range(3)), 4)
                rows.append({**v, "ms": ms, "rel_diff": _rel_diff(graph, runner)})
                if v.get("on", True) and (best is None or ms < best[1]["ms"]):
                    best = (v, rows[-1])
                del graph
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile: recorded, the others run
                rows.append({**v, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
        res["variants"] = rows
        off = next((r for r in rows if r.get("on") is False and "ms" in r), None)
        if off and best:
            res["best"] = best[1]
            res["best_saves_ms"] = round(off["ms"] - best[1]["ms"], 4)
            if with_table:
                set_attn_one(model, **{"on": True, **DEFAULTS, **best[0]})
                graph = recapture(runner)
                res["best_kernels"] = kernel_table(graph.replay)
                del graph
                res["pdl_off_kernels"] = _tables_without_pdl(runner, model, {"off": {"on": False}, "best": best[0]})
    finally:
        set_attn_one(model, **saved)
    return res


def _tables_without_pdl(runner, model, variants: dict) -> dict:
    """Kernel tables of re-captures with PDL off: under PDL a kernel's time includes its wait for its predecessor,
    so only these split the step by kernel (the replay ms differ from the PDL ones)."""
    from octavo.plugins.platforms import cuda_pdl
    from octavo.plugins.platforms.moe_attention import DEFAULTS, set_attn_one

    was = cuda_pdl.pdl_on()
    out = {}
    cuda_pdl.set_pdl(False)
    try:
        for name, v in variants.items():
            set_attn_one(model, **{"on": True, **DEFAULTS, **v})
            graph = recapture(runner)
            out[name] = {"ms": round(_replay_ms(graph.replay), 4), **kernel_table(graph.replay, top=14)}
            del graph
    except Exception as e:  # noqa: BLE001 - an extra
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        cuda_pdl.set_pdl(was)
    return out


# session 8: L2 prefetch hints (plugins/platforms/moe_prefetch.py), each re-captured in the same engine
PF_ALL = ({"prefetch": 1, "merge": 1}, {"PF_W2": True, "PF_NEXT": True, "EVICT": "evict_first"}, {})
PREFETCH_VARIANTS = [  # likeliest first: the part's time cap may cut the list (each row is printed as it ends)
    ("base", {}, {}, {}),
    ("attn_merge1", {"merge": 1}, {}, {}),  # the attention's merge of the splits unrolled
    ("attn_pf1", {"prefetch": 1}, {}, {}),
    ("w13_pipe", {}, {"PIPE": True}, {}),  # w13's loads one K-block ahead (same bits)
    ("w13_pf_w2_evict_first", {}, {"PF_W2": True, "EVICT": "evict_first"}, {}),
    ("w13_pf_next_evict_first", {}, {"PF_NEXT": True, "EVICT": "evict_first"}, {}),
    ("w2_pf_next1", {}, {}, {"PF_NEXT": 1}),
    ("all_w13_next", *PF_ALL),
    ("all_w2_next", {"prefetch": 1, "merge": 1}, {"PF_W2": True, "EVICT": "evict_first"}, {"PF_NEXT": 1}),
    ("route_launch", {}, {"ROUTE": "launch"}, {}),  # routing as its own launch: what the in-kernel routing costs
    # the post-attention norm + router in one launch (moe_norm_router.py), installed here when the engine did not
    ("norm_router", {}, {}, {}, {"nr": True}),
    ("norm_qkv", {}, {}, {}, {"nr": False, "nq": {}}),  # the input norm + qkv GEMV in one launch (moe_norm_qkv.py)
    ("norm_both_all_w13_next", *PF_ALL, {"nr": True, "nq": {}}),
    ("attn_pf2", {"prefetch": 2}, {}, {}),
    ("w2_pf_next2", {}, {}, {"PF_NEXT": 2}),
    ("w13_pipe_bk512", {}, {"PIPE": True, "BLOCK_K": 512}, {}),
    ("w13_pf_w2", {}, {"PF_W2": True}, {}),
    ("base_again", {}, {}, {}),
]


def _fusion_state(model) -> dict:
    """The norm fusions as the engine installed them: norm + router pairs (``moe_norm_router.py``) and input norm
    + qkv pairs (``moe_norm_qkv.py``), and whether each is on."""
    nr = [(m, m._moe_block) for m in model.modules() if "_moe_block" in vars(m)]
    nq = [(m, m._moe_attn) for m in model.modules() if "_moe_attn" in vars(m)]
    return {"nr_pairs": nr, "nr_default": bool(nr), "nq_pairs": nq,
            "nq_default": dict(nq[0][1]._norm_qkv) if nq and nq[0][1]._norm_qkv["on"] else None}


def _apply_fusions(model, fus: dict, state: dict) -> dict:
    """Switch the norm fusions for the next re-capture: ``fus["nr"]`` (bool) the norm + router pairs, ``fus["nq"]``
    (a settings dict, or None = off) the input norm + qkv pairs; a missing key keeps the engine's choice. Installs a
    fusion the engine did not (forced, checked as at start). Returns what is on now (layer counts)."""
    import os

    from octavo.plugins.platforms.moe_norm_qkv import install_norm_qkv, set_norm_qkv
    from octavo.plugins.platforms.moe_norm_router import install_norm_router, set_norm_router

    nr_on = fus.get("nr", state["nr_default"])
    if nr_on and not state["nr_pairs"]:
        old = os.environ.get("OCTAVO_MOE_NORM_ROUTER")
        os.environ["OCTAVO_MOE_NORM_ROUTER"] = "1"
        try:
            state["nr_pairs"] = install_norm_router(model)
        finally:
            if old is None:
                os.environ.pop("OCTAVO_MOE_NORM_ROUTER")
            else:
                os.environ["OCTAVO_MOE_NORM_ROUTER"] = old
    for norm, block in state["nr_pairs"]:
        set_norm_router(norm, block, nr_on)
    nq = fus.get("nq", state["nq_default"])
    if nq is not None and not state["nq_pairs"]:
        state["nq_pairs"] = install_norm_qkv(model, force=True)
    if state["nq_pairs"]:
        set_norm_qkv(state["nq_pairs"], **({"on": True, **nq} if nq is not None else {"on": False}))
    return {"nr": len(state["nr_pairs"]) if nr_on else 0, "nq": len(state["nq_pairs"]) if nq is not None else 0}


# session 8 batch 2: the engine starts with batch 1's winners as defaults (unrolled attention merge, norm + router
# fused); the old defaults for the same-engine comparison, then tiles with fewer registers (w2's default 4 x 512 at
# 8 warps needs 208 registers: one program per SM over ~4 waves; cuobjdump of the sm_90 build), rank routing,
# attention splits with the cheaper merge, input norm + qkv with tiles of fewer registers
W2 = lambda bn, bk, nw: {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw}  # noqa: E731
B2_VARIANTS = [
    ("defaults", {}, {}, {}),
    ("session7_defaults", {"merge": 0}, {}, {}, {"nr": False}),
    ("w2_2x256_4w", {}, {}, W2(2, 256, 4)),  # 92 registers
    ("w2_2x256_8w", {}, {}, W2(2, 256, 8)),  # 80
    ("w2_1x512_4w", {}, {}, W2(1, 512, 4)),  # 111
    ("w13_rank", {}, {"ROUTE": "rank"}, {}),
    ("attn_splits32", {"splits": 32}, {}, {}),
    ("w2_2x128_4w", {}, {}, W2(2, 128, 4)),  # 80
    ("w13_8x256", {}, {"BLOCK_N": 8}, {}),  # 88 registers, 768 programs
    ("norm_qkv_32x256", {}, {}, {}, {"nq": {"block_n": 32, "block_k": 256}}),
    ("attn_splits8", {"splits": 8}, {}, {}),
    ("norm_qkv_8x1024", {}, {}, {}, {"nq": {"block_n": 8, "block_k": 1024}}),
    ("w13_16x128", {}, {"BLOCK_K": 128}, {}),  # 80 registers
    ("w2_2x256_4w+w13_rank", {}, {"ROUTE": "rank"}, W2(2, 256, 4)),
    ("w2_2x256_4w+w13_8x256_rank", {}, {"BLOCK_N": 8, "ROUTE": "rank"}, W2(2, 256, 4)),
    ("defaults_again", {}, {}, {}),
]
# session 9: the w2 launch routes itself and loads its first PRE K-blocks of w2 before its PDL wait
# (cuda_moe_w2_early.py; same bits). Registers of the sm_90 builds (cuobjdump, CPU): 2 x 128 at 4 warps PRE 1/2/4/6
# 112/111/127/178 (the plain launch 80); 1 x 128 PRE 6 124; 2 x 256 PRE 3 166. Mixtral 8 x 512 at 8 warps PRE 1/2/4
# 111/111/169 (k=2).
PRE = lambda n, **t: {"PRE": n, **t}  # noqa: E731
T2 = {"BLOCK_N": 2, "BLOCK_K": 128, "num_warps": 4}  # the shipped H100 w2 tile (an H200 has no config file: 4 x 256)
B9_VARIANTS = [  # the one launch last: a launch that spun forever would cost only those rows; ~2 s a variant
    ("defaults", {}, {}, {}),
    ("w2_2x128", {}, {}, T2),  # the base of the PRE rows on any card
    ("w2_pre4", {}, {}, PRE(4, **T2)),
    ("o_early8_4x512", {"o_early": 8, "o_tile": (4, 512, 4)}, {}, {}),  # cuda_moe_oproj.py: 168 registers
    ("w2_pre2", {}, {}, PRE(2, **T2)),
    ("o_early8_8x512_8w", {"o_early": 8, "o_tile": (8, 512, 8)}, {}, {}),  # 173
    ("w2_pre6", {}, {}, PRE(6, **T2)),
    ("w2_pre4+o_early8_4x512", {"o_early": 8, "o_tile": (4, 512, 4)}, {}, PRE(4, **T2)),
    ("defaults_again", {}, {}, {}),
    ("one_pre2", {}, {}, PRE(2, ONE=True, **T2)),  # w13 + w2 in one launch (cuda_moe_one_launch.py; 155 registers)
    ("one_pre4", {}, {}, PRE(4, ONE=True, **T2)),
]
B9_MIXTRAL = [("defaults", {}, {}, {}), ("w2_pre2", {}, {}, PRE(2)), ("w2_pre4", {}, {}, PRE(4)),
              ("w2_pre1", {}, {}, PRE(1)), ("w2_pre2_16x256", {}, {}, PRE(2, BLOCK_N=16, BLOCK_K=256)),
              ("defaults_again", {}, {}, {}), ("one_pre2", {}, {}, PRE(2, ONE=True))]
PREFETCH_SETS = {"b1": PREFETCH_VARIANTS, "b2": B2_VARIANTS,  # $MOE_PF_SET picks the list (moe7.sh prefetch / ab,
                 "b9": B9_VARIANTS, "b9mix": B9_MIXTRAL}  # moe9.sh ab / mixab)


def profile_prefetch(runner, model, variants=None, with_table: bool = True) -> dict:
    """Session 8 A/B of the L2 prefetch hints in one engine: the batch-1 forward re-captured with each variant
    (attention settings, w13 / w2 config keys), replay ms (best of 3) and the output's difference from the
    engine's graph (a hint cannot change a result: expect 0.0). Restores the installed settings."""
    import copy

    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms.moe_attention import set_attn_one

    mods = [m for m in model.modules() if "_attn_one" in vars(m)]
    layers = [m for m in model.modules() if isinstance(m, FusedMoE) and m.__dict__.get("_moe_decode") is not None]
    res = {"layers_with_one_launch_attention": len(mods), "layers_on_two_launch_path": len(layers),
           "layers_with_next_weight": sum("_moe_next_weight" in vars(m) for m in layers),
           "captured_ms": round(_replay_ms(runner.graphs[1].replay), 4)}
    saved_attn = dict(mods[0]._attn_one) if mods else None
    saved_cfg = [(m, m._moe_decode_cfg) for m in layers]
    import os

    rows, best, state = [], None, _fusion_state(model)
    res["set"] = os.environ.get("MOE_PF_SET", "b1")
    try:
        for name, attn, w13, w2, *fus in variants or PREFETCH_SETS[res["set"]]:
            fused = _apply_fusions(model, fus[0] if fus else {}, state)
            if mods:
                set_attn_one(model, **{**saved_attn, **attn})
            for m, cfg in saved_cfg:
                new = copy.deepcopy(cfg)
                new["w13"].update(w13)
                new["w2"].update(w2)
                m._moe_decode_cfg = new
            try:
                graph = recapture(runner)
                ms = round(min(_replay_ms(graph.replay) for _ in range(3)), 4)
                rows.append({"name": name, "ms": ms, "rel_diff": _rel_diff(graph, runner), "fused": fused})
                if best is None or ms < best[1]["ms"]:
                    best = ((attn, w13, w2, fus[0] if fus else {}), rows[-1])
                del graph
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile: recorded, the others run
                rows.append({"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
        res["variants"] = rows
        if best:
            res["best"] = best[1]
            if with_table:
                attn, w13, w2, fus = best[0]
                _apply_fusions(model, fus, state)
                if mods:
                    set_attn_one(model, **{**saved_attn, **attn})
                for m, cfg in saved_cfg:
                    new = copy.deepcopy(cfg)
                    new["w13"].update(w13)
                    new["w2"].update(w2)
                    m._moe_decode_cfg = new
                graph = recapture(runner)
                res["best_kernels"] = kernel_table(graph.replay, top=12)
                del graph
                from octavo.plugins.platforms import cuda_pdl  # the same with PDL off: each kernel's own time

                was = cuda_pdl.pdl_on()
                cuda_pdl.set_pdl(False)
                try:
                    graph = recapture(runner)
                    res["best_pdl_off"] = {"ms": round(_replay_ms(graph.replay), 4),
                                           **kernel_table(graph.replay, top=12)}
                    del graph
                except Exception as e:  # noqa: BLE001 - an extra
                    res["best_pdl_off"] = {"error": f"{type(e).__name__}: {e}"}
                finally:
                    cuda_pdl.set_pdl(was)
    finally:
        _apply_fusions(model, {}, state)
        if mods:
            set_attn_one(model, **saved_attn)
        for m, cfg in saved_cfg:
            m._moe_decode_cfg = cfg
    return res
