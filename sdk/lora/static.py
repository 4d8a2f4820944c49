"""LoRA inside CUDA graphs: static slot buffers written before each replay, and ops with fixed shapes.

A captured decode graph replays the same kernels with the same shapes every step, so the per-step LoRA plan of
:mod:`octavo.lora.ops` (layouts chosen on the host, index tensors sized by the step) cannot be in it. Here the
step's adapter choice lives in device buffers of a fixed size that :meth:`StaticLoRA.write` overwrites in
place before the forward (one host->device copy, no sync), and the ops read them whatever the mix:

- ``slots [cap]``: each token's slot, -1 for base-model tokens and for every row past the step's tokens (the
  padding rows of a replayed batch); ``mask [cap, max_loras]``: one-hot of ``slots`` in the LoRA dtype.
- dense op (torch, the default): shrink the whole padded batch against every slot's A at once
  (``[n, in] @ [in, S*R]``), zero the slots a token does not use (``mask``), expand against every slot's B at
  once (``[n, S*R] @ [S*R, out]``, B stored ``[out, S*R]``). Exact: a token's other slots contribute products of
  zeros; base tokens get ``+0``. Three kernels per projection; it reads all ``max_loras`` slots' weights
  each step (about 1 GB a step for 8 rank-16 slots on a Llama-3-8B shape: ~0.3 ms of HBM time on an H100).
- SGMV op (``OCTAVO_LORA_KERNEL=triton``): the platform's LoRA kernels (``Platform.make_lora_kernels``; CUDA:
  plugins/platforms/cuda_lora.py) on a fixed grid of
  ``ceil(n / 16) + max_loras`` token blocks (enough for any mix of ``n`` tokens over ``max_loras`` slots);
  ``rows``/``blocks`` hold this step's blocks, the unused ones are empty (``start == end``) and return at once.
  Reads only the slots a block uses.

Graphs are captured with LoRA on: the manager's hooks see ``torch.cuda.is_current_stream_capturing()`` and
emit these ops, so one graph per batch size serves every adapter mix, base-only steps included (their masks
are zero). Loading an adapter only writes into slot tensors that the graphs read by address.
"""

from __future__ import annotations

import torch

BLOCK_M = 16  # tokens per SGMV block (== the kernels' BLOCK_M, checked when they are given)


def _round16(n: int) -> int:
    return -(-n // 16) * 16


class StaticLoRA:
    """The fixed-size per-step buffers and the graph-safe ops reading them.

    Args:
        max_loras: slots (S). cap: the most tokens one captured graph runs (buffers' rows).
        dtype: the LoRA dtype (mask); device: where the buffers live; kernels: the platform's LoRA kernels
        (``Platform.make_lora_kernels()``): the SGMV op instead of dense, or with ``fused_expand`` the dense op's
        masked expand; None: the dense torch op.
    """

    def __init__(self, max_loras: int, cap: int, dtype: torch.dtype, device, kernels=None,
                 fused_expand: bool = False) -> None:
        if fused_expand and kernels is None:
            raise ValueError("StaticLoRA(fused_expand=True) needs the platform's LoRA kernels (masked_expand)")
        if kernels is not None and kernels.BLOCK_M != BLOCK_M:
            raise ValueError(f"the platform's LoRA kernels use {kernels.BLOCK_M}-token blocks, StaticLoRA {BLOCK_M}")
        self.kernels = kernels
        self.max_loras, self.cap = max_loras, _round16(cap)
        self.use_triton = kernels is not None and not fused_expand  # the SGMV op
        self.fused_expand = fused_expand  # dense op: mask folded into a Triton expand (2 kernels, not 3)
        self.slots = torch.full((self.cap,), -1, dtype=torch.long, device=device)
        self.mask = torch.zeros(self.cap, max_loras, dtype=dtype, device=device)
        self.arange = torch.arange(max_loras, device=device)
        self.dirty = 0  # rows [0, dirty) may hold a slot other than -1
        self.captured = False  # set by the manager when a graph captured these ops
        self.max_blocks = _round16(-(-self.cap // BLOCK_M) + max_loras)
        # SGMV: sorted token rows, then per block (slot, start, end) into them; all-zero blocks are empty
        self.packed = torch.zeros(self.cap + 3 * self.max_blocks, dtype=torch.int32, device=device)
        mb, c = self.max_blocks, self.cap
        self.rows, self.blk_slot = self.packed[:c], self.packed[c:c + mb]
        self.blk_start, self.blk_end = self.packed[c + mb:c + 2 * mb], self.packed[c + 2 * mb:]
        self.blocks_dirty = False
        self.h_all: torch.Tensor | None = None  # SGMV static_h: [projections, cap, R max] fp32 shrink sums
        self.h_rows = 0  # rows [0, h_rows) of h_all may be non-zero (the last step's adapter tokens)

    def reserve_h(self, count: int, r_max: int) -> None:
        """With the SGMV op and ``static_h`` (the kernels' CONFIG): one persistent zeroed fp32 shrink
        buffer per projection (``apply(..., key=i)``), zeroed by :meth:`write` once per step instead of a memset
        kernel per projection inside the graph."""
        if self.use_triton:
            if self.kernels.CONFIG["static_h"]:
                self.h_all = torch.zeros(count, self.cap, r_max, dtype=torch.float32, device=self.slots.device)

    # ------------------------------------------------------------------------------------ per step (host)
    def write(self, token_slots: torch.Tensor | None, n: int) -> bool:
        """Point the buffers at this step: ``token_slots`` (``[n]`` int64 on the host, -1 = base; None = every
        token is base). Rows past ``n`` read as base. Returns False if ``n`` exceeds the buffers (no graph
        replays such a step)."""
        if n > self.cap:
            return False
        if self.h_rows:  # the last step's shrink sums (stream-ordered after its graph)
            self.h_all[:, :self.h_rows].zero_()
            self.h_rows = 0
        if token_slots is None:
            if self.dirty:
                self.slots[:self.dirty].fill_(-1)
                self.mask[:self.dirty].zero_()
                self.dirty = 0
            if self.blocks_dirty:
                self.packed[self.cap:].zero_()
                self.blocks_dirty = False
            return True
        w = max(n, self.dirty)
        host = torch.full((w,), -1, dtype=torch.long)
        host[:n] = token_slots
        self.slots[:w].copy_(host, non_blocking=True)
        self.mask[:w].copy_(self.slots[:w, None] == self.arange)
        self.dirty = n
        if self.use_triton:
            self.packed.copy_(self._blocks(token_slots), non_blocking=True)
            self.blocks_dirty = True
            if self.h_all is not None:
                self.h_rows = int((token_slots >= 0).sum())
        return True

    def _blocks(self, token_slots: torch.Tensor) -> torch.Tensor:
        """The packed SGMV layout on the host: adapter tokens sorted by slot, blocks of <= 16 of one slot.
        Plain Python lists (a decode step has a few hundred tokens): per-element tensor ops cost ~0.5 ms a step."""
        out = torch.zeros(self.packed.numel(), dtype=torch.int32)
        by_slot: list[list[int]] = [[] for _ in range(self.max_loras)]
        for i, slot in enumerate(token_slots.tolist()):
            if slot >= 0:
                by_slot[slot].append(i)
        rows = [i for lst in by_slot for i in lst]
        mb, c = self.max_blocks, self.cap
        cols: tuple[list[int], list[int], list[int]] = ([], [], [])  # slot, start, end per block
        start = 0
        for slot, lst in enumerate(by_slot):
            cnt = len(lst)
            for s in range(start, start + cnt, BLOCK_M):
                cols[0].append(slot)
                cols[1].append(s)
                cols[2].append(min(s + BLOCK_M, start + cnt))
            start += cnt
        nb = len(cols[0])
        if nb:  # one tensor write per part
            out[:len(rows)] = torch.tensor(rows, dtype=torch.int32)
            out[c:c + 3 * mb].view(3, mb)[:, :nb] = torch.tensor(cols, dtype=torch.int32)
        return out

    # ------------------------------------------------------------------------------------ ops (device)
    def apply(self, x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
              b_flat: torch.Tensor, parts: list[int] | None = None, key: int | None = None) -> torch.Tensor:
        """``y[t] += B[slot(t)] @ A[slot(t)] @ x[t]`` for the buffers' slots of rows ``[0, n)``; in place.

        ``lora_a [S, R, in]`` (contiguous), ``lora_b [S, out, R]`` a view of ``b_flat [out, S*R]``; ``parts``:
        a fused projection's output offsets (the SGMV expand's ``part_expand``); ``key``: the projection's index
        into the buffers of :meth:`reserve_h`.
        """
        n = x.shape[0]
        if n > self.cap:
            raise RuntimeError(f"a LoRA step of {n} tokens is captured but the static LoRA buffers hold {self.cap}")
        if self.use_triton:
            plan = self.kernels.BlockPlan(self.rows, self.blk_slot, self.blk_start, self.blk_end,
                             min(-(-n // BLOCK_M) + self.max_loras, self.max_blocks), n)
            h = self.h_all[key] if self.h_all is not None and key is not None else None
            return self.kernels.lora_shrink_expand_triton(x, y, lora_a, lora_b, plan, parts, h)
        s, r = lora_a.shape[0], lora_a.shape[1]
        dt = lora_a.dtype
        h = x.to(dt) @ lora_a.view(s * r, -1).t()  # [n, S*R]: every slot's shrink
        if self.fused_expand:
            return self.kernels.masked_expand(h, self.mask, b_flat, y)
        h.view(n, s, r).mul_(self.mask[:n, :, None])  # keep the token's own slot only
        return _expand(h, y, b_flat)

    def apply_embedding(self, ids: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor,
                        b_flat: torch.Tensor) -> torch.Tensor:
        """Embedding LoRA: ``y[t] += B[slot(t)] @ A[slot(t)][:, ids[t]]`` (``lora_a [S, R, vocab]``); in place."""
        n = ids.shape[0]
        s, r = lora_a.shape[0], lora_a.shape[1]
        h = lora_a[self.slots[:n].clamp(min=0), :, ids]  # [n, R]: the id's column of the token's slot
        h = (h.unsqueeze(1) * self.mask[:n, :, None]).view(n, s * r)  # placed in its slot's block, base: zeros
        return _expand(h, y, b_flat)


def _expand(h: torch.Tensor, y: torch.Tensor, b_flat: torch.Tensor) -> torch.Tensor:
    if y.dtype == h.dtype:
        return y.addmm_(h, b_flat.t())
    return y.add_((h @ b_flat.t()).to(y.dtype))
