"""A TP=2 (and, under ``make distributed``, a PP=2) ``octavo serve`` whose worker process is killed: ``/health`` turns 503 within seconds, the server
exits non-zero and leaves no process behind (never a hang). The server is idle when the worker dies, so
this is the engine core's periodic health check at work, not a failing step."""

from __future__ import annotations

import json
import time

import httpx
import psutil
import pytest
import torch
import transformers as T

from octavo.server.launch import ServerProcess
from octavo.testing.model import randomize_
from tests.distributed.test_tensor_parallel import full_only
from tests.plugins.test_model_contracts import TINY, save_word_tokenizer

pytestmark = pytest.mark.slow


# (flag, which rank to kill): TP=2 always; PP=2 killing stage 0 under `make distributed` (the surviving last
# stage is then blocked in a receive from the dead rank: the executor must kill it, not wait)
CASES = [pytest.param(("--tensor-parallel-size", 1), id="tp2"),
         pytest.param(("--pipeline-parallel-size", 0), id="pp2-stage0", marks=full_only)]


@pytest.fixture(scope="module", params=CASES)
def server(tmp_path_factory, request):
    path = tmp_path_factory.mktemp("llama-tp")
    torch.manual_seed(0)
    ref = T.AutoModelForCausalLM.from_config(T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY))
    randomize_(ref).save_pretrained(path)
    save_word_tokenizer(str(path))
    srv = ServerProcess([str(path), request.param[0], "2", "--dtype", "float32", "--max-model-len", "128",
                         "--kv-cache-memory-bytes", str(8 << 20), "--uvicorn-log-level", "warning"]).start()
    srv.kill_rank = request.param[1]
    yield srv
    srv.stop()


def test_killed_worker_gives_503_and_nonzero_exit(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "w5 w9 w30", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    children = server.children()
    workers = [c for c in children if "octavo.plugins.executors.mp_worker" in " ".join(c.cmdline())]
    assert len(workers) == 2, [c.cmdline() for c in children]
    workers = sorted(workers, key=lambda c: json.loads(c.cmdline()[-1])["rank"])  # the worker's JSON argument
    workers[server.kill_rank].kill()
    t_kill = time.monotonic()
    while time.monotonic() - t_kill < 15:
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 503:
                break
        except httpx.TransportError:  # already gone: also not healthy
            break
        time.sleep(0.2)
    else:
        pytest.fail("/health still 200 15 s after a worker died")
    server.proc.wait(timeout=30)
    assert server.proc.returncode not in (0, None)
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
