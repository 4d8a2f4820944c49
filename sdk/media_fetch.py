"""Fetching remote media (``image_url`` http(s) URLs) for the domains the operator allows, and nothing else.

Why so narrow: a server that fetches any URL a client names is an open proxy into its own network (cloud
metadata endpoints, internal services). So fetching is off unless ``allowed_media_domains``
(``--allowed-media-domains``, vLLM's name) lists host names; a URL's host must equal one of them exactly,
redirects are followed only to allowed hosts (at most ``MAX_REDIRECTS``), proxies from the environment are
not used, and every fetch is bounded in time (``media_fetch_timeout`` seconds for the whole transfer, checked
between reads; the socket timeout bounds each read) and in size (``media_max_bytes``, checked against
Content-Length and while reading). Every refusal is a ``InputError`` naming the request's field, so the
server answers 400 for that request only. Blocking I/O: the server calls this from a worker thread
(``octavo.server.offload.run_bounded``), never on its event loop.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from octavo.errors import InputError

MAX_REDIRECTS = 3
_CHUNK = 64 * 1024


class MediaFetcher:
    """Fetches http(s) URLs of allowed hosts, bounded; ``allowed`` empty means fetching is off."""

    def __init__(self, allowed: list[str] | None, timeout_s: float, max_bytes: int) -> None:
        self.allowed = frozenset(d.strip().lower().rstrip(".") for d in allowed or () if d.strip())
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    @classmethod
    def from_settings(cls, settings: Any) -> MediaFetcher:
        m = settings.model
        return cls(m.allowed_media_domains, m.media_fetch_timeout, m.media_max_bytes)

    def check(self, url: str, where: str, param: str) -> None:
        """Refuse (``InputError``) a URL that may not be fetched: other schemes, hosts not allowed."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise InputError(f"{where}: image URL scheme {scheme or url[:20]!r} is refused: octavo reads data: "
                             "URLs, and http(s) URLs from the domains in --allowed-media-domains.", param)
        if not self.allowed:
            raise InputError(f"{where}: image URL scheme {scheme!r} is refused: this server fetches no remote "
                             "media (start it with --allowed-media-domains to allow domains), send a data: URL.",
                             param)
        host = (parts.hostname or "").rstrip(".")
        if host not in self.allowed:
            raise InputError(f"{where}: image URL domain {host!r} is not in --allowed-media-domains "
                             f"({', '.join(sorted(self.allowed))}).", param)

    def fetch(self, url: str, where: str, param: str) -> bytes:
        """The body at ``url`` (after :meth:`check`), or ``InputError`` on any failure or bound."""
        self.check(url, where, param)
        deadline = time.monotonic() + self.timeout_s
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _AllowedRedirects(self, where, param))
        request = urllib.request.Request(url, headers={"User-Agent": "octavo-media-fetch",
                                                       "Accept": "image/*"})
        try:
            with opener.open(request, timeout=self.timeout_s) as resp:
                size = resp.headers.get("Content-Length")
                if size is not None and size.isdigit() and int(size) > self.max_bytes:
                    raise InputError(f"{where}: the image at {url} is {size} bytes, more than the "
                                     f"{self.max_bytes} allowed (--media-max-bytes).", param)
                body = bytearray()
                while chunk := resp.read1(_CHUNK):
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise InputError(f"{where}: the image at {url} is larger than the {self.max_bytes} "
                                         "bytes allowed (--media-max-bytes).", param)
                    if time.monotonic() > deadline:
                        raise TimeoutError
                return bytes(body)
        except InputError:
            raise
        except urllib.error.HTTPError as e:
            raise InputError(f"{where}: fetching {url} failed: HTTP {e.code} {e.reason}.", param) from None
        except (TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(e, TimeoutError) or isinstance(reason, TimeoutError) or "timed out" in str(reason):
                raise InputError(f"{where}: fetching {url} took longer than {self.timeout_s:g} s "
                                 "(--media-fetch-timeout).", param) from None
            raise InputError(f"{where}: fetching {url} failed: {reason}.", param) from None


class _AllowedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed http(s) host, and at most ``MAX_REDIRECTS`` times."""

    max_redirections = MAX_REDIRECTS

    def __init__(self, fetcher: MediaFetcher, where: str, param: str) -> None:
        self.fetcher, self.where, self.param = fetcher, where, param

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.fetcher.check(newurl, f"{self.where} (redirected to {newurl})", self.param)
        return super().redirect_request(req, fp, code, msg, headers, newurl)
