"""One real `octavo serve` (embedded SmolLM2, loopback) shared by the whole reliability suite.

``make test`` runs the bounded form; ``make reliability`` sets ``OCTAVO_RELIABILITY=full`` (>= 5,000
fuzzed requests, bigger storms, the soak module with its own servers). The server's log is kept so tests
can count tracebacks. The SIGTERM test (test_shutdown.py, collected last) ends this server on purpose.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from octavo.server.launch import ServerProcess
from tests.reliability.helpers import SERVER_ARGS


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("reliability") / "server.log"
    srv = ServerProcess(SERVER_ARGS, log_path=str(log), startup_timeout_s=600)
    srv.log_file = Path(log)
    with srv:
        yield srv


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
