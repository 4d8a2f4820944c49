"""M-RoPE positions (Qwen2-VL): each token's rotary position as three rows (time, height, width), per step.

Why in the runner and computed per step: positions follow from the request's sequence index alone once the
images are known (transformers' ``get_rope_index``): text tokens all share one position that runs on from
the previous item; an image's placeholders take ``start + (t, row, column)`` of its merged patch grid; after
an image the text continues at ``start + max(rows, columns)``, so every later token is shifted by the same
delta (``max(rows, columns) - placeholders``), and decode is ``index + delta`` of all the images. So a chunked
prefill, a prefix-cache hit, a decode step or a recompute after preemption gets exactly the positions the
whole sequence would have, with no per-request state beyond the images (``MultiModalInput`` offset, length
and ``grid_thw``). The step contract stays unchanged: the KV slots still follow the sequence index
(``StepInputs.layout``); only the positions handed to the model change.

Shape: ``[n]`` when no image placeholder runs this step (text positions have equal rows, which is plain rope,
so decode batches keep their ``[n]`` shape and any graph runner), else ``[3, n]``.
"""

from __future__ import annotations

import numpy as np
import torch

from octavo.step import MultiModalInput, StepBatch


def request_rope_positions(start: int, count: int, items: list[MultiModalInput],
                           merge: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Rope positions of sequence indices ``[start, start + count)``: ``(text row [count], rows [3, count]
    or None when none of them is an image placeholder)``."""
    index = np.arange(start, start + count, dtype=np.int64)
    text = index.copy()
    rows = None
    shift = 0  # rope position minus sequence index, for tokens after the items seen so far
    for item in sorted(items, key=lambda m: m.offset):
        t, h, w = item.grid_thw
        h, w = h // merge, w // merge
        first = item.offset + shift  # the image's start position
        end = item.offset + item.length
        inside = (index >= item.offset) & (index < end)
        if inside.any():
            if rows is None:
                rows = np.empty((3, count), dtype=np.int64)
            j = index[inside] - item.offset
            rows[0, inside] = first + j // (h * w)
            rows[1, inside] = first + (j // w) % h
            rows[2, inside] = first + j % w
        shift += max(h, w) - item.length
        text[index >= end] = index[index >= end] + shift
    if rows is not None:
        is_text = ~_in_any(index, items)
        rows[:, is_text] = text[is_text]
    return text, rows


def _in_any(index: np.ndarray, items: list[MultiModalInput]) -> np.ndarray:
    mask = np.zeros(index.shape, dtype=bool)
    for m in items:
        mask |= (index >= m.offset) & (index < m.offset + m.length)
    return mask


def step_rope_positions(batch: StepBatch, states: dict, inputs, merge: int, device: torch.device) -> torch.Tensor:
    """This step's positions for an M-RoPE model: ``inputs.positions`` itself when no scheduled request has
    images, else ``[n]`` or ``[3, n]`` on ``device`` (see the module docstring)."""
    with_items = [(i, states[s.request_id].mm_inputs) for i, s in enumerate(batch.scheduled)
                  if states[s.request_id].mm_inputs]
    if not with_items:
        return inputs.positions  # text only: rope positions are the sequence indices
    qsl = inputs.layout.query_start_loc.numpy()
    starts = inputs.layout.num_computed_tokens.numpy()
    n = int(qsl[-1])
    req_of_token = np.repeat(np.arange(len(qsl) - 1), np.diff(qsl))
    text = (starts[req_of_token] + np.arange(n) - qsl[:-1][req_of_token]).astype(np.int64)
    shifts = np.zeros(len(qsl) - 1, dtype=np.int64)  # requests past all their images: one delta each
    pieces = []
    for i, items in with_items:
        if starts[i] >= max(m.offset + m.length for m in items):  # decode (the common case): no arrays
            shifts[i] = sum(max(m.grid_thw[1] // merge, m.grid_thw[2] // merge) - m.length for m in items)
            continue
        lo, hi = int(qsl[i]), int(qsl[i + 1])
        t_row, rows = request_rope_positions(int(starts[i]), hi - lo, items, merge)
        text[lo:hi] = t_row
        if rows is not None:
            pieces.append((lo, hi, rows))
    text += shifts[req_of_token]
    if not pieces:
        return torch.from_numpy(text).to(device, non_blocking=True)
    out = np.broadcast_to(text, (3, n)).copy()
    for lo, hi, rows in pieces:
        out[:, lo:hi] = rows
    return torch.from_numpy(out).to(device, non_blocking=True)
