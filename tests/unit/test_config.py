"""Settings from every source (flat kwargs, OCTAVO_* environment, YAML/JSON config file, CLI flags),
their precedence, and errors that name the field and the fix."""

import argparse
import json

import pytest

from octavo.cli.flags import add_settings_arguments, settings_from_args
from octavo.config import FIELD_SECTION, SECTIONS, ConfigError, OctavoSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("OCTAVO_"):
            monkeypatch.delenv(key)


def parse(*argv, sections=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, sections=sections)
    return parser.parse_args(list(argv))


def test_defaults_and_flat_kwargs_use_vllm_names():
    s = OctavoSettings.from_kwargs(model="m", max_num_seqs=8, block_size=32, enable_prefix_caching=False,
                                   tensor_parallel_size=1, max_model_len=None)
    assert (s.model.model, s.scheduler.max_num_seqs, s.cache.block_size) == ("m", 8, 32)
    assert s.cache.enable_prefix_caching is False and s.model.max_model_len is None
    assert OctavoSettings().scheduler.max_num_seqs == 256
    assert s.flat()["max_num_seqs"] == 8


def test_environment_variables(monkeypatch):
    monkeypatch.setenv("OCTAVO_MAX_NUM_SEQS", "4")
    monkeypatch.setenv("OCTAVO_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("OCTAVO_MODEL", "some/repo")
    monkeypatch.setenv("OCTAVO_HF_OVERRIDES", '{"rope_theta": 10000}')
    s = OctavoSettings.from_kwargs()
    assert s.scheduler.max_num_seqs == 4 and s.cache.enable_prefix_caching is False
    assert s.model.model == "some/repo" and s.model.hf_overrides == {"rope_theta": 10000}


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file(tmp_path, suffix):
    data = {"max_num_seqs": 3, "block-size": 8, "scheduler": {"max_logprobs": 5}}
    path = tmp_path / f"octavo{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(data))
    else:
        path.write_text("max_num_seqs: 3\nblock-size: 8\nscheduler:\n  max_logprobs: 5\n")
    s = OctavoSettings.from_kwargs(config_file=str(path))
    assert (s.scheduler.max_num_seqs, s.cache.block_size, s.scheduler.max_logprobs) == (3, 8, 5)


def test_precedence_arguments_over_environment_over_file(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("max_num_seqs: 3\nblock_size: 8\nmax_logprobs: 7\n")
    monkeypatch.setenv("OCTAVO_MAX_NUM_SEQS", "4")
    monkeypatch.setenv("OCTAVO_BLOCK_SIZE", "32")
    s = OctavoSettings.from_kwargs(config_file=str(path), max_num_seqs=5)
    assert s.scheduler.max_num_seqs == 5  # argument
    assert s.cache.block_size == 32  # environment over file
    assert s.scheduler.max_logprobs == 7  # file over default
    args = parse("--config", str(path), "--max-num-seqs", "6")
    s = settings_from_args(args)
    assert (s.scheduler.max_num_seqs, s.cache.block_size, s.scheduler.max_logprobs) == (6, 32, 7)


@pytest.mark.parametrize(
    ("kwargs", "needles"),
    [
        ({"block_size": 24}, ["block_size", "power of two", "--block-size", "OCTAVO_BLOCK_SIZE"]),
        ({"max_num_seqs": 0}, ["max_num_seqs", "greater than or equal to 1", "--max-num-seqs"]),
        ({"dtype": "float8"}, ["dtype", "float8", "--dtype"]),
        ({"gpu_memory_utilization": 1.5}, ["gpu_memory_utilization", "--gpu-memory-utilization"]),
        ({"max_num_seqz": 8}, ["max_num_seqz", "Did you mean 'max_num_seqs'"]),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 16, "max_model_len": 64},
         ["max_num_batched_tokens", "max_model_len", "enable chunked prefill"]),
    ],
)
def test_bad_values_name_the_field_and_the_fix(kwargs, needles):
    with pytest.raises(ConfigError) as e:
        OctavoSettings.from_kwargs(**kwargs)
    assert isinstance(e.value, ValueError)
    for needle in needles:
        assert needle in str(e.value)


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("OCTAVO_BLOCK_SIZE", "3")
    with pytest.raises(ConfigError, match="OCTAVO_BLOCK_SIZE"):
        OctavoSettings.from_kwargs()


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        OctavoSettings.from_kwargs(config_file=str(tmp_path / "nope.yaml"))


def test_cli_flags_generated_from_every_field():
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for name in FIELD_SECTION:
        assert "--" + name.replace("_", "-") in flags, f"no flag for settings field {name}"
    help_text = parser.format_help()
    assert "Most requests running in one step. (default: 256)" in " ".join(help_text.split())
    assert "--no-enable-prefix-caching" in help_text


def test_cli_flags_parse_into_settings():
    args = parse("--max-num-seqs", "8", "--no-enable-prefix-caching", "--dtype", "bfloat16",
                 "--hf-overrides", '{"a": 1}', "--gpu-memory-utilization", "0.5")
    s = settings_from_args(args)
    assert s.scheduler.max_num_seqs == 8 and s.cache.enable_prefix_caching is False
    assert s.model.dtype == "bfloat16" and s.model.hf_overrides == {"a": 1}
    assert s.cache.gpu_memory_utilization == 0.5
    assert s.cache.block_size == 16  # not given: the settings default, not a flag default


def test_flags_only_override_when_given(monkeypatch):
    monkeypatch.setenv("OCTAVO_MAX_NUM_SEQS", "4")
    assert settings_from_args(parse()).scheduler.max_num_seqs == 4
    assert settings_from_args(parse("--max-num-seqs", "9")).scheduler.max_num_seqs == 9


def test_flag_errors_name_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse("--max-num-seqs", "many")
    assert "--max-num-seqs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--dtype", "float8")
    assert "invalid choice: 'float8'" in capsys.readouterr().err


def test_sections_subset():
    args = parse("--device", "cpu", sections=["device"])
    assert settings_from_args(args).device.device == "cpu"
    with pytest.raises(SystemExit):
        parse("--max-num-seqs", "8", sections=["device"])
    with pytest.raises(ValueError, match="Unknown settings sections"):
        parse(sections=["devices"])
    assert set(SECTIONS) == {"model", "device", "cache", "scheduler", "parallel", "server", "lora"}


def test_every_setting_is_documented():
    """A new setting needs its row in docs/configuration.md (one per field of octavo.config.SECTIONS)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [name for name in FIELD_SECTION if f"| `{name}` |" not in text]
    assert not missing, f"docs/configuration.md does not document {missing}"
