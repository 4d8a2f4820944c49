"""core/gc_heap.py: the objects alive when a run starts are frozen for its duration, and only then."""

import gc

import pytest

from octavo.core import gc_heap
from octavo.core.gc_heap import frozen_heap


@pytest.fixture(autouse=True)
def _clean_gc(monkeypatch):
    monkeypatch.delenv("OCTAVO_GC_FREEZE", raising=False)
    # an engine loop an earlier test left running in this process may hold a scope: start from none
    monkeypatch.setattr(gc_heap, "_state", {"depth": 0, "froze": False})
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_frozen_inside_thawed_after_and_nested_scopes_share_one_freeze():
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        n = gc.get_freeze_count()
        assert n > 0
        with frozen_heap():  # an inner scope (another loop in the same process): no second freeze
            assert gc.get_freeze_count() == n
        assert gc.get_freeze_count() == n  # the inner exit does not thaw the outer scope
    assert gc.get_freeze_count() == 0


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
    assert gc.get_freeze_count() == 0


def test_off_switch_and_a_foreign_freeze_are_left_alone(monkeypatch):
    monkeypatch.setenv("OCTAVO_GC_FREEZE", "0")
    with frozen_heap():
        assert gc.get_freeze_count() == 0
    monkeypatch.delenv("OCTAVO_GC_FREEZE")
    gc.freeze()  # the application froze its own heap: not ours to undo
    n = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() == n
    assert gc.get_freeze_count() == n
    monkeypatch.setenv("OCTAVO_GC_FREEZE", "yes")
    with pytest.raises(ValueError, match="OCTAVO_GC_FREEZE"):
        with frozen_heap():
            pass
