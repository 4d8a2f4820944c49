"""The batched LoRA op (punica's shrink + expand), in torch: a device-agnostic reference a platform may replace.

Every token of a step carries an adapter slot (-1: none). For each slot present in the step (at most
``max_loras``), its tokens are gathered, multiplied by that slot's A then B, and added back: two matmuls per
active slot and layer, never a Python loop over tokens. The token groups are computed once per step
(:func:`group_tokens`) and shared by every layer.
"""

from __future__ import annotations

import torch


def group_tokens(token_slots: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """``[(slot, token rows or None for all tokens)]`` for each slot >= 0 in ``token_slots``."""
    slots = [int(s) for s in torch.unique(token_slots).tolist() if s >= 0]
    if len(slots) == 1 and bool((token_slots == slots[0]).all()):
        return [(slots[0], None)]  # one adapter for the whole batch: no gather / scatter
    return [(s, (token_slots == s).nonzero().squeeze(1)) for s in slots]


def lora_shrink_expand(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                       groups: list[tuple[int, torch.Tensor | None]]) -> torch.Tensor:
    """``y + delta`` where ``delta[t] = B[slot(t)] @ A[slot(t)] @ x[t]`` (0 for tokens without a slot).

    Args:
        x: ``[n, in]`` the layer's input; y: ``[n, out]`` the base layer's output.
        lora_a: ``[slots, R, in]``; lora_b: ``[slots, out, R]`` (scaling folded in), in the LoRA dtype.
        groups: from :func:`group_tokens`.
    """
    if not groups:
        return y
    y = y.clone()
    for slot, rows in groups:
        xs = x if rows is None else x.index_select(0, rows)
        delta = (xs.to(lora_a.dtype) @ lora_a[slot].t()) @ lora_b[slot].t()  # shrink, then expand
        if rows is None:
            y += delta.to(y.dtype)
        else:
            y.index_add_(0, rows, delta.to(y.dtype))
    return y
