"""cuBLASLt's tabled candidates (``plugins/platforms/cuda_gemm_lt.py``): the table's row bounds per card, finding a
tabled configuration among the heuristic's candidates (once per shape and row count, a warning when it is not
offered), and the operands a candidate is refused for. CPU-only parts here; the library calls themselves run in
``test_cuda_gemm_lt_gpu.py``."""

from __future__ import annotations

import logging

import pytest
import torch

from octavo.plugins.platforms import cuda_gemm_lt as lt

A = {"algo": 66, "tile": 20, "splitk": 1, "reduction": 0, "swizzle": 0, "custom": 0, "stages": 8, "inner": 0,
     "cluster": 0}
B = dict(A, tile=24, splitk=2, reduction=2)


class FakeGemm:
    def __init__(self, offered: list[dict]) -> None:
        self.offered, self.calls = offered, 0

    def algos(self, M, N, K, dtype, count):
        self.calls += 1
        return [(i, 0, 1.0) for i in range(len(self.offered))]


@pytest.fixture
def card(monkeypatch: pytest.MonkeyPatch) -> FakeGemm:
    fake = FakeGemm([A, B])
    monkeypatch.setattr(lt, "_device_name", lambda: "card X")
    monkeypatch.setattr(lt, "_gemm", lambda: fake)
    monkeypatch.setattr(lt, "describe", lambda i: fake.offered[i])
    monkeypatch.setattr(lt, "_RUN", {"gemm": {}, "found": {}, "name": {}, "keys": {}})
    return fake


def test_pick_takes_only_the_listed_sizes_of_this_card(card: FakeGemm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lt, "LT_TABLE", {("card X", 64, 256): {96: B, 264: A}, ("card Y", 64, 128): {512: A}})
    assert [lt.pick(m, 64, 256) for m in (24, 88, 89, 96, 97, 260, 264, 272)] == [None] * 3 + [B, None, None, A, None]
    assert lt.pick(96, 64, 128) is None  # listed for another card only
    assert lt.config_key(A) == lt.config_key(dict(A)) == tuple(sorted(A.items()))
    monkeypatch.setattr(lt, "LT_TABLE", {})
    assert lt.pick(96, 64, 256) is None


def test_find_returns_the_offered_candidate_once_and_warns_when_absent(card: FakeGemm,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    assert lt.find(96, 64, 256, torch.bfloat16, B) == 1
    assert lt.find(96, 64, 256, torch.bfloat16, B) == 1 and card.calls == 1  # cached
    with caplog.at_level(logging.WARNING):
        assert lt.find(96, 64, 256, torch.bfloat16, dict(A, stages=3)) is None
    assert "offers no candidate" in caplog.text and card.calls == 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert lt.find(104, 64, 256, torch.bfloat16, dict(A, stages=3)) is None
    assert "offers no candidate" not in caplog.text  # said once per pick


def test_usable_refuses_operands_the_candidate_was_not_chosen_for(card: FakeGemm,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    def at(rows: int, shift: int) -> torch.Tensor:  # rows x 256 bf16 starting `shift` elements past 256-B alignment
        buf = torch.empty((rows + 2) * 256, dtype=torch.bfloat16)
        o = (-buf.data_ptr() % 256) // 2 + shift
        return buf[o:o + rows * 256].view(rows, 256)

    w, x = at(64, 0), at(96, 0)
    assert lt.usable(x, w, B) == 1
    assert lt.usable(at(96, 8), w, B) is None  # base 16 bytes past alignment
    assert lt.usable(x, at(64, 64), B) is None
    assert lt.usable(torch.empty(96, 512, dtype=torch.bfloat16)[:, :256], w, B) is None  # row stride 512, not K
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert lt.usable(x, w, B) is None  # no workspace yet, inside a capture


def test_first_use_check_compares_large_outputs_in_row_blocks() -> None:
    """``cuda_gemm.first_use_ok`` with ``rows_ref``: a 2,048-row output is compared block by block against the
    reference of each block's rows (the full reference is never built), and one bad row anywhere fails it."""
    from octavo.plugins.platforms.cuda_gemm import first_use_ok

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2048, 64, generator=gen), torch.randn(96, 64, generator=gen)
    good = x @ w.T

    def whole():
        raise AssertionError("the full reference was built")

    calls = []

    def rows(a, b):
        calls.append((a, b))
        return x[a:b] @ w.T

    assert first_use_ok({}, "k", lambda: good.clone(), whole, "t", rows_ref=rows)
    assert calls[0] == (0, 256) and calls[-1] == (1792, 2048) and len(calls) == 8
    bad = good.clone()
    bad[1500, 7] += 0.05 * float(good.abs().max())
    checked: dict = {}
    assert not first_use_ok(checked, "k", lambda: bad, whole, "t", rows_ref=rows) and checked["k"] is False


def test_a_missing_library_turns_the_picks_off(card: FakeGemm, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def gone():
        raise OSError("libcublasLt not found")

    monkeypatch.setattr(lt, "_gemm", gone)
    buf = torch.empty(98 * 256, dtype=torch.bfloat16)
    o = (-buf.data_ptr() % 256) // 2
    x, w = buf[o:o + 96 * 256].view(96, 256), torch.empty(64 * 256 + 128, dtype=torch.bfloat16)
    ow = (-w.data_ptr() % 256) // 2
    w = w[ow:ow + 64 * 256].view(64, 256)
    with caplog.at_level(logging.WARNING):
        assert lt.usable(x, w, B) is None and lt.usable(x, w, A) is None
    assert caplog.text.count("cuBLASLt picks not used") == 1
