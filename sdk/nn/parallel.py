"""Tensor-parallel helpers for ``octavo.nn``: which rank this process is and the collectives layers use.

The rank and size come from ``torch.distributed`` when it is initialised (the multiprocess executor sets it
up, one process per device), else 1 and 0: a single process needs no collective at all. An executor that runs
pipeline and tensor parallelism together passes its tensor-parallel group to
:func:`set_tensor_parallel_group` before building the model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_TP_GROUP = None  # NOTE: process-wide by nature (one model per worker process); set once by the executor.
_EXPERT_PARALLEL = False  # enable_expert_parallel: MoE layers split their experts over the TP ranks
_ALL_REDUCE = None  # an optional faster all-reduce for small messages (core/tp_comm.py); None: torch.distributed
_ALL_GATHER = None  # the same for the all-gather along the last dim (the LM head's vocabulary shards)


def set_tensor_parallel_group(group) -> None:
    """Use ``group`` (a ``torch.distributed`` process group) for tensor parallelism instead of the world."""
    global _TP_GROUP
    _TP_GROUP = group


def set_expert_parallel(enabled: bool) -> None:
    """``enable_expert_parallel``: MoE layers built from now on place whole experts on the tensor-parallel
    ranks (``num_experts / tp`` each) instead of a slice of every expert (the worker sets it once)."""
    global _EXPERT_PARALLEL
    _EXPERT_PARALLEL = bool(enabled)


def expert_parallel_enabled() -> bool:
    return _EXPERT_PARALLEL


def get_tp_group():
    """The tensor-parallel process group (``None`` means the world group)."""
    return _TP_GROUP


def set_all_reduce(fn) -> None:
    """Route :func:`tp_all_reduce` through ``fn(x) -> x summed in place, or None`` first (``None`` from ``fn``
    falls back to ``torch.distributed.all_reduce``, e.g. for messages too large for ``fn``'s buffer)."""
    global _ALL_REDUCE
    _ALL_REDUCE = fn


def set_all_gather(fn) -> None:
    """Route :func:`tp_all_gather` through ``fn(x, dim) -> gathered, or None`` first (``None``: torch.distributed)."""
    global _ALL_GATHER
    _ALL_GATHER = fn


def get_tp_size() -> int:
    """Number of processes a layer's weights are split across (1 without ``torch.distributed``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(_TP_GROUP)


def get_tp_rank() -> int:
    """This process's index among the tensor-parallel processes (0 without ``torch.distributed``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(_TP_GROUP)


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel processes (identity when there is one)."""
    if get_tp_size() == 1:
        return x
    if _ALL_REDUCE is not None and _ALL_REDUCE(x) is not None:
        return x
    dist.all_reduce(x, group=_TP_GROUP)
    return x


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate ``x`` from every tensor-parallel process along ``dim`` (identity when there is one)."""
    world = get_tp_size()
    if world == 1:
        return x
    if _ALL_GATHER is not None:
        out = _ALL_GATHER(x, dim)
        if out is not None:
            return out
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """``numerator // denominator``, refusing a remainder with a message that says what did not split."""
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by tensor_parallel_size={denominator}; "
                         f"choose a tensor_parallel_size that divides it")
    return numerator // denominator
