"""The ``triton`` backend's launch switches without a GPU: the split-KV rule for decode steps of few requests
(``triton.SPLIT_RULE``, ``OCTAVO_TRITON_SPLIT_KV``: which steps split their contexts, into how many programs; pure
arithmetic on a fake 132-SM device) and programmatic dependent launch of the attention kernels
(``OCTAVO_TRITON_PDL``). The split launches themselves are checked against float64 in
``triton_decode_cases.py::test_split_kv_decode_matches_float64``, the PDL code paths there too (the interpreter
runs them, with no-op waits)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("triton")

from octavo.plugins.attention import triton as backend  # noqa: E402

SMS = 132
DEV = SimpleNamespace(type="cuda", index=0)


@pytest.fixture
def impl(monkeypatch):
    monkeypatch.setitem(backend._NUM_SMS, 0, SMS)
    return backend.TritonAttentionBackend(num_heads=16, head_size=128, num_kv_heads=8, scale=128 ** -0.5)


def splits(impl, num_reqs, max_seq_len=4096, max_query_len=1):
    md = SimpleNamespace(max_query_len=max_query_len, num_reqs=num_reqs, max_seq_len=max_seq_len)
    return impl._num_splits(md, 64, DEV)


def legacy(num_reqs, kv_heads=8, max_seq_len=4096, block_n=64):
    """The rule before SPLIT_RULE existed (sessions 1-6), as it was written."""
    want = max(1, (2 * SMS) // max(1, num_reqs * kv_heads))
    useful = max(1, math.ceil(max_seq_len / (2 * block_n)))
    s = min(want, useful, 16)
    return 1 << (s.bit_length() - 1)


def test_default_rule_is_the_legacy_rule(impl, monkeypatch):
    monkeypatch.setattr(backend, "SPLIT_RULE", backend.DEFAULT_SPLIT_RULE)
    for n in list(range(0, 300)) + [512]:
        for msl in (1, 100, 4096):
            assert splits(impl, n, msl) == legacy(n, max_seq_len=msl), (n, msl)
    assert splits(impl, 1, 4096, max_query_len=2) == 1  # steps with prefill rows never split


def test_wider_rule_splits_more_steps_into_more_programs(impl, monkeypatch):
    monkeypatch.setattr(backend, "SPLIT_RULE", (4, 8))
    assert splits(impl, 67) == 1  # 536 programs > 4 x 132: the decode launch as before
    assert splits(impl, 66) == 2  # 528 programs: 1056 // 528
    assert splits(impl, 40) == 2 and splits(impl, 20) == 4 and splits(impl, 8) == 16 and splits(impl, 1) == 16
    # at least two key tiles of 64 per split: 200 keys -> 2 splits, 100 keys -> none
    assert splits(impl, 8, max_seq_len=200) == 2 and splits(impl, 8, max_seq_len=100) == 1


def test_env_switch_parses_and_refuses(monkeypatch):
    monkeypatch.delenv("OCTAVO_TRITON_SPLIT_KV", raising=False)
    assert backend._split_rule_from_env() == backend.DEFAULT_SPLIT_RULE
    monkeypatch.setenv("OCTAVO_TRITON_SPLIT_KV", "4,8")
    assert backend._split_rule_from_env() == (4, 8)
    for raw in ("4", "4,8,1", "0,8", "4,x", "4,65", "-1,2"):
        monkeypatch.setenv("OCTAVO_TRITON_SPLIT_KV", raw)
        with pytest.raises(ValueError, match="OCTAVO_TRITON_SPLIT_KV"):
            backend._split_rule_from_env()


def test_attention_pdl_switch(monkeypatch):
    """On by default where the platform's PDL is on (the interpreter counts as on); OCTAVO_TRITON_PDL=0 gives plain
    launches; any other value is refused naming the variable."""
    from octavo.plugins.platforms import cuda_pdl

    for raw, on in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv("OCTAVO_TRITON_PDL", raw)
        monkeypatch.setattr(backend, "ATTN_PDL", None)
        monkeypatch.setattr(cuda_pdl, "launch_opts", lambda: {"PDL": True, "launch_pdl": True})
        assert backend._pdl_opts() == ({"PDL": True, "launch_pdl": True} if on else {})
    monkeypatch.setenv("OCTAVO_TRITON_PDL", "yes")
    monkeypatch.setattr(backend, "ATTN_PDL", None)
    with pytest.raises(ValueError, match="OCTAVO_TRITON_PDL"):
        backend._pdl_opts()
