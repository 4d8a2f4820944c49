"""``octavo serve --disable-ui --api-key K``: the pages are gone and nothing is exempt from the key, while
``/v1/octavo/info`` (an API route) stays. (The pages themselves, with the UI on, are driven in a real
browser by tests/browser.)"""

from __future__ import annotations

import httpx
import pytest

from octavo.server.launch import ServerProcess

pytestmark = pytest.mark.slow

KEY = "k-disable-ui"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(["--disable-ui", "--api-key", KEY, "--disable-frontend-multiprocessing",  # starts faster
                         "--max-model-len", "256", "--kv-cache-memory-bytes",
                         str(16 << 20), "--uvicorn-log-level", "warning"]).start()
    yield srv
    srv.stop()


def test_disable_ui_removes_the_pages_and_keeps_info(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    for path in ("/", "/ui/", "/dashboard", "/ui/static/chat.js"):
        assert httpx.get(server.url + path).status_code == 401, path  # no exemption from the key
        r = httpx.get(server.url + path, headers=auth)
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", path
    assert httpx.get(server.url + "/v1/octavo/info").status_code == 401
    info = httpx.get(server.url + "/v1/octavo/info", headers=auth).json()
    assert info["model"] == "SmolLM2-135M-Instruct" and info["max_model_len"] == 256
    assert info["num_kv_blocks"] * info["block_size"] == info["kv_cache_tokens"] > 0
    assert info["dtype"] == "float32" and info["platform"] == "cpu" and info["quantization"] == "gguf (Q4_1 file)"
    assert info["attention_backend"] and not info["attention_backend"].startswith("chosen"), info  # the core's pick
