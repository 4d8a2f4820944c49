"""The pure parts of ``/v1/embeddings``: input shapes, Matryoshka declaration, truncation and re-normalisation."""

from __future__ import annotations

import json
import math

import pytest

from octavo.server.embeddings import EmbeddingRequest, _truncate, matryoshka_dimensions


def test_input_shapes():
    assert EmbeddingRequest(input="a").prompts() == ["a"]
    assert EmbeddingRequest(input=["a", "b"]).prompts() == ["a", "b"]
    assert EmbeddingRequest(input=[1, 2, 3]).prompts() == [{"prompt_token_ids": [1, 2, 3]}]
    assert EmbeddingRequest(input=[[1], [2, 3]]).prompts() == [{"prompt_token_ids": [1]}, {"prompt_token_ids": [2, 3]}]
    for bad in ([], [[]], [[1], []]):
        with pytest.raises(ValueError):
            EmbeddingRequest(input=bad).prompts()


def test_matryoshka_declared_in_config_files(tmp_path):
    assert matryoshka_dimensions(str(tmp_path)) == (False, None)
    (tmp_path / "config.json").write_text(json.dumps({"is_matryoshka": True}))
    assert matryoshka_dimensions(str(tmp_path)) == (True, None)
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"matryoshka_dimensions": [64, 128]}))
    assert matryoshka_dimensions(str(tmp_path)) == (True, [64, 128])


def test_truncate_renormalises_unit_vectors_only():
    unit = [0.6, 0.0, 0.8]
    assert _truncate(unit, 1) == [1.0]
    cut = _truncate([0.5, 0.5, 0.5, 0.5], 2)
    assert math.isclose(sum(x * x for x in cut), 1.0)
    assert _truncate([3.0, 4.0, 12.0], 2) == [3.0, 4.0]  # not unit-length: the model does not normalise


def test_unknown_fields_are_refused_or_warned_never_dropped_silently(caplog):
    from octavo.errors import APIError

    for name, value in (("normalize", False), ("truncate_prompt_tokens", 8), ("add_special_tokens", False)):
        with pytest.raises(APIError) as err:
            EmbeddingRequest(input="a", **{name: value})
        assert err.value.param == name
    EmbeddingRequest(input="a", normalize=True)  # the value that changes nothing is accepted
    with caplog.at_level("WARNING"):
        EmbeddingRequest(input="a", some_vendor_field_xyz=1)
    assert "some_vendor_field_xyz" in caplog.text
