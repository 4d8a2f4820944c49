"""Session 12's batch-1 MoE A/Bs measured as the headline is, ms per generated token in one engine, alternating:

- ``switch_ab``: the step's host-side switches, each combination in turn, the order rotated every round: one pinned
  staging copy per step (``core/input_batch.STAGING``, core/step_staging.py) and the LM head + sampler graphs
  (``OCTAVO_GRAPH_HEAD=1`` at start, switched by ``cuda_graph_head.graph_head_state``).
- ``engine_variant_ab``: the decode config of every MoE layer (w13 / w2 keys, as the rows of moe_variants.py) with the
  engine's own graphs re-captured, plus the two switches, per row: an in-graph gain measured end to end, host
  included, and the candidate defaults all together (what the next headline would read).
"""

from __future__ import annotations

import copy


def switch_ab(worker, ms_per_token, rounds: int = 3) -> dict:
    """ms per token for staging off/on x head graphs off/on (head modes only when the head graphs were captured).
    Leaves staging as it found it and the head graphs off."""
    from octavo.core import input_batch

    try:
        from octavo.plugins.platforms.cuda_graph_head import graph_head_state

        head = bool(graph_head_state(worker).get("captured"))
    except ImportError:
        head = False
    modes = [("base", False, False), ("staging", True, False)]
    if head:
        modes += [("head", False, True), ("staging+head", True, True)]
    saved = input_batch.STAGING
    out = {name: [] for name, _, _ in modes}
    try:
        for r in range(rounds):
            for name, st, hd in modes[r % len(modes):] + modes[:r % len(modes)]:  # rotated: no mode always first
                input_batch.STAGING = st
                if head:
                    graph_head_state(worker, hd)
                out[name].append(round(ms_per_token(), 4))
    finally:
        input_batch.STAGING = saved
        if head:
            graph_head_state(worker, False)
    out["mean"] = {k: round(sum(v) / len(v), 4) for k, v in out.items() if v}
    return out


def engine_variant_ab(worker, ms_per_token, rows, rounds: int = 2, stop_at: float | None = None) -> dict:
    """``rows`` = [(name, w13 keys, w2 keys, staging, head graphs)]: for each round and row, every MoE layer's decode
    config updated (the graph runner's graphs re-captured when it differs from the last row's), the two switches set,
    ms per token measured. Restores the configs (re-captured) and the switches at the end."""
    import time

    from octavo.core import input_batch
    from octavo.nn.fused_moe import FusedMoE
    from octavo.plugins.platforms.cuda_graph_head import graph_head_state

    gr = worker.runner.graph_runner
    layers = [m for m in worker.model.modules() if isinstance(m, FusedMoE) and m.__dict__.get("_moe_decode") is not None]
    saved, saved_st = [(m, m._moe_decode_cfg) for m in layers], input_batch.STAGING
    head = bool(graph_head_state(worker).get("captured"))
    out, current = {name: [] for name, *_ in rows}, ({}, {})
    try:
        for _ in range(rounds):
            for name, w13, w2, staging, head_on in rows:
                if stop_at is not None and time.monotonic() > stop_at:
                    out.setdefault("skipped", []).append(name)
                    continue
                if head_on and not head:
                    out[name].append("no head graphs")
                    continue
                if (w13, w2) != current:
                    for m, cfg in saved:
                        new = copy.deepcopy(cfg)
                        new["w13"].update(w13)
                        new["w2"].update(w2)
                        m._moe_decode_cfg = new
                    gr.capture()
                    current = (w13, w2)
                input_batch.STAGING = staging
                if head:
                    graph_head_state(worker, head_on)
                out[name].append(round(ms_per_token(), 4))
    finally:
        input_batch.STAGING = saved_st
        if head:
            graph_head_state(worker, False)
        for m, cfg in saved:
            m._moe_decode_cfg = cfg
        if current != ({}, {}):
            gr.capture()
    out["mean"] = {k: round(sum(v) / len(v), 4) for k, v in out.items()
                   if v and k != "skipped" and all(isinstance(x, float) for x in v)}
    return out
