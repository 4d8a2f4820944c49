"""Engine metrics as plain values, for ``LLM.get_metrics()`` (vLLM's ``vllm.v1.metrics.reader`` shapes).

The same numbers the server exports at ``/metrics`` (``octavo:`` names, counters cumulative), read from the
scheduler's latest statistics without Prometheus::

    for m in llm.get_metrics():
        if m.name == "octavo:spec_decode_num_accepted_tokens":
            print(m.value)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Metric:
    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Counter(Metric):
    value: int = 0


@dataclass
class Gauge(Metric):
    value: float = 0.0


@dataclass
class Vector(Metric):
    """A counter per position (e.g. accepted drafts per draft position)."""

    values: list[int] = field(default_factory=list)


_GAUGES = {
    "num_running_reqs": "octavo:num_requests_running",
    "num_waiting_reqs": "octavo:num_requests_waiting",
    "kv_cache_usage": "octavo:kv_cache_usage_perc",
    "prefix_cache_hit_rate": "octavo:prefix_cache_hit_rate",
    "spec_decode_acceptance_rate": "octavo:spec_decode_acceptance_rate",
}
_COUNTERS = {
    "num_prompt_tokens": "octavo:prompt_tokens",
    "num_generation_tokens": "octavo:generation_tokens",
    "num_preemptions": "octavo:num_preemptions",
    "prefix_cache_queries": "octavo:prefix_cache_queries",
    "prefix_cache_hits": "octavo:prefix_cache_hits",
    "spec_decode_num_drafts": "octavo:spec_decode_num_drafts",
    "spec_decode_num_draft_tokens": "octavo:spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens": "octavo:spec_decode_num_accepted_tokens",
    "spec_decode_num_emitted_tokens": "octavo:spec_decode_num_emitted_tokens",
    "mm_items_encoded": "octavo:mm_items_encoded",
    "mm_encoder_cache_hits": "octavo:mm_encoder_cache_hits",
}


def metrics_from_stats(stats: Any) -> list[Metric]:
    """Counters, gauges and the per-position vector from one ``SchedulerStats``."""
    out: list[Metric] = []
    for attr, name in _GAUGES.items():
        if hasattr(stats, attr):
            out.append(Gauge(name, value=float(getattr(stats, attr))))
    for attr, name in _COUNTERS.items():
        if hasattr(stats, attr):
            out.append(Counter(name, value=int(getattr(stats, attr))))
    if hasattr(stats, "spec_decode_accepted_per_pos"):
        out.append(Vector("octavo:spec_decode_num_accepted_tokens_per_pos",
                          values=list(stats.spec_decode_accepted_per_pos)))
    return out
