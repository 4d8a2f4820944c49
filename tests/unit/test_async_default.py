"""The default of ``async_scheduling`` (None): on where supported, off with a logged reason elsewhere; an explicit
True is refused where unsupported, an explicit False is off (docs/async_scheduling.md, "Default"). The decision
is made from the settings and the selected platform before anything loads; GPU platforms are the real ones'
class attributes (``device_type``), so no device is needed here. The end-to-end default on a real CPU engine
is checked at the bottom (one tiny engine)."""

import logging

import pytest

from octavo.config import OctavoSettings
from octavo.core.async_engine import resolve_async_scheduling
from octavo.core.plugin_manager import get_plugin_manager


def _platform(name: str):
    pm = get_plugin_manager()
    return pm.resolve("platforms", name)


def resolve(platform: str, **kw):
    settings = OctavoSettings.from_kwargs(model="x", **kw)
    return resolve_async_scheduling(settings, get_plugin_manager(), _platform(platform)), settings


def test_default_is_none():
    assert OctavoSettings.from_kwargs(model="x").scheduler.async_scheduling is None


def test_default_on_for_cuda_and_written_back(caplog):
    with caplog.at_level(logging.INFO, logger="octavo.core.async_engine"):
        on, settings = resolve("cuda")
    assert on is True and settings.scheduler.async_scheduling is True  # the worker reads the bool
    assert "async scheduling on" in caplog.text


def test_default_on_for_mp_tensor_parallel_on_cuda():
    on, settings = resolve("cuda", tensor_parallel_size=2)  # mp: GPU-checked (docs/distributed.md)
    assert on is True and settings.scheduler.async_scheduling is True


@pytest.mark.parametrize("kw, reason", [
    (dict(), "CPU"),
    (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}), "speculative_config"),
    (dict(tensor_parallel_size=2, distributed_executor_backend="ray"), "distributed_executor_backend='ray'"),
    (dict(pipeline_parallel_size=2), "pipeline_parallel_size"),
])
def test_default_off_with_reason(kw, reason, caplog):
    platform = "cpu" if reason == "CPU" else "cuda"
    with caplog.at_level(logging.INFO, logger="octavo.core.async_engine"):
        on, settings = resolve(platform, **kw)  # never an error: the default just stays off
    assert on is False and settings.scheduler.async_scheduling is False
    assert "async scheduling off by default" in caplog.text and reason in caplog.text


def test_explicit_false_is_off_everywhere():
    assert resolve("cuda", async_scheduling=False)[0] is False


def test_explicit_true_on_cpu_and_refused_where_unsupported():
    assert resolve("cpu", async_scheduling=True)[0] is True  # a CPU may opt in (measured no gain, still exact)
    with pytest.raises(ValueError, match="async_scheduling.*speculative_config"):
        resolve("cuda", async_scheduling=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2})


def test_env_and_flag_parse_to_three_states(monkeypatch):
    monkeypatch.setenv("OCTAVO_ASYNC_SCHEDULING", "false")
    assert OctavoSettings.from_kwargs(model="x").scheduler.async_scheduling is False
    monkeypatch.setenv("OCTAVO_ASYNC_SCHEDULING", "true")
    assert OctavoSettings.from_kwargs(model="x").scheduler.async_scheduling is True


def test_cpu_engine_default_is_sync():
    """A real tiny engine on the CPU: the default resolves to off, the core runs the synchronous loop."""
    import json
    import tempfile

    from octavo import LLM, SamplingParams

    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=32, intermediate_size=64,
               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=256,
               max_position_embeddings=128, torch_dtype="float32")
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/config.json", "w") as f:
            json.dump(cfg, f)
        llm = LLM(model=d, load_format="dummy", skip_tokenizer_init=True, device="cpu", max_model_len=64,
                  kv_cache_memory_bytes=1 << 20)
        core = llm.llm_engine.core
        assert core.settings.scheduler.async_scheduling is False and core.async_loop is None
        assert core.executor.driver.runner.async_steps is None
        out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=4, ignore_eos=True),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4
        llm.llm_engine.shutdown()
