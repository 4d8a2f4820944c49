"""speculative_config: vLLM's keys, validated at settings time; the ngram proposer on plain data."""

import numpy as np
import pytest

from octavo.config import ConfigError, OctavoSettings
from octavo.plugins.spec_decode.ngram import NgramProposer, find_ngram_drafts
from octavo.speculator import SpecRequest, SpeculativeConfig


def test_valid_config_gets_defaults():
    s = OctavoSettings.from_kwargs(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    assert s.scheduler.speculative_config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                              "prompt_lookup_max": 3, "disable_by_batch_size": 8}
    s = OctavoSettings.from_kwargs(speculative_config={"model": "x", "num_speculative_tokens": 2})
    assert s.scheduler.speculative_config["method"] == "draft_model"


@pytest.mark.parametrize("bad, words", [
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "typo_key": 1}, "typo_key"),
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "model"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
    ({"method": "draft_model", "model": "x", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2},
     "draft_tensor_parallel_size"),
])
def test_invalid_configs_name_the_field(bad, words):
    with pytest.raises(ConfigError, match="speculative_config") as e:
        OctavoSettings.from_kwargs(speculative_config=bad)
    assert words in str(e.value)


def test_config_file_and_cli_json(tmp_path):
    from octavo.cli.flags import add_settings_arguments, settings_from_args

    cfg = tmp_path / "c.yaml"
    cfg.write_text("speculative_config:\n  method: ngram\n  num_speculative_tokens: 3\n")
    s = OctavoSettings.from_kwargs(config_file=str(cfg))
    assert s.scheduler.speculative_config["num_speculative_tokens"] == 3
    import argparse

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    args = parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 5}'])
    assert settings_from_args(args).scheduler.speculative_config["num_speculative_tokens"] == 5


def test_ngram_lookup():
    t = np.array([1, 2, 3, 4, 5, 9, 1, 2, 3])
    assert find_ngram_drafts(t, 1, 3, 3) == [4, 5, 9]
    assert find_ngram_drafts(t, 1, 3, 1) == [4]
    assert find_ngram_drafts(np.array([1, 2, 3]), 1, 3, 3) == []  # no earlier occurrence
    # the longest suffix wins: [7, 8] occurs once (-> 1); [8] alone also precedes 2 later on
    t = np.array([7, 8, 1, 0, 8, 2, 0, 7, 8])
    assert find_ngram_drafts(t, 1, 2, 1) == [1]
    assert find_ngram_drafts(t, 1, 1, 1) == [2]  # the latest occurrence of [8]
    assert find_ngram_drafts(t, 3, 3, 2) == []  # min_n too long


def test_ngram_proposer_respects_max_num_drafts():
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=4)
    p = NgramProposer(num_speculative_tokens=4, config=cfg)
    reqs = [SpecRequest("a", [1, 2, 3, 4, 5, 6, 1, 2], 8, 2), SpecRequest("b", [5, 5], 2, 4)]
    assert p.propose(reqs) == [[3, 4], [5]]
