"""Remote image URLs (``--allowed-media-domains``) against a real HTTP server on loopback: an allowed host's
image arrives pixel-equal; a host not listed, other schemes, a redirect out of the list, a body over the size
bound (declared or streamed), a transfer over the time bound and an HTTP error are each an ``InputError``
naming the field and the reason. The server path (400 through the ``openai`` client) is in
test_llava_server.py."""

from __future__ import annotations

import io
import time

import pytest

pytest.importorskip("PIL.Image")

from octavo.errors import InputError  # noqa: E402
from octavo.media_fetch import MediaFetcher  # noqa: E402
from tests.multimodal.media_server import MediaServer  # noqa: E402


def _png(seed: int = 3) -> tuple[bytes, object]:
    import numpy as np
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue(), img


@pytest.fixture(scope="module")
def server():
    png, _ = _png()
    routes = {"/cat.png": png, "/big.png": b"x" * 5000, "/stream": ("chunked", 300_000),
              "/slow.png": ("slow", png[:40], 3.0), "/gone.png": ("status", 404)}
    with MediaServer(routes) as srv:
        srv.routes["/to-allowed"] = ("redirect", srv.url("/cat.png"))
        srv.routes["/to-other"] = ("redirect", srv.url("/cat.png", host="localhost"))
        yield srv


def _split(url: str, fetcher):
    from octavo.core.multimodal_chat import split_image_parts

    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi "},
                                         {"type": "image_url", "image_url": {"url": url}}]}]
    return split_image_parts(msgs, "<image>", fetcher)


def test_allowed_host_is_fetched_pixel_equal(server):
    import numpy as np

    fetcher = MediaFetcher(["127.0.0.1"], timeout_s=2, max_bytes=100_000)
    msgs, images = _split(server.url("/cat.png"), fetcher)
    assert msgs[0]["content"] == "hi <image>"
    assert np.array_equal(np.asarray(images[0]), np.asarray(_png()[1]))
    _, images = _split(server.url("/to-allowed"), fetcher)  # a redirect inside the allow list is followed
    assert np.array_equal(np.asarray(images[0]), np.asarray(_png()[1]))


@pytest.mark.parametrize("path,host,match", [
    ("/cat.png", "localhost", "domain 'localhost' is not in --allowed-media-domains"),
    ("/to-other", "127.0.0.1", "redirected to .*localhost.* not in --allowed-media-domains"),
    ("/big.png", "127.0.0.1", "5000 bytes, more than the 1000 allowed"),
    ("/stream", "127.0.0.1", "larger than the 1000 bytes allowed"),
    ("/gone.png", "127.0.0.1", "HTTP 404"),
])
def test_refusals_name_the_field(server, path, host, match):
    fetcher = MediaFetcher(["127.0.0.1"], timeout_s=2, max_bytes=1000)
    with pytest.raises(InputError, match=match) as e:
        _split(server.url(path, host), fetcher)
    assert e.value.param == "messages" and "messages[0].content[1].image_url.url" in str(e.value)


def test_time_bound(server):
    fetcher = MediaFetcher(["127.0.0.1"], timeout_s=0.5, max_bytes=100_000)
    t0 = time.monotonic()
    with pytest.raises(InputError, match="took longer than 0.5 s"):
        _split(server.url("/slow.png"), fetcher)
    assert time.monotonic() - t0 < 2.5  # the 3 s dribble was cut off


@pytest.mark.parametrize("url,match", [
    ("file:///etc/passwd", "scheme 'file' is refused"),
    ("ftp://127.0.0.1/cat.png", "scheme 'ftp' is refused"),
    ("http://127.0.0.1/cat.png", None),  # allowed host: reaches the network (port 80: nothing listens)
])
def test_other_schemes_refused_without_network(url, match):
    fetcher = MediaFetcher(["127.0.0.1"], timeout_s=1, max_bytes=1000)
    with pytest.raises(InputError, match=match or "fetching .* failed"):
        _split(url, fetcher)


def test_fetching_is_off_without_a_domain_list(server):
    before = len(server.hits)
    with pytest.raises(InputError, match="fetches no remote media") as e:
        _split(server.url("/cat.png"), MediaFetcher(None, 5, 1000))
    assert e.value.param == "messages"
    assert len(server.hits) == before  # refused before any request was made
