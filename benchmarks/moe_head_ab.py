"""Batch-1 decode of a MoE model with the LM head + sampler CUDA graphs (plugins/platforms/cuda_graph_head.py,
``OCTAVO_GRAPH_HEAD=1``) switched off and on in the same engine, alternating (``moe_e2e.py --graph-head-ab``).

Why: the session-8 Qwen3-30B-A3B step was 3.12 ms of which the captured body was 2.80 ms; the LM head (622 MB of
bf16, ~0.2 ms at the copy rate) and the sampler ran eagerly after it.
"""

from __future__ import annotations


def graph_head_ab(worker, ms_per_token) -> dict:
    """ms per token with the head graphs off and on, alternating (2 rounds); the engine is left with them on."""
    try:
        from octavo.plugins.platforms.cuda_graph_head import graph_head_state
    except ImportError as e:
        return {"error": f"no head graphs in this tree: {e}"}
    if not graph_head_state(worker).get("captured"):
        return {"captured": False, "note": "start the engine with OCTAVO_GRAPH_HEAD=1"}
    out = {"off_ms": [], "on_ms": []}
    for _ in range(2):
        for on in (False, True):
            graph_head_state(worker, on)
            out["on_ms" if on else "off_ms"].append(round(ms_per_token(), 4))
    out["state"] = graph_head_state(worker, True)
    return out
