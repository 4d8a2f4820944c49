"""octavo:spec_decode_* on /metrics and in LLM.get_metrics(), from SchedulerStats (no model)."""

from octavo.core.messages import SchedulerStats
from octavo.core.spec_decode import record_verification
from octavo.metrics import metrics_from_stats
from octavo.server.metrics import ServerMetrics


def test_prometheus_counters_follow_the_cumulative_stats():
    stats = SchedulerStats()
    record_verification(stats, 4, 2, 3)
    record_verification(stats, 3, 3, 4)
    m = ServerMetrics("m")
    m.record_stats(stats)
    record_verification(stats, 2, 0, 1)
    m.record_stats(stats)
    text = m.render()[0].decode()
    for line in ['octavo:spec_decode_num_drafts_total{model_name="m"} 3.0',
                 'octavo:spec_decode_num_draft_tokens_total{model_name="m"} 9.0',
                 'octavo:spec_decode_num_accepted_tokens_total{model_name="m"} 5.0',
                 'octavo:spec_decode_num_emitted_tokens_total{model_name="m"} 8.0',
                 'octavo:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 2.0',
                 'octavo:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0']:
        assert line in text, line


def test_get_metrics_values():
    stats = SchedulerStats()
    record_verification(stats, 4, 2, 3)
    got = {m.name: m for m in metrics_from_stats(stats)}
    assert got["octavo:spec_decode_num_accepted_tokens"].value == 2
    assert got["octavo:spec_decode_acceptance_rate"].value == 0.5
    assert got["octavo:spec_decode_num_accepted_tokens_per_pos"].values == [1, 1, 0, 0]
