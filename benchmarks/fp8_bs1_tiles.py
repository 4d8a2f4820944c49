"""Helpers of benchmarks/fp8_bs1.py (session 11): the strict roofline's bytes, the one-row GEMV's time per weight
shape inside the captured forward, its autotuned tiles, and a sweep of those tiles in the graph.

Why: the one-row fp8 GEMV streams its 128 weights a token at 0.54-0.81 of the copy rate (docs/performance.md "FP8
session 10"), and its autotuner times each tile on a lone kernel with the flags of its first call, while the graph
runs it back to back under programmatic dependent launch: the tile that wins alone need not win there. The sweep
pins one shape's tile at a time (the autotuner's cache entry), recaptures the one-row graph and times its replays,
alternating tiles over rounds, so a choice is made on the forward the engine really runs.
"""

from __future__ import annotations

import json
import time

import torch

# the Llama-3-8B fp8 linears in forward order within a layer: (N, K) -> name
SHAPES = {(6144, 4096): "qkv", (4096, 4096): "o", (28672, 4096): "gate_up", (4096, 14336): "down"}
GEMV_NAME = "_fp8_gemv_kernel"


def strict_bytes(model, weight_bytes: int, context: float, kv_elem_bytes: int) -> dict:
    """What one decode step must read: every parameter but the embedding table (a step gathers one row of it),
    plus the KV cache at ``context`` tokens in its own element size (1 byte for fp8 KV)."""
    emb = model.model.embed_tokens.weight
    emb_bytes = emb.numel() * emb.element_size()
    kv = int(context * 32 * 8 * 128 * 2 * kv_elem_bytes)
    return {"embedding_table_bytes": emb_bytes, "kv_bytes_strict": kv,
            "strict_bytes": weight_bytes - emb_bytes + emb.shape[1] * emb.element_size() + kv}


def tuned_tiles() -> dict:
    """The one-row GEMV's autotuned tile per (N, K) and flags, as the autotuners hold them now."""
    from octavo.plugins.quant import fp8_gemv

    out = {}
    for tname, tuner in (("full", fp8_gemv._fp8_gemv_tuned), ("split", fp8_gemv._fp8_gemv_tuned_split)):
        for key, cfg in tuner.cache.items():
            kw = cfg.all_kwargs()
            name = SHAPES.get((key[0], key[1]), f"{key[0]}x{key[1]}")
            out[f"{tname}:{name}:{','.join(str(k) for k in key[2:9])}"] = [kw.get("BLOCK_N"), kw.get("BLOCK_K"),
                                                                          kw.get("num_warps"), kw.get("num_stages")]
    return out


def gemv_by_shape(prof, replays: int) -> dict:
    """Per layer position (qkv, o, gate_up, down) the one-row GEMV's mean kernel time in us per forward, from the
    profiler's device events in time order (the 4 GEMVs of each layer launch in forward order; o / down with the norm
    in their tail, fp8_gemv_norm.py, counted as theirs)."""
    evs = [e for e in prof.events() if e.name in (GEMV_NAME, "_fp8_gemv_norm_kernel") and getattr(e, "device_type", None) is not None
           and "CUDA" in str(e.device_type)]
    evs.sort(key=lambda e: e.time_range.start)
    names = ("qkv", "o", "gate_up", "down")
    tot = {n: 0.0 for n in names}
    for i, e in enumerate(evs):
        tot[names[i % 4]] += e.time_range.elapsed_us()
    return {n: round(v / max(replays, 1), 1) for n, v in tot.items()} | {"launches": len(evs) / max(replays, 1)}


def replay_ms(graph, n: int = 100) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def sweep(gr, rounds: int = 2, budget_s: float = 40.0) -> dict:
    """For each shape, each tile of the split-accumulator autotuner pinned in turn (the other shapes keep theirs),
    the graph recaptured and replayed; rounds alternate the tile order. Returns ms per forward by shape and tile,
    the best tile per shape and the autotuner's own choice. The tuned entries are restored at the end."""
    from octavo.plugins.quant import fp8_gemv, fp8_gemv_tiles

    tuner = fp8_gemv._fp8_gemv_tuned_split
    saved, table = dict(tuner.cache), fp8_gemv_tiles.TABLE_ON
    fp8_gemv_tiles.TABLE_ON = False  # the autotuner's cache decides the tiles while sweeping
    if not any(key[:2] in SHAPES for key in tuner.cache):  # the table chose every tile so far: tune now
        with torch.inference_mode():
            gr.capture()
        saved = dict(tuner.cache)
    t0 = time.perf_counter()
    res: dict = {"ms": {}, "tuned": {}, "best": {}}
    try:
        for (n, k), name in SHAPES.items():
            keys = [key for key in tuner.cache if key[0] == n and key[1] == k]
            if not keys:
                res["ms"][name] = "no tuned entry"
                continue
            tuned = {key: tuner.cache[key] for key in keys}
            res["tuned"][name] = {str(key[2:4]): _tile(c) for key, c in tuned.items()}  # (QUANT_X, PRE_Q): tile
            times: dict = {}
            for r in range(rounds):
                order = tuner.configs if r % 2 == 0 else tuner.configs[::-1]
                for cfg in order:
                    if time.perf_counter() - t0 > budget_s:
                        res["stopped"] = f"budget {budget_s} s at {name} round {r}"
                        break
                    for key in keys:
                        tuner.cache[key] = cfg
                    with torch.inference_mode():
                        gr.capture()
                    replay_ms(gr.graphs[1], 10)
                    times.setdefault(_tile(cfg), []).append(replay_ms(gr.graphs[1]))
            tuner.cache.update(tuned)
            res["ms"][name] = {t: [round(x, 4) for x in v] for t, v in times.items()}
            if times:
                res["best"][name] = min(times, key=lambda t: min(times[t]))
            print("sweep", name, "tuned", res["tuned"][name], json.dumps(res["ms"][name]), flush=True)
    finally:
        tuner.cache.clear()
        tuner.cache.update(saved)
        fp8_gemv_tiles.TABLE_ON = table
        with torch.inference_mode():
            gr.capture()
    return res


#: the table sweep's candidates for one weight shape: (BLOCK_N, BLOCK_K, warps, stages) x weight blocks a main-loop
#: trip (fp8_gemv's LOOP2, 0 or 2). The split autotuner's tiles that came close on the H100 (session 11: 16x512 and
#: 32x512 lost 40-280 us there, 8x1024 on 2 warps 15-60 us and spills with two blocks a trip) plus 8x1024 on 8 warps; LOOP2 is part of the choice (session 12: it won for o / down
#: on the 1-program-an-SM tile and lost for qkv / gate_up on 4x1024), so it is swept with each tile.
TABLE_CANDIDATES = [(tile, loop) for tile in ((4, 1024, 4, 3), (8, 1024, 4, 4), (16, 1024, 8, 3), (8, 1024, 8, 3))
                    for loop in (0, 2)]
#: the order the table sweep takes the shapes in (coordinate descent: each shape keeps its best for the next):
#: the largest excess over the copy rate first (session 15's H100 critical path: down, then gate_up's bulk)
SWEEP_ORDER = ((4096, 14336), (28672, 4096), (4096, 4096), (6144, 4096))
H100 = "NVIDIA H100 80GB HBM3"


def table_rows(card: str) -> dict:
    """``{(N, K): (tile, loop)}`` of fp8_gemv_tiles' rows for ``card`` (loop 0 where LOOPS has none)."""
    from octavo.plugins.quant import fp8_gemv_tiles as gt

    return {(n, k): (tile, gt.LOOPS.get((c, n, k), 0)) for (c, n, k), tile in gt.TILES.items() if c == card}


def _label(tile, loop) -> str:
    return f"{tile[0]}x{tile[1]}w{tile[2]}s{tile[3]}" + (f"_loop{loop}" if loop else "")


def sweep_table(gr, rounds: int = 2, budget_s: float = 100.0, start: dict | None = None) -> dict:
    """The one-row GEMV's table rows for THIS card chosen in the captured forward: from ``start`` (``{(N, K): (tile,
    loop)}``, default the H100's rows), each shape in SWEEP_ORDER in turn takes every TABLE_CANDIDATES entry as its
    fp8_gemv_tiles TILES / LOOPS row (the other shapes keep their current best), the graph is recaptured and its
    replays timed; rounds alternate the candidate order; the shape keeps its fastest (min over rounds). The launch
    is the engine's (table path: tile + loop + PDL + the norm's e4m3 input), unlike :func:`sweep` (autotuner cache,
    no loop). Returns ms per forward by shape and candidate, the best per shape, and the start. TILES / LOOPS and the
    graph are restored at the end."""
    from octavo.plugins.quant import fp8_gemv_tiles as gt

    card = torch.cuda.get_device_name()
    saved_t, saved_l, saved_on = dict(gt.TILES), dict(gt.LOOPS), gt.TABLE_ON
    cur = dict(start if start is not None else table_rows(H100))
    res: dict = {"card": card, "start": {SHAPES[s]: _label(*v) for s, v in cur.items()}, "ms": {}, "best": {},
                 "best_rows": {}}
    t0 = time.perf_counter()

    def apply(rows: dict) -> None:
        for (n, k), (tile, loop) in rows.items():
            gt.TILES[(card, n, k)] = tuple(tile)
            gt.LOOPS[(card, n, k)] = loop  # 0: one block a trip (table_loop's default)
    try:
        gt.TABLE_ON = True
        for shape in SWEEP_ORDER:
            name, times = SHAPES[shape], {}
            for r in range(rounds):
                for cand in (TABLE_CANDIDATES if r % 2 == 0 else TABLE_CANDIDATES[::-1]):
                    if time.perf_counter() - t0 > budget_s:
                        res["stopped"] = f"budget {budget_s} s at {name} round {r}"
                        break
                    apply({**cur, shape: cand})
                    try:
                        with torch.inference_mode():
                            gr.capture()
                        replay_ms(gr.graphs[1], 10)
                        times.setdefault(cand, []).append(replay_ms(gr.graphs[1]))
                    except Exception as e:  # noqa: BLE001 - a tile that does not compile here: recorded, skipped
                        res.setdefault("errors", {})[f"{name}:{_label(*cand)}"] = f"{type(e).__name__}: {e}"[:200]
            if times:
                best = min(times, key=lambda c: min(times[c]))
                cur[shape] = best
                res["best"][name] = _label(*best)
                res["best_rows"][name] = [list(best[0]), best[1]]
            res["ms"][name] = {_label(*c): [round(x, 4) for x in v] for c, v in times.items()}
            print("table sweep", name, "best", res["best"].get(name), json.dumps(res["ms"][name]), flush=True)
            if "stopped" in res:
                break
    finally:
        gt.TILES.clear()
        gt.TILES.update(saved_t)
        gt.LOOPS.clear()
        gt.LOOPS.update(saved_l)
        gt.TABLE_ON = saved_on
        with torch.inference_mode():
            gr.capture()
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["rows"] = {f"{n}x{k}": [list(t), loop] for (n, k), (t, loop) in cur.items()}
    return res


def rows_variant(rows: dict) -> dict:
    """An ``--ab s6`` variant (fp8_bs1_variants.py) that runs the table path with these ``{(N, K): (tile, loop)}``
    rows for this card (fp8_bs1.py writes them into TILES / LOOPS under this card's name and restores them)."""
    return {"table": True, "table_tiles": {s: tuple(t) for s, (t, _) in rows.items()},
            "table_loops": {s: loop for s, (_, loop) in rows.items()}}


def swept_rows(res: dict) -> dict:
    """:func:`sweep_table`'s chosen rows as ``{(N, K): (tile, loop)}``."""
    return {tuple(int(v) for v in key.split("x")): (tuple(t), loop) for key, (t, loop) in res["rows"].items()}


def _tile(cfg) -> str:
    kw = cfg.all_kwargs()
    return f"{kw.get('BLOCK_N')}x{kw.get('BLOCK_K')}w{kw.get('num_warps')}s{kw.get('num_stages')}"



def pin(best: dict) -> dict:
    """Pin the split autotuner's tile per shape name (``{"qkv": "16x512w4s3", ...}``, as :func:`sweep` names them);
    returns the entries replaced, for :func:`unpin`."""
    from octavo.plugins.quant import fp8_gemv

    tuner = fp8_gemv._fp8_gemv_tuned_split
    by_tile = {_tile(c): c for c in tuner.configs}
    old = {}
    for key in list(tuner.cache):
        name = SHAPES.get((key[0], key[1]))
        if name in best and best[name] in by_tile:
            old[key] = tuner.cache[key]
            tuner.cache[key] = by_tile[best[name]]
    return old


def unpin(old: dict) -> None:
    from octavo.plugins.quant import fp8_gemv

    fp8_gemv._fp8_gemv_tuned_split.cache.update(old)
