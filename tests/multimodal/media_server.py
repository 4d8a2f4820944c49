"""A real HTTP server on loopback for the remote-media tests: fixed routes, each answering as its name says."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class MediaServer:
    """``routes``: path -> bytes (200), ``("redirect", url)``, ``("slow", bytes, seconds)``, ``("chunked", n)``
    (n bytes without Content-Length) or ``("status", code)``; ``url(path)`` on 127.0.0.1."""

    def __init__(self, routes: dict) -> None:
        self.routes = routes
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet test output
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.hits.append(self.path)
                route = outer.routes.get(self.path)
                if route is None:
                    return self._send(404, b"not found")
                if isinstance(route, bytes):
                    return self._send(200, route)
                kind = route[0]
                if kind == "redirect":
                    self.send_response(302)
                    self.send_header("Location", route[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif kind == "slow":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(route[1])))
                    self.end_headers()
                    for b in route[1]:  # dribble: each byte in time, the whole transfer too slow
                        self.wfile.write(bytes([b]))
                        self.wfile.flush()
                        time.sleep(route[2] / len(route[1]))
                elif kind == "chunked":
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    block = b"x" * 65536
                    try:
                        for _ in range(route[1] // len(block) + 1):
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                        self.wfile.write(b"0\r\n\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                elif kind == "status":
                    self._send(route[1], b"error")

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def __enter__(self) -> MediaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
