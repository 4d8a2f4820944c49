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


def test_generation_config_defaults(tmp_path):
    """The model's generation_config.json fills what a request leaves out (vLLM's --generation-config auto)."""
    import json

    from octavo.config import OctavoSettings
    from octavo.generation_config import generation_defaults
    from octavo.server.protocol import ChatCompletionRequest, CompletionRequest
    from octavo.server.vllm_fields import apply_generation_defaults

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.3, "top_p": 0.9, "top_k": 50, "max_new_tokens": 7, "eos_token_id": 2}))
    auto = generation_defaults(OctavoSettings.from_kwargs(model=str(tmp_path)))
    assert auto == {"temperature": 0.3, "top_p": 0.9, "max_tokens": 7}  # top_k 50 is HF's default: skipped
    assert generation_defaults(OctavoSettings.from_kwargs(model=str(tmp_path), generation_config="vllm")) == {}
    assert generation_defaults(OctavoSettings.from_kwargs(generation_config=str(tmp_path))) == auto
    with pytest.raises(ConfigError, match="generation_config"):
        generation_defaults(OctavoSettings.from_kwargs(generation_config=str(tmp_path / "nope")))
    assert generation_defaults(OctavoSettings.from_kwargs()) == {}  # the embedded GGUF carries none

    req = apply_generation_defaults(CompletionRequest(prompt="x", temperature=1.0), auto)
    sp = req.to_sampling_params()
    assert (sp.temperature, sp.top_p, sp.max_tokens) == (1.0, 0.9, 7)  # the request's own value wins
    chat = apply_generation_defaults(ChatCompletionRequest(messages=[{"role": "user", "content": "x"}],
                                                           max_completion_tokens=3), auto)
    assert chat.to_sampling_params().max_tokens == 3 and chat.to_sampling_params().temperature == 0.3
