"""core/gc_heap.py: during a run, full collections are rare (third threshold raised) and the objects alive at its
start are frozen; both are undone when the run ends.

The freeze count only ever falls on its own: a frozen object freed by its refcount (here, by a thread an earlier
test left running) leaves the permanent generation. So "no second freeze" is checked as "the count did not grow"
and "not thawed" as "still frozen", never as an exact count."""

import gc

import pytest

from octavo.core import gc_heap
from octavo.core.gc_heap import frozen_heap


@pytest.fixture(autouse=True)
def _clean_gc(monkeypatch):
    monkeypatch.delenv("OCTAVO_GC_FREEZE", raising=False)
    # an engine loop an earlier test left running in this process may hold a scope: start from none
    monkeypatch.setattr(gc_heap, "_state", {"depth": 0, "froze": False, "thresholds": None})
    saved = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*saved)


def test_frozen_inside_thawed_after_and_nested_scopes_share_one_freeze():
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    with frozen_heap():
        n = gc.get_freeze_count()
        assert n > 0
        assert gc.get_threshold() == (before[0], before[1], max(before[2], gc_heap.FULL_EVERY))
        with frozen_heap():  # an inner scope (another loop in the same process): no second freeze
            assert 0 < gc.get_freeze_count() <= n
        assert gc.get_freeze_count() > 0 and gc_heap._state["froze"]  # the inner exit does not thaw the outer scope
        assert gc.get_threshold()[2] == max(before[2], gc_heap.FULL_EVERY)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_a_cycle_made_inside_is_still_collected():
    with frozen_heap():
        a = []
        a.append(a)
        del a
        assert gc.collect() >= 1  # objects allocated after entry stay collectable


def test_thawed_when_the_body_raises():
    with pytest.raises(RuntimeError):
        with frozen_heap():
            raise RuntimeError("step failed")
    assert gc.get_freeze_count() == 0 and gc.get_threshold()[2] != gc_heap.FULL_EVERY


def test_off_switch_and_a_foreign_freeze_are_left_alone(monkeypatch):
    monkeypatch.setenv("OCTAVO_GC_FREEZE", "0")
    before = gc.get_threshold()
    with frozen_heap():
        assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    monkeypatch.delenv("OCTAVO_GC_FREEZE")
    gc.freeze()  # the application froze its own heap: not ours to undo
    n = gc.get_freeze_count()
    with frozen_heap():
        assert 0 < gc.get_freeze_count() <= n and not gc_heap._state["froze"]
    assert gc.get_freeze_count() > 0  # the application's freeze outlives our scope
    monkeypatch.setenv("OCTAVO_GC_FREEZE", "yes")
    with pytest.raises(ValueError, match="OCTAVO_GC_FREEZE"):
        with frozen_heap():
            pass
