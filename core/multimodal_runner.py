"""Runner side of multimodal input: encode the images of scheduled requests, once, and place their rows.

Why an encoder cache keyed by content hash: a chunked prefill runs an image's placeholders over several
steps, and two requests may carry the same image; the vision tower runs once per distinct image while it is
cached (LRU, bounded by ``max_items``). Each step takes only the embedding rows whose placeholder positions
fall inside the step's tokens and hands ``(flat token indices, rows)`` to the model as
``ctx.extra["mm_embeds"]`` (models that take images implement ``embed_images`` and read it in ``forward``).
Fixed-size models (LLaVA) get ``[b, 3, H, W]`` stacked per pixel shape; models that set
``embeds_packed_images`` (Qwen2-VL, dynamic resolution) get every missing image in one call, patches packed
``[N, D]`` with each image's ``grid_thw``, and return its rows concatenated in order.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from octavo.step import MultiModalInput, StepBatch


class EncoderCache:
    """Image hash -> ``[tokens, hidden]`` embeddings on the device; counts hits and encodes (tests read them)."""

    def __init__(self, max_items: int = 256) -> None:
        self.max_items = max_items
        self.entries: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.hits = 0  # a step needed an image that was already encoded
        self.encoded = 0  # images run through the vision tower

    def get(self, key: str) -> torch.Tensor | None:
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def put(self, key: str, value: torch.Tensor) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_items:
            self.entries.popitem(last=False)


def _pixels(item: MultiModalInput, device: torch.device) -> torch.Tensor:
    array = np.frombuffer(item.data, dtype=np.dtype(item.dtype)).reshape(item.shape)
    return torch.from_numpy(array.copy()).to(device)


def build_mm_embeds(model, cache: EncoderCache, batch: StepBatch, states: dict,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(flat indices [k], embeddings [k, hidden])`` for this step's image placeholders, or None."""
    spans = []  # (item, flat index of its first row this step, first row, end row)
    flat = 0
    for s in batch.scheduled:
        start, n = s.num_computed_tokens, len(s.token_ids)
        for item in states[s.request_id].mm_inputs:
            lo, hi = max(start, item.offset), min(start + n, item.offset + item.length)
            if lo < hi:
                spans.append((item, flat + lo - start, lo - item.offset, hi - item.offset))
        flat += n + len(s.spec_token_ids)
    if not spans:
        return None
    if not hasattr(model, "embed_images"):
        raise RuntimeError(f"{type(model).__name__} received images but has no embed_images()")
    missing: dict[str, MultiModalInput] = {}
    for item, *_ in spans:
        if item.hash in missing:
            continue
        if cache.get(item.hash) is not None:
            cache.hits += 1
        else:
            missing[item.hash] = item
    if getattr(model, "embeds_packed_images", False):  # dynamic resolution: one call, images packed + grids
        items = list(missing.values())
        if items:
            out = model.embed_images(torch.cat([_pixels(i, device) for i in items]), [i.grid_thw for i in items])
            if out.shape[0] != sum(i.length for i in items):
                raise RuntimeError(f"{len(items)} images have {sum(i.length for i in items)} placeholders but the "
                                   f"encoder made {out.shape[0]} embeddings")
            for item, rows in zip(items, out.split([i.length for i in items])):
                cache.put(item.hash, rows)
                cache.encoded += 1
        missing = {}
    by_shape: dict[tuple, list[MultiModalInput]] = {}
    for item in missing.values():  # one vision-tower batch per pixel shape
        by_shape.setdefault(tuple(item.shape), []).append(item)
    for items in by_shape.values():
        out = model.embed_images(torch.stack([_pixels(i, device) for i in items]))
        for i, item in enumerate(items):
            if out.shape[1] != item.length:
                raise RuntimeError(f"image {item.hash[:12]} has {item.length} placeholders but the encoder made "
                                   f"{out.shape[1]} embeddings")
            cache.put(item.hash, out[i])
            cache.encoded += 1
    index, rows = [], []
    for item, first_flat, lo, hi in spans:
        index.append(torch.arange(first_flat, first_flat + hi - lo))
        rows.append(cache.get(item.hash)[lo:hi])
    return torch.cat(index).to(device), torch.cat(rows)
