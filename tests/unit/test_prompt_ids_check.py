"""The prompt-id checks on both sides of the engine (front end ``InputProcessor._check_ids``, core
``EngineCore.add_request``) take a C-speed path for plain int lists; these pin what they accept and refuse."""

from __future__ import annotations

import enum
import re
from types import SimpleNamespace

import pytest

from octavo.core.input_processor import InputProcessor
from octavo.errors import InputError


def checker(vocab: int = 100) -> InputProcessor:
    ip = InputProcessor.__new__(InputProcessor)  # only model_info is read by _check_ids
    ip.model_info = SimpleNamespace(vocab_size=vocab)
    return ip


class Tok(enum.IntEnum):
    A = 5


@pytest.mark.parametrize("ids", [[0, 99], (3, 4, 5), [Tok.A, 7], list(range(100))])
def test_accepts_int_lists_in_range(ids):
    out = checker()._check_ids(ids)
    assert out == list(ids) and type(out) is list and out is not ids


@pytest.mark.parametrize("ids", [[1, True], [1, 2.0], ["1"], "12", 5, [1, None]])
def test_refuses_non_int_items(ids):
    with pytest.raises(InputError, match="list of integers"):
        checker()._check_ids(ids)


@pytest.mark.parametrize("ids,bad", [([1, 100], "[100]"), ([-1, 2], "[-1]"), ([5, 10**9, -3], "[1000000000, -3]")])
def test_refuses_ids_outside_the_vocabulary(ids, bad):
    with pytest.raises(InputError, match=re.escape(f"token ids {bad} are outside")):
        checker()._check_ids(ids)
