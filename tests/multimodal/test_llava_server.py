"""Image content parts on ``/v1/chat/completions`` through the ``openai`` client against a real ``octavo serve``
of the tiny LLaVA checkpoint: data: URLs work, streaming and not, and equal transformers' greedy tokens;
http URLs of the allowed domain (``--allowed-media-domains 127.0.0.1``, a real HTTP server on loopback) give
the same answer as the same image inline; other domains, schemes, slow or oversized fetches and malformed
images are a 400 naming ``messages`` for that request only."""

from __future__ import annotations

import io

import openai
import pytest
import torch

from octavo.server.launch import ServerProcess
from tests.multimodal.media_server import MediaServer
from tests.multimodal.tiny_llava import build_tiny_llava, data_url, make_image, two_image_content

TEMPLATE = "{% for m in messages %}{{ m['role'].upper() }}: {{ m['content'] }} {% endfor %}ASSISTANT:"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llava-server")
    _, model, processor = build_tiny_llava(path)
    (path / "chat.jinja").write_text(TEMPLATE)
    srv = ServerProcess([str(path), "--dtype", "float32", "--chat-template", str(path / "chat.jinja"),
                         "--limit-mm-per-prompt", '{"image": 2}', "--uvicorn-log-level", "warning",
                         "--allowed-media-domains", "127.0.0.1", "--media-fetch-timeout", "1",
                         "--media-max-bytes", "100000"]).start()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    yield client, client.models.list().data[0].id, model, processor
    assert srv.stop() == 0


def test_image_parts_streaming_and_not_equal_transformers(setup):
    client, name, model, processor = setup
    imgs = [make_image(21, (48, 64)), make_image(22, (70, 50))]
    content = two_image_content(imgs)
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


@pytest.fixture(scope="module")
def media():
    img = make_image(31, (60, 44))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    routes = {"/cat.png": buf.getvalue(), "/huge.png": b"x" * 200_000, "/slow.png": ("slow", b"x" * 20, 4.0)}
    with MediaServer(routes) as srv:
        yield srv, img


def test_allowed_domain_url_equals_inline_image(setup, media):
    client, name, _, _ = setup
    srv, img = media

    def ask(url):
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": " w3 w4"}]
        return client.chat.completions.create(model=name, messages=[{"role": "user", "content": content}],
                                              max_tokens=5, temperature=0, extra_body={"return_token_ids": True,
                                                                                        "ignore_eos": True})

    fetched = ask(srv.url("/cat.png"))
    assert srv.hits[-1] == "/cat.png"
    inline = ask(data_url(img))
    assert fetched.choices[0].model_extra["token_ids"] == inline.choices[0].model_extra["token_ids"]


@pytest.mark.parametrize("url,match", [("https://example.com/cat.png", "'example.com' is not in --allowed-media"),
                                       ("LOCAL:/cat.png", "domain 'localhost' is not in"),
                                       ("file:///etc/hostname", "scheme 'file' is refused"),
                                       ("HOST:/huge.png", "200000 bytes, more than the 100000 allowed"),
                                       ("HOST:/slow.png", "took longer than 1 s"),
                                       ("data:image/png;base64,aGVsbG8=", "could not be decoded")])
def test_bad_image_urls_are_400(setup, media, url, match):
    client, name, _, _ = setup
    srv, _ = media
    if url.startswith(("HOST:", "LOCAL:")):
        url = srv.url(url.split(":", 1)[1], host="127.0.0.1" if url.startswith("HOST:") else "localhost")
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    with pytest.raises(openai.BadRequestError, match=match) as e:
        client.chat.completions.create(model=name, messages=messages, max_tokens=2)
    assert e.value.param == "messages" and "image_url.url" in e.value.message
    ok = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "w1"}], max_tokens=2)
    assert ok.choices[0].finish_reason is not None
