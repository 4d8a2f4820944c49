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
            rows.append({"name": ev.key[:110], "launches": round(ev.count / iters, 2), "us": round(us / iters, 2),
                         "us_per_launch": round(us / ev.count, 2)})  # per layer for the once-a-layer kernels
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


def _fusion_state(model) -> dict:
    """The norm fusions as the engine installed them: norm + router pairs (``moe_norm_router.py``) and input norm
    + qkv pairs (``moe_norm_qkv.py``), and whether each is on."""
    nr = [(m, m._moe_block) for m in model.modules() if "_moe_block" in vars(m)]
    nq = [(m, m._moe_attn) for m in model.modules() if "_moe_attn" in vars(m)]
    return {"nr_pairs": nr, "nr_default": bool(nr), "nq_pairs": nq,
            "ro_default": bool(nr) and bool(getattr(nr[0][1], "_moe_route_once", False)),
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
    ro = fus.get("ro", state.get("ro_default", False))  # route once (OCTAVO_MOE_ROUTE_ONCE): top-k in the norm launch
    for norm, block in state["nr_pairs"]:
        set_norm_router(norm, block, nr_on, route_once=ro and nr_on)
    nq = fus.get("nq", state["nq_default"])
    if nq is not None and not state["nq_pairs"]:
        state["nq_pairs"] = install_norm_qkv(model, force=True)
    if state["nq_pairs"]:
        set_norm_qkv(state["nq_pairs"], **({"on": True, **nq} if nq is not None else {"on": False}))
    return {"nr": len(state["nr_pairs"]) if nr_on else 0, "nq": len(state["nq_pairs"]) if nq is not None else 0,
            "ro": len(state["nr_pairs"]) if nr_on and ro else 0}


def profile_prefetch(runner, model, variants=None, with_table: bool = True, stop_at: float | None = None) -> dict:
    """Session 8 A/B of the L2 prefetch hints in one engine: the batch-1 forward re-captured with each variant
    (attention settings, w13 / w2 config keys), replay ms (best of 3) and the output's difference from the
    engine's graph (a hint cannot change a result: expect 0.0). Rows that would start after ``stop_at``
    (``time.monotonic()``) are skipped, so the kernel tables still fit the caller's cap. Restores the installed
    settings."""
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

    from moe_variants import PREFETCH_SETS

    rows, best, state = [], None, _fusion_state(model)
    res["set"] = os.environ.get("MOE_PF_SET", "b1")
    if mods:  # the engine GEMV's tiles: a BLOCK_K of None in a variant takes these (moe_attention._early)
        from octavo.plugins.platforms.cuda_allreduce_gemv import plain_gemv_config

        res["engine_gemv_tiles"] = {name: plain_gemv_config(*w.shape, w.dtype, w.device) for name, w in
                                    (("qkv", mods[0].qkv_proj.weight), ("o_proj", mods[0].o_proj.weight))}
    try:
        for name, attn, w13, w2, *fus in variants or PREFETCH_SETS[res["set"]]:
            if stop_at is not None and time.monotonic() > stop_at:
                rows.append({"name": name, "skipped": "time cap"})
                continue
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
