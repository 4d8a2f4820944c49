"""The batched LoRA op (punica's shrink + expand), in torch: a device-agnostic path a platform may replace.

Every token of a step carries an adapter slot (-1: none). Once per step, :func:`plan_tokens` sorts the tokens by
slot and builds every index tensor the layers need (a :class:`LoRAPlan`); each layer then runs a fixed, small
number of ops whatever the number of adapters, never a Python loop over tokens:

- ``single``: one adapter for the whole batch: ``y += (x A^T) B^T`` (two matmuls, no gather).
- ``padded``: the adapters' tokens are gathered into one ``[S, L, in]`` block (S = slots spanned, L = the
  longest slot's token count), then one batched matmul shrinks and one expands, and one gather adds each
  token's row back (base-model tokens read a zeroed padding row). Chosen when padding wastes little
  (mixed decode batches: a few tokens per adapter).
- ``runs``: a request's tokens are contiguous in the batch, so when the step has few runs of one slot (prefill
  chunks, long or few requests), each run is two matmuls, the expand added in place into ``y``'s rows
  (``addmm_`` on a row slice): no gather, no extra pass over ``[n, out]``. Chosen only when there are at most
  ``max(4, S)`` runs: 64 prefill runs of 32 tokens took 9.2 s per layer's projections with 2 threads on the
  loaded VM (each small matmul a parallel region waiting for a descheduled thread) vs 0.49 s ``padded``.
- ``loop``: the same sorted gather as ``padded``, but one matmul pair per slot segment (written into one
  buffer), for the remaining lopsided steps (many short runs and one slot with far more tokens).

Why not ``index_add_``: the first version scattered each slot's delta back with ``index_add_``, which on CPU
is a serial ``scatter_add`` (19 ms per call for a 1024-token prefill step, half of the whole LoRA step time).
Every path here only gathers (``index_select``) and adds in place.

On CUDA the same plan feeds the platform's LoRA kernels (``Platform.make_lora_kernels``; CUDA: Triton,
plugins/platforms/cuda_lora.py) (shrink/expand over sorted
token blocks, scatter fused into the expand).
"""

from __future__ import annotations

import torch

PAD_WASTE = 2.0  # ``padded`` when S * L <= PAD_WASTE * (tokens with an adapter) + 8 * S, else ``loop``
USE_RUNS = True  # (tests turn it off to check the other layouts on the same tokens)


class LoRAPlan:
    """This step's token -> adapter layout, built once per step and shared by every layer.

    Attributes:
        mode: ``"single"``, ``"padded"`` or ``"loop"`` (see the module docstring).
        slot: the slot of ``single``.
        slots_used: the slots present in the step.
        span: ``padded``: the number of leading slots its batched matmul covers (weights viewed, not copied);
            ``slot_idx`` holds the slots to gather instead when they are not a prefix.
        gather_idx / back_idx / pad_mask: ``padded``: token rows forming the ``[S, L]`` block; each token's
            row in it (base tokens: a padding row); ``[S*L, 1]`` 1 for real rows, None without base tokens.
        rows / segments / inv / num_base: ``loop``: adapter tokens sorted by slot; ``(slot, start, end)`` in
            ``rows``; each token's row in ``[base zeros; sorted deltas]``; the number of base tokens.
        triton: with the platform's kernels, their block layout (``kernels.plan_blocks``); kernels: those kernels
            (``Platform.make_lora_kernels()``), or None (the torch layouts).
    """

    __slots__ = ("mode", "slot", "slots_used", "span", "slot_idx", "length", "gather_idx", "back_idx", "pad_mask",
                 "rows", "segments", "inv", "num_base", "triton", "runs", "kernels")

    def __init__(self) -> None:
        self.mode, self.slot, self.slots_used, self.span, self.slot_idx, self.length = "single", -1, [], 0, None, 0
        self.gather_idx = self.back_idx = self.pad_mask = self.rows = self.inv = self.triton = self.kernels = None
        self.segments: list[tuple[int, int, int]] = []
        self.runs: list[tuple[int, int, int]] = []  # ``runs``: (slot, first token, end) in batch order
        self.num_base = 0


def plan_tokens(token_slots: torch.Tensor, device: torch.device, kernels=None) -> LoRAPlan | None:
    """The plan for ``token_slots`` (``[n]`` int64 on the host, -1 = base model); None without adapter tokens.
    ``kernels``: the platform's LoRA kernels (``Platform.make_lora_kernels()``) to plan for, or None (torch)."""
    n = token_slots.numel()
    counts = torch.bincount(token_slots + 1)  # counts[0]: base tokens, counts[s + 1]: slot s
    num_base = int(counts[0])
    if num_base == n:
        return None
    plan = LoRAPlan()
    used = torch.nonzero(counts[1:]).squeeze(1).tolist()
    plan.slots_used, plan.num_base = used, num_base
    if len(used) == 1 and num_base == 0:
        plan.mode, plan.slot = "single", used[0]
        if kernels is not None:
            plan.kernels = kernels
            plan.triton = kernels.plan_blocks(torch.arange(n), [(used[0], 0, n)], device)
        return plan
    order = torch.argsort(token_slots, stable=True)  # base tokens first, then slot by slot
    m = n - num_base
    rows = order[num_base:]
    segments, start = [], 0
    for s in used:
        c = int(counts[s + 1])
        segments.append((s, start, start + c))
        start += c
    if kernels is not None:
        plan.mode, plan.segments, plan.kernels = "triton", segments, kernels
        plan.triton = kernels.plan_blocks(rows, segments, device)
        return plan
    change = torch.nonzero(token_slots[1:] != token_slots[:-1]).squeeze(1).add(1).tolist()
    bounds = [0, *change, n]
    runs = [(int(token_slots[b]), b, e) for b, e in zip(bounds[:-1], bounds[1:]) if int(token_slots[b]) >= 0]
    if USE_RUNS and len(runs) <= max(4, len(used)):  # few ops: 2 per run (many small ones stall 2 busy threads)
        plan.mode, plan.runs = "runs", runs
        return plan
    longest = max(e - b for _, b, e in segments)
    prefix = used == list(range(len(used)))  # slots 0..S-1: the batched matmul views the weights, no copy
    span = len(used)
    length = longest + (1 if num_base and span * longest == m else 0)  # base tokens need one padding row
    if span * length <= PAD_WASTE * m + 8 * span:
        plan.mode, plan.span, plan.length = "padded", span, length
        if not prefix:
            plan.slot_idx = torch.tensor(used, device=device)
        gather = torch.empty(span * length, dtype=torch.long)
        back = torch.empty(n, dtype=torch.long)
        mask = torch.zeros(span * length, 1)
        pad_row = None
        for i, (_, b, e) in enumerate(segments):
            base_pos = i * length
            gather[base_pos:base_pos + length] = rows[b]  # padding rows repeat a real token (their result is unused)
            gather[base_pos:base_pos + e - b] = rows[b:e]
            back[rows[b:e]] = torch.arange(base_pos, base_pos + e - b)
            mask[base_pos:base_pos + e - b] = 1
            if pad_row is None and e - b < length:
                pad_row = base_pos + e - b
        if num_base:
            back[order[:num_base]] = pad_row
            plan.pad_mask = mask.to(device)
        plan.gather_idx, plan.back_idx = gather.to(device), back.to(device)
        return plan
    plan.mode, plan.segments = "loop", segments
    plan.rows = rows.to(device)
    inv = torch.empty(n, dtype=torch.long)
    inv[order] = torch.arange(n)
    plan.inv = inv.to(device)
    return plan


def lora_shrink_expand(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                       plan: LoRAPlan | None, parts: list[int] | None = None) -> torch.Tensor:
    """Adds ``B[slot(t)] @ A[slot(t)] @ x[t]`` to ``y[t]`` in place (nothing for base tokens); returns ``y``.

    Args:
        x: ``[n, in]`` the layer's input; y: ``[n, out]`` the base layer's output (a fresh tensor: updated in place).
        lora_a: ``[slots, R, in]``; lora_b: ``[slots, out, R]`` (scaling folded in), in the LoRA dtype.
        plan: from :func:`plan_tokens`.
        parts: a fused projection's output offsets (B block-diagonal over them): lets the Triton expand skip
            the other parts' zeros (the CUDA kernels' ``part_expand``); the torch layouts ignore the hint.
    """
    if plan is None:
        return y
    if plan.triton is not None:
        return plan.kernels.lora_shrink_expand_triton(x, y, lora_a, lora_b, plan.triton, parts)
    dt = lora_a.dtype
    if plan.mode == "single":
        delta = (x.to(dt) @ lora_a[plan.slot].t()) @ lora_b[plan.slot].t()
        return y.add_(delta.to(y.dtype))
    if plan.mode == "runs":
        same = x.dtype == dt == y.dtype
        for slot, b0, e0 in plan.runs:
            h = x[b0:e0].to(dt) @ lora_a[slot].t()
            if same:
                y[b0:e0].addmm_(h, lora_b[slot].t())
            else:
                y[b0:e0].add_((h @ lora_b[slot].t()).to(y.dtype))
        return y
    if plan.mode == "padded":
        s, length = plan.span, plan.length
        a = lora_a[:s] if plan.slot_idx is None else lora_a.index_select(0, plan.slot_idx)
        b = lora_b[:s] if plan.slot_idx is None else lora_b.index_select(0, plan.slot_idx)
        xp = x.index_select(0, plan.gather_idx).to(dt).view(s, length, -1)
        h = torch.bmm(xp, a.transpose(1, 2))  # shrink: [S, L, R]
        if plan.pad_mask is not None:  # zero the padding rows that base tokens read back
            h.mul_(plan.pad_mask.to(dt).view(s, length, 1))
        d = torch.bmm(h, b.transpose(1, 2)).view(s * length, -1)  # expand: [S*L, out]
        return y.add_(d.index_select(0, plan.back_idx).to(y.dtype))
    xs = x.index_select(0, plan.rows).to(dt)
    nb = plan.num_base
    h = torch.empty(xs.shape[0], lora_a.shape[1], dtype=dt, device=x.device)
    d = torch.empty(nb + xs.shape[0], lora_b.shape[1], dtype=dt, device=x.device)
    d[:nb].zero_()
    for slot, b0, e0 in plan.segments:
        torch.mm(xs[b0:e0], lora_a[slot].t(), out=h[b0:e0])
        torch.mm(h[b0:e0], lora_b[slot].t(), out=d[nb + b0:nb + e0])
    return y.add_(d.index_select(0, plan.inv).to(y.dtype))


def lora_reference(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                   token_slots: torch.Tensor) -> torch.Tensor:
    """Token by token in float64: the oracle of the tests (slow; never used by the engine)."""
    out = y.double().clone()
    for t, s in enumerate(token_slots.tolist()):
        if s >= 0:
            out[t] += lora_b[s].double() @ (lora_a[s].double() @ x[t].double())
    return out
