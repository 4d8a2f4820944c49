"""Qwen2-VL image content parts through the ``openai`` client against a real ``octavo serve`` of the tiny
checkpoint (its own chat template writes the vision markers): two images of different sizes, streaming and
not, equal transformers' greedy tokens. Full mode only (``make multimodal``: one more server start, ~1 min on
the 2-core CI machine); `make test` covers the same front end with LLaVA (test_llava_server.py) and Qwen2-VL
through ``LLM.chat`` (test_qwen2_vl.py)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("OCTAVO_MULTIMODAL") != "full",
                                reason="full multimodal suite only (make multimodal / OCTAVO_MULTIMODAL=full)")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import openai

    from octavo.server.launch import ServerProcess
    from tests.multimodal.tiny_qwen2vl import build_tiny_qwen2vl

    path = tmp_path_factory.mktemp("tiny-qwen2vl-server")
    _, model, reference = build_tiny_qwen2vl(path)
    srv = ServerProcess([str(path), "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 2}',
                         "--max-num-batched-tokens", "24", "--uvicorn-log-level", "warning"]).start()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    yield client, client.models.list().data[0].id, model, reference
    assert srv.stop() == 0


def test_image_parts_streaming_and_not_equal_transformers(setup):
    from tests.multimodal.tiny_llava import make_image, two_image_content

    client, name, model, reference = setup
    imgs = [make_image(21, (56, 84)), make_image(22, (150, 100))]
    content = two_image_content(imgs)
    messages = [{"role": "user", "content": content}]
    v = "<|vision_start|><|image_pad|><|vision_end|>"
    inputs = reference(f"USER: w7 {v} w4 {v} ASSISTANT:", imgs)
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    resp = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
    assert resp.choices[0].model_extra["token_ids"] == ref
    assert resp.usage.prompt_tokens == inputs["input_ids"].shape[1]  # dynamic-resolution expansion
    stream = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == resp.choices[0].message.content
