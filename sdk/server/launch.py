"""Start ``octavo serve`` as a subprocess and wait until it answers (for tests, benchmarks and scripts).

    with ServerProcess(["--max-model-len", "512"]) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
        ...
    # leaving the block sends SIGTERM and waits; srv.returncode is the exit status
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``octavo serve ARGS`` on a free loopback port; ``start()`` returns once ``GET /health`` is 200.

    Args:
        args: extra ``octavo serve`` arguments (model, settings flags).
        port: the port (default: a free one).
        env: extra environment variables.
        startup_timeout_s: how long to wait for the first 200 from /health.
        log_path: where the server's stdout and stderr go (default: inherited).
    """

    def __init__(self, args: list[str] | None = None, *, port: int | None = None, env: dict[str, str] | None = None,
                 startup_timeout_s: float = 300.0, log_path: str | None = None):
        self.args = list(args or [])
        self.port = port or free_port()
        self.url = f"{'https' if '--ssl-certfile' in self.args else 'http'}://127.0.0.1:{self.port}"
        self.verify: Any = True  # TLS (--ssl-certfile): an ssl.SSLContext trusting the server's certificate
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout_s = startup_timeout_s
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None  # from spawning the command to the first 200 from /health
        self._log: Any = None

    def start(self) -> ServerProcess:
        import httpx

        cmd = [sys.executable, "-m", "octavo.cli.main", "serve", *self.args, "--port", str(self.port)]
        if self.log_path:
            self._log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT if self._log
                                     else None)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"octavo serve exited with {self.proc.returncode} before it was ready "
                                   f"(command: {' '.join(cmd)})")
            try:
                if httpx.get(self.url + "/health", timeout=2.0, verify=self.verify).status_code == 200:
                    self.startup_s = time.perf_counter() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"octavo serve did not answer /health within {self.startup_timeout_s:.0f} s")

    def children(self) -> list[Any]:
        """The server's live child processes (the engine core, ...), as psutil objects."""
        import psutil

        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait; SIGKILL if it does not exit. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
