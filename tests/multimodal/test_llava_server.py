"""Image content parts on ``/v1/chat/completions`` through the ``openai`` client against a real ``octavo serve``
of the tiny LLaVA checkpoint: data: URLs work, streaming and not, and equal transformers' greedy tokens;
remote URLs and malformed images are a 400 for that request."""

from __future__ import annotations

import base64
import io

import openai
import pytest
import torch

from octavo.server.launch import ServerProcess
from tests.multimodal.tiny_llava import build_tiny_llava, make_image

TEMPLATE = "{% for m in messages %}{{ m['role'].upper() }}: {{ m['content'] }} {% endfor %}ASSISTANT:"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llava-server")
    _, model, processor = build_tiny_llava(path)
    (path / "chat.jinja").write_text(TEMPLATE)
    srv = ServerProcess([str(path), "--dtype", "float32", "--chat-template", str(path / "chat.jinja"),
                         "--limit-mm-per-prompt", '{"image": 2}', "--uvicorn-log-level", "warning"]).start()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    yield client, client.models.list().data[0].id, model, processor
    assert srv.stop() == 0


def _data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_image_parts_streaming_and_not_equal_transformers(setup):
    client, name, model, processor = setup
    imgs = [make_image(21, (48, 64)), make_image(22, (70, 50))]
    content = [{"type": "text", "text": "w7 "}, {"type": "image_url", "image_url": {"url": _data_url(imgs[0])}},
               {"type": "text", "text": " w4 "}, {"type": "image_url", "image_url": {"url": _data_url(imgs[1])}}]
    messages = [{"role": "user", "content": content}]
    inputs = processor(text="USER: w7 <image> w4 <image> ASSISTANT:", images=imgs, return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1]:].tolist()
    resp = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                          extra_body={"return_token_ids": True, "ignore_eos": True})
    assert resp.choices[0].model_extra["token_ids"] == ref
    stream = client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == resp.choices[0].message.content


@pytest.mark.parametrize("url,match", [("https://example.com/cat.png", "is refused"),
                                       ("data:image/png;base64,aGVsbG8=", "could not be decoded")])
def test_bad_image_urls_are_400(setup, url, match):
    client, name, _, _ = setup
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    with pytest.raises(openai.BadRequestError, match=match):
        client.chat.completions.create(model=name, messages=messages, max_tokens=2)
    ok = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "w1"}], max_tokens=2)
    assert ok.choices[0].finish_reason is not None
