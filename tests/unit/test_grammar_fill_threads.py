"""``OCTAVO_GRAMMAR_FILL_THREADS`` is honored, and a value that is not a positive integer is refused by name."""

import pytest

from octavo.core.grammar_step import fill_threads


def test_override_is_honored(monkeypatch):
    monkeypatch.setenv("OCTAVO_GRAMMAR_FILL_THREADS", "3")
    assert fill_threads() == 3


@pytest.mark.parametrize("bad", ["0", "abc", "-2", "1.5"])
def test_bad_values_name_the_variable(monkeypatch, bad):
    monkeypatch.setenv("OCTAVO_GRAMMAR_FILL_THREADS", bad)
    with pytest.raises(ValueError, match="OCTAVO_GRAMMAR_FILL_THREADS"):
        fill_threads()
