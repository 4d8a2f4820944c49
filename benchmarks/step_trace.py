"""The GPU timeline of batch-1 decode steps, split into the captured forward and everything else (session 16,
benchmarks/head16_ab.py): from a CUDA-only torch.profiler trace of a greedy generation (no CPU activity, so the
host is not slowed by the profiler and stays as far ahead of the GPU as it is in the timed runs).

Steps are cut at each step's one device-to-host copy (the sampled ids), or where there is none (the zero-copy step
graph) at each step's fill kernel; the first two and the last are left out.
Per step: the span, the time some kernel or copy ran (union), the idle rest and its gaps by the pair of ops around
them, and every op by name (count and us a step). Ops outside the graph = the step's ops minus what one replay of
the batch-1 body graph runs (``graph_counts``, from a trace of replays alone), so a head graph's kernels count as
outside."""

from __future__ import annotations

from collections import Counter, defaultdict


def device_ops(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every kernel / copy / memset in the trace, in start order."""
    out = []
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and str(dt).endswith("CUDA") and e.time_range.end > e.time_range.start:
            out.append((e.time_range.start, e.time_range.end, e.name))
    out.sort()
    return out


def busy_us(spans) -> float:
    """The length of the union of ``(start, end, ...)`` intervals sorted by start: the time some op ran."""
    busy, cur_s, cur_e = 0.0, None, None
    for s, e, *_ in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def graph_counts(prof, replays: int) -> dict[str, float]:
    """Ops by name per replay, from a trace of ``replays`` replays of one graph alone."""
    c = Counter(name for _, _, name in device_ops(prof))
    return {k: v / replays for k, v in c.items()}


def _short(name: str) -> str:
    return name[:70]


def step_table(prof, graph: dict[str, float] | None = None, skip_first: int = 2) -> dict:
    """The per-step account (module docstring) of a profiled generation."""
    ops = device_ops(prof)
    cuts = [end for start, end, name in ops if "DtoH" in name]
    if len(cuts) < skip_first + 3:  # the zero-copy step graph copies nothing back: cut before each step's fill kernel
        cuts = [start for start, end, name in ops if "_fill_step_kernel" in name]
    if len(cuts) < skip_first + 3:
        return {"error": f"{len(cuts)} device-to-host copies / step fills in the trace: too few steps"}
    cuts = cuts[skip_first:]
    steps = len(cuts) - 1
    lo, hi = cuts[0], cuts[-1]
    busy, idle, gaps = 0.0, 0.0, defaultdict(float)
    names, name_us = Counter(), defaultdict(float)
    end, prev = lo, "DtoH"
    for start, stop, name in ops:
        if stop <= lo or start >= hi:
            continue
        s, t = max(start, lo), min(stop, hi)
        names[name] += 1
        name_us[name] += t - s
        if s > end:
            idle += s - end
            if s - end > 1.0:
                gaps[f"{_short(prev)} -> {_short(name)}"] += s - end
        if t > end:
            busy += t - max(s, end)
            end, prev = t, name
    out = {"steps": steps, "step_us": round((hi - lo) / steps, 1), "busy_us": round(busy / steps, 1),
           "idle_us": round(idle / steps, 1),
           "idle_gaps_us": {k: round(v / steps, 2) for k, v in sorted(gaps.items(), key=lambda kv: -kv[1])[:10]}}
    graph = graph or {}
    outside, outside_us = {}, 0.0
    for name, n in names.items():
        per = n / steps
        extra = per - graph.get(name, 0.0)
        if extra > 0.05:
            us = name_us[name] / steps * (extra / per)  # the op's mean time, for the calls the graph does not make
            outside[_short(name)] = {"n": round(extra, 2), "us": round(us, 2)}
            outside_us += us
    out["outside_graph_ops"] = dict(sorted(outside.items(), key=lambda kv: -kv[1]["us"]))
    out["outside_graph_op_us"] = round(outside_us, 1)
    # every op by its time a step, the graph's included: what grows with the context (the attention reads more KV)
    out["top_ops_us"] = {_short(k): round(v / steps, 1) for k, v in sorted(name_us.items(), key=lambda kv: -kv[1])[:8]}
    out["ops_per_step"] = round(sum(names.values()) / steps, 1)
    return out
