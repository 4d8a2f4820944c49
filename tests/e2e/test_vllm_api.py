"""vLLM-style OpenAI API tests (written here from vLLM's public API reference), against a real ``octavo serve``.

One server on loopback (embedded SmolLM2) started with vLLM's server flags ``--allowed-origins`` and
``--root-path``; driven with the official ``openai`` client and httpx. Routes: completions and chat (with
the vLLM extras), /tokenize (return_token_strs), /detokenize, /tokenizer_info, GET /v1/models/{id},
/ping and /invocations (SageMaker), CORS.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow

ORIGIN = "http://dashboard.example"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--max-model-len", "256", "--kv-cache-memory-bytes", str(32 << 20),
                         "--uvicorn-log-level", "warning", "--allowed-origins", f'["{ORIGIN}"]',
                         "--root-path", "/llm", "--quantization", "none"]).start()
    yield srv
    srv.stop()


def test_models_retrieve(client, model, server):
    m = client.models.retrieve(model)
    assert m.id == model and m.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completion_with_vllm_extras(client, model):
    c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0,
                                  extra_body={"top_k": 1, "ignore_eos": True, "return_token_ids": True,
                                              "prompt_logprobs": 0, "truncate_prompt_tokens": 3})
    choice = c.choices[0].model_dump()
    assert len(choice["token_ids"]) == 5 and len(choice["prompt_token_ids"]) == 3
    assert choice["prompt_logprobs"][0] is None and len(choice["prompt_logprobs"]) == 3
    assert c.usage.prompt_tokens == 3


def test_chat_stream_continuous_usage(client, model):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 4
    assert all(ch.usage is not None for ch in chunks[1:])


def test_use_beam_search_equals_transformers(client, model):
    """use_beam_search answers with the n beams, best first, equal to transformers' num_beams generate on the
    same (fp32, unquantized) SmolLM2 weights; fields beam search does not use are refused, not dropped."""
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1]))
    from utils import smollm2_safetensors_dir

    prompt = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    c = client.completions.create(model=model, prompt=prompt, max_tokens=6, n=3, temperature=0, logprobs=1,
                                  extra_body={"use_beam_search": True, "length_penalty": 0.5,
                                              "return_token_ids": True})
    hf = AutoModelForCausalLM.from_pretrained(smollm2_safetensors_dir("float32"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), num_beams=3, num_return_sequences=3, max_new_tokens=6,
                          do_sample=False, length_penalty=0.5, early_stopping=False, pad_token_id=2)
    assert [ch.model_dump()["token_ids"] for ch in c.choices] == [r[len(prompt):].tolist() for r in ref]
    assert len({ch.text for ch in c.choices}) == 3 and len(c.choices[0].logprobs.tokens) == 6
    for extra, param in (({"top_p": 0.5}, "top_p"), ({"stop": ["x"]}, "stop"), ({"seed": 3}, "seed")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"use_beam_search": True,
                                                                                         **extra})
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:  # length_penalty without beam search would be dropped
        client.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"length_penalty": 2.0})
    assert e.value.body["param"] == "length_penalty"
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          n=2, extra_body={"use_beam_search": True})
    assert len(chat.choices) == 2 and chat.choices[0].message.content != chat.choices[1].message.content


def test_dev_routes_need_dev_mode(server):
    """/sleep, /wake_up, /collective_rpc ... exist only with OCTAVO_SERVER_DEV_MODE=1 (vLLM's rule)."""
    for path in ("/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache"):
        assert httpx.post(server.url + path, json={}).status_code == 404
    assert httpx.get(server.url + "/is_sleeping").status_code == 404


def test_tokenize_detokenize(server):
    t = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert t["count"] == len(t["tokens"]) == len(t["token_strs"]) and "".join(t["token_strs"]).endswith("world")
    assert httpx.post(server.url + "/detokenize", json={"tokens": t["tokens"]}).json()["prompt"] == "Hello world"


def test_tokenizer_info(server):
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] and info["vocab_size"] > 1000 and "<|im_start|>" in str(info["added_tokens_decoder"])


def test_ping_and_invocations(server, model):
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.post(server.url + "/ping").status_code == 200
    chat = httpx.post(server.url + "/invocations", json={"messages": [{"role": "user", "content": "Hi"}],
                                                         "max_tokens": 2}, timeout=60).json()
    assert chat["object"] == "chat.completion"
    cmpl = httpx.post(server.url + "/invocations", json={"prompt": "Hi", "max_tokens": 2}, timeout=60).json()
    assert cmpl["object"] == "text_completion"
    bad = httpx.post(server.url + "/invocations", json={"prompt": "Hi", "max_tokens": -5}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert httpx.post(server.url + "/invocations", json={"foo": 1}).status_code == 400


def test_cors(server):
    pre = httpx.options(server.url + "/v1/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(server.url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_root_path(server):
    # behind a proxy that strips /llm, the app still answers at / and reports its prefix to OpenAPI users
    assert httpx.get(server.url + "/v1/models").status_code == 200


def test_metrics_under_vllm_names(server, client, model):
    client.completions.create(model=model, prompt="Hi", max_tokens=2)
    text = httpx.get(server.url + "/metrics").text
    for name in ("num_requests_running", "kv_cache_usage_perc", "prompt_tokens_total", "generation_tokens_total",
                 "time_to_first_token_seconds_count", "request_success_total"):
        octavo_line = [ln for ln in text.splitlines() if ln.startswith(f"octavo:{name}")]
        vllm_line = [ln for ln in text.splitlines() if ln.startswith(f"vllm:{name}")]
        assert octavo_line and [ln.replace("octavo:", "vllm:", 1) for ln in octavo_line] == vllm_line, name


def test_bench_serve_with_vllm_flags(server, tmp_path, monkeypatch):
    """`octavo bench serve` with vllm bench serve's flags: random and sharegpt datasets, --max-concurrency
    (in-flight requests observed never above it), --request-rate (Poisson gaps: the run lasts at least their
    sum), --ignore-eos, bare --save-result into --result-dir, vLLM's result keys."""
    import json
    import random

    from octavo.cli import bench_serve
    from octavo.cli.main import main

    real, live, peak = bench_serve._one, [0], [0]

    async def counting(*a, **kw):
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        try:
            return await real(*a, **kw)
        finally:
            live[0] -= 1

    monkeypatch.setattr(bench_serve, "_one", counting)
    rc = main(["bench", "serve", "--base-url", server.url, "--dataset-name", "random", "--random-input-len", "16",
               "--random-output-len", "4", "--num-prompts", "6", "--max-concurrency", "2", "--request-rate", "20",
               "--ignore-eos", "--seed", "3", "--save-result", "--result-dir", str(tmp_path)])
    assert rc == 0 and peak[0] == 2
    [saved] = list(tmp_path.glob("openai-20.0qps-concurrency2-*.json"))
    r = json.loads(saved.read_text())
    assert r["completed"] == 6 and r["total_output_tokens"] == 24 and r["total_input_tokens"] == 96
    rng = random.Random(3)
    assert r["duration"] >= sum(rng.expovariate(20.0) for _ in range(5))
    for key in ("mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "std_e2el_ms", "request_throughput"):
        assert r[key] == r[key]  # present and not NaN

    share = tmp_path / "sharegpt.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": f"Tell me about the number {i}."},
                                                    {"from": "gpt", "value": f"The number {i} is a number that "
                                                     "people use for counting things."}]} for i in range(3)]))
    out = tmp_path / "share.json"
    assert main(["bench", "serve", "--base-url", server.url, "--dataset-name", "sharegpt", "--dataset-path",
                 str(share), "--num-prompts", "2", "--save-result", str(out)]) == 0
    assert json.loads(out.read_text())["completed"] == 2
    assert main(["bench", "serve", "--base-url", server.url, "--dataset-name", "sharegpt"]) == 2  # needs a path
