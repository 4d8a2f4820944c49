"""``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on a real server, through the ``openai`` client.

One server (tiny random Llama, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=true``, ``--lora-modules ad0=...``): an adapter
loaded at run time is listed and, used as ``model``, gives transformers + peft's greedy tokens; after unloading
it is a 404 and gone from ``/v1/models``; bad loads (no such path, rank too large, unsupported target, name
taken) are 400 at load time; unknown unloads are 404. Without the switch the routes are 404 (in
test_lora_serve.py, whose server runs without it).
"""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest
import transformers as T

from octavo.server.launch import ServerProcess
from octavo.server.lora_routes import runtime_updating_allowed
from tests.lora.conftest import ADAPTERS, make_adapter, make_base, peft_greedy
from tests.plugins.test_model_contracts import save_word_tokenizer

N = 6
PROMPT = [5, 9, 30, 7, 44, 12]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_runtime")
    base = str(root / "base")
    make_base(base)
    save_word_tokenizer(base)
    tok = T.AutoTokenizer.from_pretrained(base)
    paths = {}
    for i in (0, 1):
        paths[i] = str(root / f"ad{i}")
        make_adapter(base, paths[i], *ADAPTERS[i], seed=300 + i)
    want = {"base": tok.decode(peft_greedy(base, None, [PROMPT], N)[0]).split(),
            "ad1": tok.decode(peft_greedy(base, paths[1], [PROMPT], N)[0]).split()}
    for bad, key, value in (("bad_target", "target_modules", ["lm_head"]), ("bad_rank", "r", 16)):
        paths[bad] = str(root / bad)  # ad1's weights, a config that targets lm_head / has rank 16 > 8
        shutil.copytree(paths[1], paths[bad])
        cfg_path = f"{paths[bad]}/adapter_config.json"
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg[key] = value
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
    paths["empty"] = str(root)
    srv = ServerProcess([base, "--served-model-name", "base", "--dtype", "float32", "--enable-lora",
                         "--max-loras", "2", "--max-lora-rank", "8", "--lora-modules", f"ad0={paths[0]}",
                         "--max-model-len", "128", "--kv-cache-memory-bytes", str(16 << 20),
                         "--uvicorn-log-level", "warning"], env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}).start()
    yield srv, want, paths
    assert srv.stop() == 0


def _post(client: openai.OpenAI, route: str, body: dict) -> httpx.Response:
    return client.post(route, body=body, cast_to=httpx.Response)


def _ids(client: openai.OpenAI) -> set[str]:
    return {m.id for m in client.models.list().data}


def _text(client: openai.OpenAI, model: str) -> list[str]:
    out = client.completions.create(model=model, prompt=[PROMPT], max_tokens=N, temperature=0,
                                    extra_body={"ignore_eos": True})
    return out.choices[0].text.split()


def test_load_use_unload(served):
    srv, want, paths = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    assert _ids(client) == {"base", "ad0"}
    with pytest.raises(openai.NotFoundError):
        _text(client, "ad1")
    r = _post(client, "/load_lora_adapter", {"lora_name": "ad1", "lora_path": paths[1]})
    assert r.status_code == 200 and "ad1" in r.text
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"base", "ad0", "ad1"} and models["ad1"].parent == "base"
    assert want["ad1"] != want["base"]
    assert _text(client, "ad1") == want["ad1"]
    assert _text(client, "base") == want["base"]
    with pytest.raises(openai.BadRequestError, match="already been loaded"):
        _post(client, "/load_lora_adapter", {"lora_name": "ad1", "lora_path": paths[1]})
    r = _post(client, "/unload_lora_adapter", {"lora_name": "ad1"})
    assert r.status_code == 200
    assert _ids(client) == {"base", "ad0"}
    with pytest.raises(openai.NotFoundError) as e:
        _text(client, "ad1")
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="cannot be found"):
        _post(client, "/unload_lora_adapter", {"lora_name": "ad1"})
    # the --lora-modules adapter (lora_int_id 1) shares the registry: unload by id, reload under a new name
    assert _post(client, "/unload_lora_adapter", {"lora_int_id": 1}).status_code == 200
    assert _ids(client) == {"base"}
    assert _post(client, "/load_lora_adapter", {"lora_name": "again", "lora_path": paths[1]}).status_code == 200
    assert _text(client, "again") == want["ad1"]


def test_bad_loads_fail_at_load_time(served):
    srv, _, paths = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    cases = [(paths["empty"], "adapter_config.json"), (paths["bad_rank"], "max_lora_rank"),
             (paths["bad_target"], "lm_head"), (paths["empty"] + "/nope", "adapter_config.json")]
    for path, words in cases:
        with pytest.raises(openai.BadRequestError, match=words) as e:
            _post(client, "/load_lora_adapter", {"lora_name": "bad", "lora_path": path})
        assert e.value.param == "lora_path", path
    with pytest.raises(openai.BadRequestError):
        _post(client, "/load_lora_adapter", {"lora_name": "base", "lora_path": paths[1]})  # the base model's name
    with pytest.raises(openai.BadRequestError):
        _post(client, "/load_lora_adapter", {"lora_name": "x", "lora_path": paths[1], "load_inplace": True})
    assert "bad" not in _ids(client)


def test_switch_values():
    assert runtime_updating_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert runtime_updating_allowed({"OCTAVO_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    assert not runtime_updating_allowed({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "false"})
    assert not runtime_updating_allowed({})
