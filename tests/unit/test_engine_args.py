"""vLLM's engine-argument idioms (issue 16): EngineArgs <-> CLI <-> OctavoSettings, unknown names refused."""

from __future__ import annotations

import dataclasses

import pytest

from octavo import AsyncEngineArgs, EngineArgs, TextPrompt, TokensPrompt
from octavo.config import FIELD_SECTION
from octavo.errors import ConfigError
from octavo.utils import FlexibleArgumentParser


def test_every_setting_is_an_engine_arg():
    assert {f.name for f in dataclasses.fields(EngineArgs)} == set(FIELD_SECTION)
    assert issubclass(AsyncEngineArgs, EngineArgs)


def test_cli_round_trip_with_vllm_spellings():
    parser = FlexibleArgumentParser()
    parser.add_argument("--my-script-arg", type=int, default=3)  # a script's own argument is left alone
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(["--max_model_len", "512", "--enable-prefix-caching", "--block-size=32",
                              "--my-script-arg", "5"])
    ea = EngineArgs.from_cli_args(args)
    assert (ea.max_model_len, ea.enable_prefix_caching, ea.block_size, args.my_script_arg) == (512, True, 32, 5)
    settings = ea.create_engine_config()
    assert settings.model.max_model_len == 512 and settings.cache.block_size == 32
    assert settings.scheduler.max_num_seqs == 256  # not given: the default
    given = {k: v for k, v in dataclasses.asdict(ea).items() if v is not None}
    assert given == {"max_model_len": 512, "enable_prefix_caching": True, "block_size": 32}


def test_unknown_vllm_args_are_refused_by_name(capsys):
    with pytest.raises(TypeError, match="swap_space"):
        EngineArgs(swap_space=4)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--swap_space", "4"])
    assert "--swap-space" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="block_size"):
        EngineArgs(block_size=3).create_engine_config()


def test_prompt_types_are_dicts():
    assert TokensPrompt(prompt_token_ids=[1, 2], cache_salt="a") == {"prompt_token_ids": [1, 2], "cache_salt": "a"}
    assert TextPrompt(prompt="hi") == {"prompt": "hi"}
