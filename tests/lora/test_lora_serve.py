"""``octavo serve --enable-lora --lora-modules`` through the official ``openai`` client on loopback.

A tiny random-weight Llama (word-level tokenizer) with two PEFT adapters: each adapter name is listed by
``/v1/models`` and, used as ``model``, gives the adapter's greedy continuation (transformers + peft); the
base name gives the base model's; an unknown name is a 404; a bad ``--lora-modules`` fails at start.
"""

from __future__ import annotations

import openai
import pytest
import transformers as T

from octavo.config import OctavoSettings
from octavo.errors import ConfigError
from octavo.server.launch import ServerProcess
from tests.lora.conftest import ADAPTERS, make_adapter, make_base, peft_greedy
from tests.plugins.test_model_contracts import save_word_tokenizer

N = 6
PROMPT = [5, 9, 30, 7, 44, 12]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_serve")
    base = str(root / "base")
    make_base(base)
    save_word_tokenizer(base)
    tok = T.AutoTokenizer.from_pretrained(base)
    want, modules = {"base": tok.decode(peft_greedy(base, None, [PROMPT], N)[0]).split()}, []
    for i in (0, 1):
        path = str(root / f"ad{i}")
        make_adapter(base, path, *ADAPTERS[i], seed=200 + i)
        want[f"ad{i}"] = tok.decode(peft_greedy(base, path, [PROMPT], N)[0]).split()
        modules.append(f"ad{i}={path}")
    srv = ServerProcess([base, "--served-model-name", "base", "--dtype", "float32", "--enable-lora",
                         "--max-loras", "2", "--lora-modules", *modules, "--max-model-len", "128",
                         "--kv-cache-memory-bytes", str(16 << 20), "--uvicorn-log-level", "warning"]).start()
    yield srv, want
    assert srv.stop() == 0


def test_models_lists_adapters(served):
    srv, _ = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"base", "ad0", "ad1"}
    assert models["ad0"].parent == "base"


def test_adapter_names_select_the_adapter(served):
    srv, want = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    assert want["ad0"] != want["base"] and want["ad1"] != want["base"]
    for name in ("ad0", "base", "ad1"):
        out = client.completions.create(model=name, prompt=[PROMPT], max_tokens=N, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.choices[0].text.split() == want[name], name
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="ad9", prompt=[PROMPT], max_tokens=2)


def test_bad_lora_modules_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="name=path"):
        OctavoSettings.from_kwargs(enable_lora=True, lora_modules=["nopath"])
    with pytest.raises(ConfigError, match="needs enable_lora"):
        OctavoSettings.from_kwargs(lora_modules=[f"a={tmp_path}"])
    from octavo.lora.serving import served_loras

    with pytest.raises(ValueError, match="adapter_config.json"):
        served_loras(OctavoSettings.from_kwargs(enable_lora=True, lora_modules=[f"a={tmp_path}"]))


def test_runtime_routes_need_the_switch(served):
    """Without VLLM_ALLOW_RUNTIME_LORA_UPDATING the load/unload routes do not exist (as in vLLM)."""
    import httpx

    srv, _ = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    for route in ("/load_lora_adapter", "/unload_lora_adapter"):
        with pytest.raises(openai.NotFoundError):
            client.post(route, body={"lora_name": "x", "lora_path": "/tmp"}, cast_to=httpx.Response)
