"""A one-shot all-reduce for small messages between the GPUs of one host (tensor parallelism's decode step).

Why: a Llama-3-8B TP=2 batch-1 decode step does 64 all-reduces of 8 KiB, each a few microseconds of NVLink
latency plus whatever the collective adds; NCCL's in-graph cost (~10-17 us a call) is a quarter of the step
(docs/performance.md, "Tensor parallelism"). vLLM and SGLang use a custom all-reduce for such messages; this
is octavo's own, in Triton, over buffers that PyTorch's symmetric memory maps on every rank (peer-to-peer
over NVLink; no multicast).

One kernel does everything (no copy-in launch, no second barrier)::

    rank r, call with epoch e (a per-communicator counter on the device; graph replays advance it)
      1. push : x -> every peer p's data[e % 2][r]            (remote stores over NVLink)
      2. flag : bar.sync; peer p's flags[r][cta] = e           (st.release.sys: the data is visible first)
      3. wait : until my flags[p][cta] >= e for every peer p   (ld.acquire.sys), bar.sync
      4. sum  : x = sum over ranks k = 0..W-1 (rank order, fp32) of (x if k == r else my data[e % 2][k])

Two data buffers alternate by epoch, so no end barrier is needed: a rank writes data[e % 2] of its peer in
call e only after it saw the peer's flag of call e - 1, which the peer raises after its call e - 2 (the last
reader of that buffer) has finished. Every rank sums in rank order, so all ranks get bitwise the same result.
Each CTA has its own flag slot; CTA 0 also advances the epoch of the CTA slots a small call leaves idle, so
the counter stays one global call index on every rank. The calls must come in the same order on every rank
(as NCCL's do). Messages above ``max_bytes`` or non-contiguous ones return ``None`` (the caller uses NCCL).
"""

from __future__ import annotations

import logging

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the cuda platform reports triton as missing
    triton = None

from octavo.env_flags import env_switch
from octavo.plugins.platforms.cuda_pdl import launch_opts

logger = logging.getLogger(__name__)

if triton is not None:
    from octavo.plugins.platforms.cuda_allreduce_epochs import (
        BLOCK,
        FLAG_BYTES,
        MAX_CTAS,
        _begin_call,
    )

    @triton.jit
    def _store_to_peers(vals, offs, mask, like_ptr, data_table, parity, cap, RANK: tl.constexpr,
                        WORLD: tl.constexpr):
        """Push: ``vals`` at ``offs`` of this rank's slot [parity][RANK] in every peer's buffer (remote stores)."""
        for k in tl.static_range(WORLD):
            if k != RANK:
                dst = tl.multiple_of(tl.load(data_table + k).to(like_ptr.dtype) + (parity * WORLD + RANK) * cap, 16)
                tl.store(dst + offs, vals, mask=mask)  # bases are 64 KiB aligned and cap a multiple of 16

    @triton.jit
    def _push(x_ptr, n, pid, grid, data_table, parity, cap, RANK: tl.constexpr, WORLD: tl.constexpr,
              BLOCK: tl.constexpr):
        """Push this CTA's share (a grid-strided loop of BLOCK chunks) of the ``n``-element message ``x``."""
        offs0 = tl.arange(0, BLOCK)
        for start in range(pid * BLOCK, n, grid * BLOCK):
            offs = tl.multiple_of(start, BLOCK) + offs0
            m = offs < n
            _store_to_peers(tl.load(x_ptr + offs, mask=m), offs, m, x_ptr, data_table, parity, cap, RANK, WORLD)

    @triton.jit
    def _signal_and_wait(flag_table, slot, epoch, RANK: tl.constexpr, WORLD: tl.constexpr, MAXG: tl.constexpr):
        """After this CTA's pushes: raise its flag on every peer (release: the data is visible first), then wait
        until every peer raised its flag of ``epoch`` here (acquire). Barriers on both sides: all of the CTA's
        threads pushed before the flag, none reads before the wait."""
        tl.debug_barrier()
        for k in tl.static_range(WORLD):
            if k != RANK:
                peer_flags = tl.load(flag_table + k).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(peer_flags + RANK * MAXG + slot, epoch, sem="release", scope="sys")
        my_flags = tl.load(flag_table + RANK).to(tl.pointer_type(tl.int64))
        for k in tl.static_range(WORLD):
            if k != RANK:
                while tl.atomic_add(my_flags + k * MAXG + slot, 0, sem="acquire", scope="sys") < epoch:
                    pass
        tl.debug_barrier()

    @triton.jit
    def _received(like_ptr, data_table, parity, cap, RANK: tl.constexpr, WORLD: tl.constexpr):
        """Base of this rank's received slots of ``parity`` (peer k's message at + k * cap)."""
        return tl.multiple_of(tl.load(data_table + RANK).to(like_ptr.dtype) + parity * WORLD * cap, 16)

    @triton.jit
    def _exchange(x_ptr, n, flag_table, data_table, counters, cap, RANK: tl.constexpr, WORLD: tl.constexpr,
                  MAXG: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
        """Steps 1-3 for this CTA's share of a grid-strided message: push, flag, wait. Returns the base of the
        received slots (peer k's copy of ``x`` at + k * cap)."""
        pid, grid, epoch, parity = _begin_call(counters, MAXG, PDL)
        _push(x_ptr, n, pid, grid, data_table, parity, cap, RANK, WORLD, BLOCK)
        _signal_and_wait(flag_table, pid, epoch, RANK, WORLD, MAXG)
        return _received(x_ptr, data_table, parity, cap, RANK, WORLD)

    @triton.jit
    def _one_shot_kernel(x_ptr, n, flag_table, data_table, counters, cap,
                         RANK: tl.constexpr, WORLD: tl.constexpr, MAXG: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
        mine = _exchange(x_ptr, n, flag_table, data_table, counters, cap, RANK, WORLD, MAXG, BLOCK, PDL)
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        offs0 = tl.arange(0, BLOCK)
        for start in range(pid * BLOCK, n, grid * BLOCK):  # sum in rank order (fp32), in place
            offs = tl.multiple_of(start, BLOCK) + offs0
            m = offs < n
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for k in tl.static_range(WORLD):
                if k == RANK:
                    v = tl.load(x_ptr + offs, mask=m, other=0.0)
                else:
                    v = tl.load(mine + k * cap + offs, mask=m, other=0.0, cache_modifier=".cg")
                acc += v.to(tl.float32)
            tl.store(x_ptr + offs, acc.to(x_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _one_shot_gather_kernel(x_ptr, out_ptr, n, row_len, flag_table, data_table, counters, cap,
                                RANK: tl.constexpr, WORLD: tl.constexpr, MAXG: tl.constexpr, BLOCK: tl.constexpr,
                                PDL: tl.constexpr = False):
        """All-gather along the last dim with the same protocol (epochs, flags, buffers) as the all-reduce:
        push ``x`` ([rows, row_len] flat, ``n`` elements) to every peer, wait, then
        ``out[row, k * row_len + col] = x_k[row, col]``. Copies only, so any dtype (sampled ids too)."""
        mine = _exchange(x_ptr, n, flag_table, data_table, counters, cap, RANK, WORLD, MAXG, BLOCK, PDL)
        pid = tl.program_id(0)
        grid = tl.num_programs(0)
        offs0 = tl.arange(0, BLOCK)
        for start in range(pid * BLOCK, n, grid * BLOCK):
            offs = tl.multiple_of(start, BLOCK) + offs0
            m = offs < n
            row = offs // row_len
            col = offs - row * row_len
            for k in tl.static_range(WORLD):
                if k == RANK:
                    v = tl.load(x_ptr + offs, mask=m)
                else:
                    v = tl.load(mine + k * cap + offs, mask=m, cache_modifier=".cg")
                tl.store(out_ptr + row * (WORLD * row_len) + k * row_len + col, v, mask=m)


class OneShotAllReduce:
    """``fn(x)``: sum ``x`` over ``group`` in place with the one-shot kernel above, or ``None`` (caller falls
    back to NCCL) when ``x`` is larger than ``max_bytes``, not contiguous, or not a float dtype.

    Built collectively (every rank of ``group`` at once: the symmetric-memory rendezvous is a collective).
    """

    def __init__(self, group, device: torch.device, max_bytes: int = 1 << 20) -> None:
        if triton is None:
            raise RuntimeError("the one-shot all-reduce needs triton (pip install 'octavo[cuda]')")
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        self.group = group
        self.world = dist.get_world_size(group)
        if not 2 <= self.world <= 8:
            raise ValueError(f"one-shot all-reduce supports 2..8 ranks, not {self.world}")
        self.rank = dist.get_rank(group)
        self.device = device
        self.max_bytes = int(max_bytes)
        from octavo.plugins.platforms.cuda_allreduce_ll import LL_REGION_BYTES_PER_SLOT

        data_bytes = 2 * self.world * self.max_bytes  # data[2][W][max_bytes], then the LL words (ll[2][W][...])
        self.buf = symm_mem.empty(FLAG_BYTES + data_bytes + 2 * self.world * LL_REGION_BYTES_PER_SLOT,
                                  dtype=torch.uint8, device=device)
        self.buf[:FLAG_BYTES].zero_()
        self.buf[FLAG_BYTES + data_bytes:].zero_()  # LL call indices start at 1: a zero word is "not yet"
        hdl = symm_mem.rendezvous(self.buf, group.group_name)
        ptrs = [int(p) for p in hdl.buffer_ptrs]
        self.flag_table = torch.tensor(ptrs, dtype=torch.int64, device=device)
        self.data_table = torch.tensor([p + FLAG_BYTES for p in ptrs], dtype=torch.int64, device=device)
        self.ll_table = torch.tensor([p + FLAG_BYTES + data_bytes for p in ptrs], dtype=torch.int64, device=device)
        self.ll = env_switch("OCTAVO_TP_ALLREDUCE_LL", default=False)  # cuda_allreduce_ll.py for small 16-bit
        self.counters = torch.zeros(MAX_CTAS, dtype=torch.int64, device=device)  # int64: never wraps
        torch.cuda.synchronize(device)
        dist.barrier(group=group)  # every rank's flags are zero before anyone raises one
        self.num_calls = 0
        # deferral (cuda_allreduce_fusion.py): inside a wrapped row-parallel layer's forward (allow_defer), a
        # [rows <= defer_rows, defer_width] message is returned unreduced and summed by the RMSNorm that consumes
        # it; 0 rows = off
        self.defer_rows, self.defer_width, self.pending, self.allow_defer = 0, 0, None, False
        # cuda_allreduce_gemv.py (opt-in): a 1-row row-parallel GEMV sends its output's LL words itself; the
        # pending message is then "pushed" (its consumer only receives). Settled by the fusion's check at start.
        from octavo.plugins.platforms.cuda_allreduce_gemv import push_for_world

        self.push = push_for_world(self.world)  # default on where measured (TP=2); TP>2: =1 opts in
        self.pending_pushed = False

    def __call__(self, x: torch.Tensor):
        if self.pending is not None:  # a deferred message nobody fused: reduce it before anything else
            self.flush()
        nbytes = x.numel() * x.element_size()
        if nbytes > self.max_bytes or not x.is_contiguous() or not x.is_floating_point() or x.numel() == 0:
            return None
        if self.allow_defer and self.defer_rows and x.dim() == 2 and x.shape[0] <= self.defer_rows and x.shape[1] == self.defer_width:
            self.pending = x
            return x
        return self.reduce(x)

    def flush(self) -> None:
        """Reduce the deferred message in place (its consumer was not a fusable norm)."""
        x, self.pending = self.pending, None
        pushed, self.pending_pushed = self.pending_pushed, False
        if x is not None and pushed:  # its words are on the way already (cuda_allreduce_gemv.py): receive only
            from octavo.plugins.platforms.cuda_allreduce_ll import ll_reduce

            ll_reduce(self, x, pushed=True)
        elif x is not None:
            self.reduce(x)

    def all_gather(self, x: torch.Tensor, dim: int = -1):
        """``x`` of every rank concatenated along the last dim (rank order), or ``None`` (caller: NCCL) for
        another dim, a non-contiguous or too large ``x``. Used for the LM head's vocabulary shards and the
        sampled ids' broadcast (rank 0's slice), the two collectives of a decode step outside its graph."""
        if self.pending is not None:
            self.flush()
        nbytes = x.numel() * x.element_size()
        if (dim % max(x.dim(), 1)) != x.dim() - 1 or not x.is_contiguous() or nbytes > self.max_bytes \
                or x.numel() == 0:
            return None
        n, row_len = x.numel(), x.shape[-1]
        out = torch.empty((*x.shape[:-1], row_len * self.world), dtype=x.dtype, device=x.device)
        grid = (min(MAX_CTAS, triton.cdiv(n, BLOCK)),)
        _one_shot_gather_kernel[grid](x, out, n, row_len, self.flag_table, self.data_table, self.counters,
                                      self.max_bytes // x.element_size(), RANK=self.rank, WORLD=self.world,
                                      MAXG=MAX_CTAS, BLOCK=BLOCK, num_warps=4, **launch_opts())
        self.num_calls += 1
        return out

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The one-shot kernel on ``x`` (contiguous, float, at most ``max_bytes``), in place."""
        if self.ll:
            from octavo.plugins.platforms.cuda_allreduce_ll import ll_fits, ll_reduce

            if ll_fits(x):
                return ll_reduce(self, x)
        n = x.numel()
        grid = (min(MAX_CTAS, triton.cdiv(n, BLOCK)),)
        _one_shot_kernel[grid](x, n, self.flag_table, self.data_table, self.counters,
                               self.max_bytes // x.element_size(), RANK=self.rank, WORLD=self.world,
                               MAXG=MAX_CTAS, BLOCK=BLOCK, num_warps=4, **launch_opts())
        self.num_calls += 1
        return x
