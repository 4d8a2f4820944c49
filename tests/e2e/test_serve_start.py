"""``octavo serve`` start-up (issue 18): the engine core spawned before the settings are parsed
(core/engine_prestart.py) serves real requests; the grammar warm-up deferred until the server answers still
gives a structured request a valid answer at once; a command that fails to parse leaves no core behind.

Real server on loopback, the embedded SmolLM2 GGUF, the real ``openai`` client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import openai
import psutil
import pytest

from octavo.server.launch import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with ServerProcess(["--max-model-len", "1024"], env={"OCTAVO_DISABLE_PROGRESS": "1"}, log_path=str(log)) as srv:
        yield srv, log


def test_prestarted_core_serves_plain_and_structured_requests(server):
    srv, log = server
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    # the first request right after ready: a JSON-schema one (its grammar library is imported after ready)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    out = client.chat.completions.create(
        model=client.models.list().data[0].id, max_tokens=24, temperature=0,
        messages=[{"role": "user", "content": "Name the capital of France as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert isinstance(json.loads(out.choices[0].message.content)["city"], str)
    text = client.completions.create(model=client.models.list().data[0].id, prompt="The capital of France is",
                                     max_tokens=4, temperature=0).choices[0].text
    assert "Paris" in text
    logged = log.read_text()
    assert "started before the settings were parsed" in logged  # the pre-started process was the one used
    # where the start went: when the core was spawned, and how long it then waited for the front end's settings
    assert "core process spawned at" in logged and "waiting for the front end's settings" in logged
    cores = srv.children()
    assert len([p for p in cores if p.is_running()]) >= 1


def _cores_with(marker: str) -> list:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "spawn_main" in " ".join(p.info["cmdline"] or []) and p.environ().get("OCTAVO_TEST_MARKER") == marker:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def test_bad_arguments_leave_no_core_behind():
    marker = uuid.uuid4().hex
    env = {**os.environ, "OCTAVO_TEST_MARKER": marker}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "octavo.cli.main", "serve", "--max-model-len", "lots"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "max-model-len" in res.stderr or "max_model_len" in res.stderr
    deadline = time.monotonic() + 30
    while _cores_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _cores_with(marker), "a pre-started engine core outlived its front end"
    assert time.monotonic() - t0 < 120
