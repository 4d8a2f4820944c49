"""Which all-reduce tensor parallelism uses: ``OCTAVO_TP_ALLREDUCE`` = ``custom`` (the default: the platform's own
one-shot kernel where it has one, ``Platform.make_tp_all_reduce``: on CUDA a Triton kernel over symmetric memory,
plugins/platforms/cuda_allreduce.py, which also takes the LM head's all-gather; torch.distributed elsewhere),
``nccl`` (whatever the platform's ``torch.distributed`` backend does) or ``symm_mem`` (torch's one-shot op).

Why: at batch 1 a Llama-3-8B TP=2 step does 64 all-reduces of 8 KiB, and through NCCL each costs ~10-15 us
(docs/performance.md, "Tensor parallelism"), about a third of the step. ``symm_mem`` is a one-shot
all-reduce through PyTorch's symmetric memory: every rank copies its message into a buffer all ranks mapped
at start (peer-to-peer over NVLink; no NVLink multicast, which stays disabled), and each rank sums all
ranks' buffers itself, one kernel, graph-capturable. Messages larger than the buffer (prefill chunks) and
other dtypes fall back to NCCL. Measured on 4x H100 (docs/performance.md): 9.7 vs 17.2 us per 8 KiB call in a
CUDA graph, but no faster 8B TP=2 decode end to end, so it stays opt-in; the choice is logged at start.
"""

from __future__ import annotations

import logging
import os

import torch

from octavo.core.async_runner import AsyncRunnerSteps
from octavo.env_flags import env_int

logger = logging.getLogger(__name__)

CHOICES = ("nccl", "symm_mem", "custom")
# What an unset OCTAVO_TP_ALLREDUCE means. "custom" there means: the platform's own all-reduce where it has one
# (CUDA), torch.distributed elsewhere or if it fails to start (all ranks agree), logged either way.
DEFAULT_CHOICE = "custom"  # session 5 batch 1 (2x H100): 4.8 vs 16.6 us per 8 KiB in a graph, TP=2 bs1 3.84 vs 4.07 ms
MAX_BYTES = env_int("OCTAVO_TP_ALLREDUCE_MAX_BYTES", 1 << 20, minimum=0)  # one-shot wins below ~1 MiB


def install_all_reduce(platform, device: torch.device, dtype: torch.dtype) -> str:
    """Install the all-reduce ``OCTAVO_TP_ALLREDUCE`` names for this process's tensor-parallel group."""
    env = os.environ.get("OCTAVO_TP_ALLREDUCE")
    choice = env or DEFAULT_CHOICE
    if choice not in CHOICES:
        raise ValueError(f"OCTAVO_TP_ALLREDUCE={choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "nccl":
        return choice
    if choice == "custom":  # the platform's own small-message all-reduce (CUDA: plugins/platforms/cuda_allreduce.py)
        return _install_platform_all_reduce(platform, device, explicit=env is not None)
    if platform.device_type != "cuda":
        raise ValueError(f"OCTAVO_TP_ALLREDUCE=symm_mem needs CUDA GPUs (platform {platform.name!r}); unset it")
    from octavo.nn.parallel import get_tp_group, set_all_reduce

    set_all_reduce(SymmMemAllReduce(get_tp_group(), device, dtype))
    logger.info("tensor-parallel all-reduce: one-shot symmetric memory for messages <= %d KiB (%s), NCCL above",
                MAX_BYTES >> 10, dtype)
    return choice


def _install_platform_all_reduce(platform, device: torch.device, explicit: bool) -> str:
    import torch.distributed as dist

    from octavo.nn.parallel import get_tp_group, set_all_reduce

    make = getattr(platform, "make_tp_all_reduce", None)
    if make is None:
        if not explicit:
            return "nccl"
        raise ValueError(f"OCTAVO_TP_ALLREDUCE=custom: platform {platform.name!r} has no all-reduce of its own; "
                         "unset it (NCCL/gloo through torch.distributed)")
    fn, err = None, None
    try:
        fn = make(get_tp_group(), device, MAX_BYTES)
    except Exception as e:  # noqa: BLE001 - by default, fall back (below, on every rank at once)
        if explicit:
            raise
        err = e
    ok = torch.tensor([0 if fn is None else 1], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=get_tp_group())  # every rank takes the same path
    if ok.item() == 0:
        logger.warning("tensor-parallel all-reduce: the platform's one-shot kernel did not start on every rank "
                       "(here: %s); torch.distributed. OCTAVO_TP_ALLREDUCE=nccl skips the attempt", err)
        return "nccl"
    set_all_reduce(fn)
    gather = getattr(fn, "all_gather", None)  # the LM head's shards and the sampled ids' broadcast, same buffers
    if gather is not None:
        from octavo.nn.parallel import set_all_gather

        set_all_gather(gather)
    logger.info("tensor-parallel all-reduce%s: the platform's one-shot kernel for messages <= %d KiB, NCCL above "
                "(OCTAVO_TP_ALLREDUCE=nccl: NCCL only)", " and all-gather" if gather else "", MAX_BYTES >> 10)
    return "custom"


class SymmMemAllReduce:
    """``fn(x)``: sum ``x`` over the group in place with a one-shot symmetric-memory all-reduce, or ``None``
    (caller falls back to NCCL) when ``x`` is too large or not the buffer's dtype."""

    def __init__(self, group, device: torch.device, dtype: torch.dtype) -> None:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        self.group_name = group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)  # needed before torch 2.8, deprecated after
        if enable is not None and tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 8):
            enable(self.group_name)
        self.dtype = dtype
        self.max_numel = MAX_BYTES // torch.empty((), dtype=dtype).element_size()
        self.buf = symm_mem.empty(self.max_numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buf, self.group_name)

    def __call__(self, x: torch.Tensor):
        n = x.numel()
        if x.dtype != self.dtype or n > self.max_numel or not x.is_contiguous():
            return None
        staged = self.buf[:n]
        staged.copy_(x.view(-1))
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, x.view(-1))
        return x


def make_async_steps(worker):
    """The runner's async-scheduling state for ``worker``: with tensor parallelism, one that broadcasts tp rank
    0's sampled ids to the other ranks on the device before they feed the next step (see
    :class:`TPAsyncRunnerSteps`); else the plain one (core/async_runner.py)."""
    if getattr(worker, "world_size", 1) > 1:
        return TPAsyncRunnerSteps(worker.device, worker.runner.synchronize)
    return AsyncRunnerSteps(worker.device, worker.runner.synchronize)


class TPAsyncRunnerSteps(AsyncRunnerSteps):
    """Async scheduling with tensor parallelism (the ``mp`` executor): every rank samples, and under async
    scheduling each rank writes ITS sampled ids into the next step's placeholder rows on its own device (the
    host's copy, rank 0's, arrives a step later). Synchronous steps carry rank 0's tokens in the next batch,
    so a rank whose sample differed (a near tie under a non-bitwise-identical reduction, another generator
    state) is corrected; here it would feed its own token into its KV cache. So rank 0's ids are broadcast
    over the tensor-parallel group right after sampling: one small collective per step, stream-ordered on the
    device (no host sync), and every rank's next step provably runs rank 0's tokens."""

    def defer(self, result, pending, inputs, reqs):
        import torch.distributed as dist

        from octavo.nn.parallel import get_tp_group

        sampled = pending.get("sampled")
        agree, self.ranks_agree = self.ranks_agree, False
        if sampled is not None and not agree:  # agree: the LM head graph's shard argmax (core/step_head.py)
            if not sampled.is_contiguous():
                sampled = pending["sampled"] = sampled.contiguous()
            from octavo.nn import parallel

            gather = parallel._ALL_GATHER  # the platform's one-shot all-gather: rank 0's slice is the broadcast
            gathered = gather(sampled.view(1, -1), -1) if gather is not None else None
            if gathered is not None:
                sampled.view(-1).copy_(gathered[0, : sampled.numel()])
            else:
                group = get_tp_group()
                src = 0 if group is None else dist.get_global_rank(group, 0)
                dist.broadcast(sampled, src=src, group=group)
        return super().defer(result, pending, inputs, reqs)
