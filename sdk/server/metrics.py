"""Prometheus metrics of one server (``GET /metrics``), named like vLLM's with the prefix ``octavo:``.

Each app gets its own ``CollectorRegistry`` (two servers in one process never collide). Gauges follow
the core's latest ``SchedulerStats``; counters follow its cumulative totals (increased by the
difference since the last stats); the latency histograms are observed in the front end when a request
finishes, from the times the output processor records (arrival, first token, last token).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Buckets as vLLM's (seconds).
_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
         40.0, 80.0, 160.0, 640.0, 2560.0]
_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_E2E = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
        960.0, 1920.0, 7680.0]

# cumulative SchedulerStats field -> counter name
_COUNTERS = {
    "num_prompt_tokens": ("prompt_tokens", "Prompt tokens computed (prefill)."),
    "num_generation_tokens": ("generation_tokens", "Tokens generated."),
    "num_preemptions": ("num_preemptions", "Requests preempted (their KV blocks reclaimed)."),
    "prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    "spec_decode_num_drafts": ("spec_decode_num_drafts", "Speculative verification rounds (request-steps with drafts)."),
    "spec_decode_num_draft_tokens": ("spec_decode_num_draft_tokens", "Draft tokens proposed and verified."),
    "spec_decode_num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Draft tokens accepted."),
    "spec_decode_num_emitted_tokens": ("spec_decode_num_emitted_tokens", "Tokens emitted by verification rounds."),
}


class ServerMetrics:
    """The server's metrics; ``attach(engine)`` subscribes them to the engine's stats and finished outputs."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(f"octavo:{name}", doc, labels, registry=r).labels(model_name)

        def hist(name: str, doc: str, buckets: list[float]) -> Any:
            return Histogram(f"octavo:{name}", doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage: fraction of blocks in use (1 = full).")
        self.hit_rate = gauge("prefix_cache_hit_rate", "Prefix-cache hit rate over all lookups (tokens).")
        self.counters = {f: Counter(f"octavo:{name}", doc, labels, registry=r).labels(model_name)
                         for f, (name, doc) in _COUNTERS.items()}
        self._last = dict.fromkeys(_COUNTERS, 0)
        self.spec_per_pos = Counter("octavo:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by "
                                    "position in the draft (0 = first).", ["model_name", "position"], registry=r)
        self._last_per_pos: list[int] = []
        self.success = Counter("octavo:request_success", "Finished requests, by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.ttft = hist("time_to_first_token_seconds", "Time to first token.", _TTFT)
        self.tpot = hist("time_per_output_token_seconds", "Time per output token after the first.", _TPOT)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency.", _E2E)
        self.model_name = model_name

    def attach(self, engine: Any) -> None:
        engine.stats_observers.append(self.record_stats)
        engine.finished_observers.append(self.record_finished)
        if engine.stats is not None:
            self.record_stats(engine.stats)

    def record_stats(self, stats: Any) -> None:
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        self.hit_rate.set(stats.prefix_cache_hit_rate)
        for field, counter in self.counters.items():
            value = getattr(stats, field)
            delta = value - self._last[field]
            if delta > 0:
                counter.inc(delta)
            self._last[field] = value
        per_pos = getattr(stats, "spec_decode_accepted_per_pos", None) or []
        for pos, value in enumerate(per_pos):
            delta = value - (self._last_per_pos[pos] if pos < len(self._last_per_pos) else 0)
            if delta > 0:
                self.spec_per_pos.labels(self.model_name, str(pos)).inc(delta)
        self._last_per_pos = list(per_pos)

    def record_finished(self, out: Any) -> None:
        m = out.metrics or {}
        now = time.monotonic()
        arrival, first, last = m.get("arrival_time"), m.get("first_token_time"), m.get("last_token_time")
        for c in out.outputs:
            if c.finish_reason is not None:
                self.success.labels(self.model_name, c.finish_reason).inc()
        if arrival is None:
            return
        self.e2e.observe(max(0.0, now - arrival))
        if first is not None:
            self.ttft.observe(max(0.0, first - arrival))
            n = m.get("num_generation_tokens") or 0
            if last is not None and n > 1:
                self.tpot.observe(max(0.0, (last - first) / (n - 1)))

    def render(self) -> tuple[bytes, str]:
        from octavo.server.vllm_routes import with_vllm_names

        return with_vllm_names(generate_latest(self.registry)), CONTENT_TYPE_LATEST  # octavo: and vllm: names
