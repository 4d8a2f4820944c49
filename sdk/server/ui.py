"""The web playground (``GET /``, ``/ui/``), the live dashboard (``GET /dashboard``) and ``GET /v1/octavo/info``.

The pages are plain HTML, CSS and JavaScript shipped in ``octavo/server/static/`` (no CDN, no build step):
the chat page talks to ``/v1/models`` and ``/v1/chat/completions`` like any OpenAI client, the dashboard
polls ``/metrics`` once a second and reads the startup summary from ``/v1/octavo/info``.

API key: the page shells and their static files are the same for every server and hold no data, so they
load without the key (as llama.cpp's web UI does); every call they make carries ``Authorization: Bearer``
and is checked like any other route. The page asks for the key once, on the first 401, and keeps it in the
browser's localStorage. ``--disable-ui`` removes the pages (they then answer 404, or 401 without the key);
``/v1/octavo/info`` stays, as an API route.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
STATIC_PREFIX = "/ui/static/"
PAGES = {"/": "chat.html", "/ui/": "chat.html", "/dashboard": "dashboard.html"}
_PUBLIC = frozenset([*PAGES, "/ui"])
_GGUF_TYPE = re.compile(r"[.-]((?:I?Q\d[\w]*)|F16|F32|BF16)\.gguf$", re.IGNORECASE)


def is_public_ui_path(path: str, settings: Any) -> bool:
    """Whether ``path`` is a page shell or static file of the UI, which loads without the API key."""
    if settings.server.disable_ui:
        return False
    return path in _PUBLIC or path.startswith(STATIC_PREFIX)


def register_ui_routes(app: FastAPI, engine: Any, settings: Any, model_name: str) -> None:
    """Add ``/v1/octavo/info`` and, unless ``settings.server.disable_ui``, the pages and their static files."""
    summary = server_summary(engine, settings, model_name)

    @app.get("/v1/octavo/info")
    async def octavo_info() -> dict:
        return {**summary, "uptime_s": round(time.time() - summary["started_at"], 1)}

    if settings.server.disable_ui:
        return
    # defence in depth behind the DOM-only Markdown renderer: no inline or foreign script can run
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                          "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"}
    for path, name in PAGES.items():
        app.add_api_route(path, _page(STATIC_DIR / name, headers), methods=["GET"], include_in_schema=False)
    app.add_api_route("/ui", lambda: RedirectResponse("/ui/"), methods=["GET"], include_in_schema=False)
    app.mount(STATIC_PREFIX.rstrip("/"), StaticFiles(directory=STATIC_DIR), name="ui-static")


def _page(path: Path, headers: dict[str, str]) -> Any:
    async def page() -> FileResponse:
        return FileResponse(path, media_type="text/html; charset=utf-8", headers=headers)

    return page


def server_summary(engine: Any, settings: Any, model_name: str) -> dict[str, Any]:
    """The startup summary the dashboard shows: model, platform, backend, dtype, quantization, KV blocks."""
    info = engine.get_model_info()
    # ModelInfo.attention_backend and .platform: what the core chose (absent from older cores: fall back)
    backend = getattr(info, "attention_backend", None) or settings.device.attention_backend
    return {
        "model": model_name,
        "model_source": info.model,
        "architecture": info.architecture,
        "platform": _platform_name(settings, info),
        "device": info.device,
        "attention_backend": backend or "chosen by the platform (see the startup log)",
        "dtype": info.dtype,
        "quantization": _quantization(settings, info),
        "num_kv_blocks": info.num_kv_blocks,
        "block_size": info.block_size,
        "kv_cache_tokens": info.num_kv_blocks * info.block_size,
        "max_model_len": info.max_model_len,
        "max_num_seqs": settings.scheduler.max_num_seqs,
        "enable_prefix_caching": settings.cache.enable_prefix_caching,
        "load_time_s": round(float(getattr(engine, "load_time_s", 0.0) or 0.0), 2),
        "started_at": time.time(),
        "version": __import__("octavo.version", fromlist=["x"]).__version__,
    }


def _platform_name(settings: Any, info: Any) -> str:
    explicit = getattr(info, "platform", None) or settings.device.device
    if explicit:
        return explicit
    try:  # the same choice the core made from the same settings (cheap: no device context)
        from octavo.core.plugin_manager import get_plugin_manager

        return get_plugin_manager().select_platform(settings).name
    except Exception:  # noqa: BLE001 - the summary must not stop the server; the device still says it
        return info.device.split(":")[0]


def _quantization(settings: Any, info: Any) -> str:
    """The quantizer the core reports (with the GGUF file's type), else the setting or checkpoint's method."""
    source = str(info.model)
    m = _GGUF_TYPE.search(source) if source.lower().endswith(".gguf") else None
    file_type = f" ({m.group(1).upper()} file)" if m else ""
    reported = getattr(info, "quantization", None)  # ModelInfo.quantization; absent from older cores
    if reported:
        return reported + (file_type if reported == "gguf" else "")
    if settings.model.quantization:
        return settings.model.quantization
    if source.lower().endswith(".gguf"):
        return "gguf" + file_type
    config = Path(info.tokenizer_path or source) / "config.json"
    try:
        qc = json.loads(config.read_text()).get("quantization_config") if config.is_file() else None
    except (OSError, ValueError):
        qc = None
    return str(qc.get("quant_method", "yes")) if isinstance(qc, dict) else "none"
