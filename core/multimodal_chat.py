"""OpenAI-style image content parts in chat messages -> text with image placeholders + decoded images.

Why in the front end: the chat template renders text, so each ``{"type": "image_url"}`` part becomes the
model's placeholder text (``<image>`` for LLaVA-1.5) in its message, the images travel as
``multi_modal_data`` and the processor expands the placeholders (core/multimodal.py). ``data:`` URLs are
decoded here; http(s) URLs are fetched by ``octavo.media_fetch.MediaFetcher`` only from the domains the
operator allows (``--allowed-media-domains``), bounded in time and size; every other URL is refused with an
error naming it. Conversations without image parts are left untouched.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from octavo.errors import InputError

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # decoded size bound of one data: URL image


def has_image_parts(messages: list[dict]) -> bool:
    return any(isinstance(m, dict) and isinstance(m.get("content"), list) and
               any(isinstance(p, dict) and p.get("type") in ("image_url", "image") for p in m["content"])
               for m in messages)


def split_image_parts(messages: list[dict], placeholder: str, fetcher: Any = None,
                      preprocess: Any = None) -> tuple[list[dict], list[Any]]:
    """Messages with image parts -> (messages with string contents, the images in order). ``fetcher``
    (``octavo.media_fetch.MediaFetcher``) reads http(s) URLs; without one they are refused. ``preprocess``
    (the processor's, when it has one) does each image's pixel work here, in the caller's thread."""
    out, images = [], []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind == "text":
                texts.append(str(part.get("text", "")))
            elif kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                where = f"messages[{i}].content[{j}].image_url.url"
                image = load_image_url(url, where, fetcher)
                if preprocess is not None:
                    try:
                        image = preprocess(image, len(images))
                    except ValueError as e:
                        raise InputError(f"{where}: {e}", "messages") from None
                images.append(image)
                texts.append(placeholder)
            else:
                raise InputError(f"messages[{i}].content part of type {kind!r} is not supported (text and "
                                 "image_url are).", "messages")
        out.append({**m, "content": "".join(texts)})
    return out, images


def load_image_url(url: Any, where: str, fetcher: Any = None) -> Any:
    """A ``data:image/...;base64,`` URL, or an http(s) URL ``fetcher`` allows -> a PIL image; anything else
    is an ``InputError``."""
    if not isinstance(url, str):
        raise InputError(f"{where}: image_url.url must be a string.", "messages")
    if not url.startswith("data:"):
        if fetcher is None:
            from octavo.media_fetch import MediaFetcher

            fetcher = MediaFetcher(None, 0, 0)  # fetches nothing: refuses with the reason
        return _decode(fetcher.fetch(url, where, "messages"), where)
    header, _, payload = url.partition(",")
    if not header.endswith(";base64") or not header[5:].startswith("image/"):
        raise InputError(f"{where}: a data URL must be 'data:image/<type>;base64,<data>'.", "messages")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InputError(f"{where}: the image is larger than {MAX_IMAGE_BYTES} bytes.", "messages")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InputError(f"{where}: the image could not be decoded: {type(e).__name__}: {e}", "messages") from None
    return _decode(raw, where)


def _decode(raw: bytes, where: str) -> Any:
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (ValueError, OSError, SyntaxError, Image.DecompressionBombError) as e:
        raise InputError(f"{where}: the image could not be decoded: {type(e).__name__}: {e}", "messages") from None
    return image
