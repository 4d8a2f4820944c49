"""Device slots for LoRA adapters: stacked A/B per projection, an LRU of slots and a host LRU behind it.

The manager wraps every linear projection of the model (``LinearBase``: q/k/v, o, gate/up, down) with a
forward hook that adds the batched LoRA delta (:mod:`octavo.lora.ops`) to the layer's output, so the layers
themselves stay untouched (quantized weights included: the hook only sees the input and the output).

Per projection, slot ``s`` holds ``A [R, in]`` and ``B [out, R]`` where a fused projection stacks its parts
along the rank (``R = parts * max_lora_rank``) and B is block-diagonal: the q/k/v (gate/up) adapters of one
slot run as one shrink and one expand. Each step the runner calls :meth:`LoRAManager.prepare` with the
adapter of each scheduled request; adapters not on the device take the least recently used free slot
(loaded from the host LRU of ``max_cpu_loras`` adapters, or from disk).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch

from octavo.lora.adapter import AdapterError, load_adapter
from octavo.lora.ops import LoRAPlan, lora_shrink_expand, plan_tokens
from octavo.lora.request import LoRARequest
from octavo.lora.static import BLOCK_M, StaticLoRA
from octavo.nn.parallel import tp_all_reduce


class _Projection:
    __slots__ = ("name", "offsets", "sizes", "lora_a", "lora_b", "b_flat", "rank", "used", "b_rows", "a_cols",
                 "reduce", "index")

    def __init__(self, name: str, sizes: list[int], in_size: int, slots: int, rank: int, dtype: torch.dtype,
                 device, flat: bool = False) -> None:
        self.name, self.rank, self.sizes = name, rank, list(sizes)
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        r_total = rank * len(self.sizes)
        self.lora_a = torch.zeros(slots, r_total, in_size, dtype=dtype, device=device)
        if flat:  # B stored [out, S*R] (the graph op expands every slot in one matmul); lora_b views it per slot
            self.b_flat = torch.zeros(sum(sizes), slots * r_total, dtype=dtype, device=device)
            self.lora_b = self.b_flat.view(sum(sizes), slots, r_total).permute(1, 0, 2)
        else:  # contiguous per slot: the CPU layouts' bmm / addmm read it without copies
            self.b_flat = None
            self.lora_b = torch.zeros(slots, sum(sizes), r_total, dtype=dtype, device=device)
        self.used: set[int] = set()  # slots whose adapter targets this projection (others hold zeros)
        # tensor parallelism: this rank's rows of each part's B, its columns of A, and whether the delta of a
        # row-parallel layer (partial: this rank's input columns) must be summed over the ranks
        self.b_rows: list[int] | None = None
        self.a_cols: int | None = None
        self.reduce = False
        self.index = 0  # into the static op's per-projection buffers (octavo.lora.static.StaticLoRA.reserve_h)


class LoRAManager:
    """Holds the model's adapter slots and the token -> slot map of the current step.

    Args:
        model: the loaded model (its ``packed_modules_mapping`` names the checkpoint parts of fused layers).
        lora: the ``lora`` settings section (``max_loras``, ``max_lora_rank``, ``max_cpu_loras``, ``lora_dtype``).
        dtype: the model dtype (``lora_dtype="auto"``); device: where slots live.
        graph_tokens: on CUDA, the most tokens a captured graph runs (0: no graphs, e.g. ``enforce_eager``);
            the hooks are then graph-capturable (:mod:`octavo.lora.static`), so build the manager before capture.
        kernels: the platform's LoRA kernels (``Platform.make_lora_kernels()``; the worker passes them), or None:
            the torch ops only (``OCTAVO_LORA_KERNEL=triton|fused`` are then refused).
    """

    def __init__(self, model: torch.nn.Module, lora: Any, dtype: torch.dtype, device: torch.device,
                 graph_tokens: int = 0, kernels: Any = None) -> None:
        from octavo.nn import LinearBase, ParallelLMHead, VocabParallelEmbedding

        self.max_loras, self.max_rank = lora.max_loras, lora.max_lora_rank
        self.max_cpu = lora.max_cpu_loras or lora.max_loras
        self.dtype = dtype if lora.lora_dtype == "auto" else getattr(torch, lora.lora_dtype)
        self.model_dtype, self.device = dtype, device
        kernel = _kernel_choice(device, kernels)
        self.kernels = kernels if kernel != "torch" else None
        self.use_triton = kernel == "triton"  # eager steps
        # auto on CUDA: eager steps of at least this many tokens (prefill chunks) run the SGMV kernels too (their
        # launch cost is paid back there; the torch layouts write [n, out] temporaries several times)
        self.triton_min_tokens = _triton_min_tokens() if kernel == "auto" and torch.device(device).type == "cuda" \
            else 0
        self.static: StaticLoRA | None = None
        if self.kernels is not None and kernel in ("triton", "auto"):
            self.kernels.load_env_config()  # OCTAVO_LORA_SGMV_CONFIG as it is now (benchmarks build several engines)
        if graph_tokens > 0 and _graphs_on(device):
            self.static = StaticLoRA(self.max_loras, graph_tokens, self.dtype, device, self.kernels,
                                     fused_expand=kernel == "fused")
        flat = self.static is not None
        packed = getattr(model, "packed_modules_mapping", {})
        self.projections: dict[str, _Projection] = {}
        self.embeddings: dict[str, _Projection] = {}
        # checkpoint module path -> (octavo module path, shard, shard out size, in size)
        self.targets: dict[str, tuple[str, int, int, int]] = {}
        self.base_weights: dict[str, tuple] = {}  # embeddings: PEFT saves a copy, checked against (rows, shape, row0)
        for name, module in model.named_modules():
            if isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead):
                # PEFT embedding LoRA: A [r, vocab] is looked up by token id, B [hidden, r] expands it
                proj = _Projection(name, [module.embedding_dim], module.num_embeddings, self.max_loras,
                                   self.max_rank, self.dtype, device, flat)
                self.embeddings[name] = proj  # A is kept whole on every rank (ids of any vocab shard)
                self.targets[name] = (name, 0, module.embedding_dim, module.num_embeddings)
                rows = min(module.shard_size, max(0, module.num_embeddings - module.vocab_start))
                self.base_weights[name] = (module.weight[:rows], (module.num_embeddings, module.embedding_dim),
                                           module.vocab_start)
                module.register_forward_hook(self._embedding_hook(proj))
                continue
            if not isinstance(module, LinearBase):
                continue
            proj = _Projection(name, module.output_sizes, module.input_size, self.max_loras, self.max_rank,
                               self.dtype, device, flat)
            proj.index = len(self.projections)
            self.projections[name] = proj
            prefix, _, leaf = name.rpartition(".")
            parts = packed.get(leaf, [leaf]) if len(module.output_sizes) > 1 else [leaf]
            if len(parts) != len(module.output_sizes):
                raise ValueError(f"{name}: packed_modules_mapping lists {parts} for {len(module.output_sizes)} parts")
            full_out, full_in = _shard(proj, module)
            for i, part in enumerate(parts):
                ckpt = f"{prefix}.{part}" if prefix else part
                self.targets[ckpt] = (name, i, full_out[i], full_in)
            module.register_forward_hook(self._hook(proj))
        self.host: OrderedDict[int, tuple[str, dict]] = OrderedDict()  # adapter id -> (path, weights), LRU
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # adapter id -> device slot, LRU
        self.host_slots: torch.Tensor | None = None  # this step's token -> slot on the host (None: no adapter)
        self.plan: LoRAPlan | None = None  # its eager layout, built on the first hook that runs eagerly
        self.active_slots: frozenset[int] = frozenset()
        self.static_ready = False  # the static buffers hold this step (a captured graph may replay it)
        self.token_slots: torch.Tensor | None = None  # [n] on the device, for embedding lookups
        # an embedding's delta is B @ (A looked up by id): expanded through the op with an identity "shrink"
        self.eye = torch.eye(self.max_rank, dtype=self.dtype, device=device).expand(self.max_loras, -1, -1)
        if self.static is not None:  # compile / pick kernels now: never for the first time inside a capture
            self.static.reserve_h(len(self.projections), max((p.lora_a.shape[1] for p in self.projections.values()),
                                                             default=1))
            self._warm_static()

    @property
    def active(self) -> bool:
        """Whether some token of this step runs an adapter."""
        return self.host_slots is not None

    @property
    def graph_ok(self) -> bool:
        """Whether a captured graph may replay this step: no adapter token, or graphs captured with the LoRA
        ops and the static buffers written for this step."""
        return self.host_slots is None or self.static_ready

    def _capturing(self) -> bool:
        return self.static is not None and torch.cuda.is_current_stream_capturing()

    def _step_plan(self) -> LoRAPlan:
        if self.plan is None:  # an eager step: the per-step layout of octavo.lora.ops
            big = 0 < self.triton_min_tokens <= self.host_slots.numel()
            self.plan = plan_tokens(self.host_slots, self.device, self.kernels if self.use_triton or big else None)
            if self.embeddings:
                self.token_slots = self.host_slots.to(self.device, non_blocking=True)
        return self.plan

    def _hook(self, proj: _Projection):
        def hook(module, args, output):
            if self._capturing():  # one graph for every adapter mix: the static op (octavo.lora.static)
                self.static.captured = True
                op = lambda y: self.static.apply(args[0], y, proj.lora_a, proj.lora_b, proj.b_flat,  # noqa: E731
                                                 proj.offsets, proj.index)
            elif self.host_slots is None or proj.used.isdisjoint(self.active_slots):  # no adapter here this step
                return output
            else:
                plan = self._step_plan()
                op = lambda y: lora_shrink_expand(args[0], y, proj.lora_a, proj.lora_b, plan, proj.offsets)  # noqa: E731
            if proj.reduce:  # row-parallel: this rank's input columns give a partial delta, summed over ranks
                return output.add_(tp_all_reduce(op(torch.zeros_like(output))))
            return op(output)
        return hook

    def _embedding_hook(self, proj: _Projection):
        def hook(module, args, output):
            if self._capturing():
                self.static.captured = True
                return self.static.apply_embedding(args[0], output, proj.lora_a, proj.b_flat)
            if self.host_slots is None or proj.used.isdisjoint(self.active_slots):
                return output
            plan = self._step_plan()
            slots = self.token_slots
            h = proj.lora_a[slots.clamp(min=0), :, args[0]]  # [n, R]: column id of each token's slot's A
            if plan.num_base:
                h = h * (slots >= 0).unsqueeze(1).to(h.dtype)
            return lora_shrink_expand(h, output, self.eye, proj.lora_b, plan)
        return hook

    def _warm_static(self) -> None:
        """Run the static op once per projection shape (Triton compiles, cuBLAS picks kernels) before capture."""
        seen = set()
        n = min(self.static.cap, BLOCK_M)
        for proj in self.projections.values():
            key = (proj.lora_a.shape, proj.b_flat.shape, proj.reduce)
            if key in seen:
                continue
            seen.add(key)
            x = torch.zeros(n, proj.lora_a.shape[2], dtype=self.model_dtype, device=self.device)  # the layer's dtype
            y = torch.zeros(n, proj.b_flat.shape[0], dtype=self.model_dtype, device=self.device)
            self.static.apply(x, y, proj.lora_a, proj.lora_b, proj.b_flat, proj.offsets, proj.index)

    # ------------------------------------------------------------------------------------ per step
    def prepare(self, request_ids: list[str], loras: list[LoRARequest | None], query_lens: list[int]
                ) -> dict[str, str]:
        """Put this step's adapters in slots and map every token to its request's slot (-1: base model).

        Returns:
            ``{request id: error}`` for requests whose adapter failed to load (wrong shapes, unreadable
            file): they run without an adapter this step and the engine core fails them with that error.

        Raises:
            ValueError: more distinct adapters than ``max_loras`` (the scheduler never sends that).
        """
        wanted = list(dict.fromkeys(lr.lora_int_id for lr in loras if lr is not None))
        self.plan, self.host_slots, self.active_slots, self.static_ready = None, None, frozenset(), False
        if not wanted:
            if self.static is not None and self.static.captured:  # rows of an earlier mix back to base
                self.static_ready = self.static.write(None, sum(query_lens))
            return {}
        if len(wanted) > self.max_loras:
            raise ValueError(f"a step holds {len(wanted)} distinct LoRA adapters but max_loras={self.max_loras}")
        by_id = {lr.lora_int_id: lr for lr in loras if lr is not None}
        errors: dict[int, str] = {}
        for aid in wanted:
            try:
                self._ensure_slot(by_id[aid], keep=set(wanted))
            except AdapterError as e:
                errors[aid] = str(e)
        slots = [self.slot_of[lr.lora_int_id] if lr is not None and lr.lora_int_id not in errors else -1
                 for lr in loras]
        active = frozenset(s for s in slots if s >= 0)
        if active:
            self.host_slots = torch.repeat_interleave(torch.tensor(slots), torch.tensor(query_lens))
            self.active_slots = active
        if self.static is not None and self.static.captured:
            self.static_ready = self.static.write(self.host_slots, sum(query_lens))
        return {rid: errors[lr.lora_int_id] for rid, lr in zip(request_ids, loras)
                if lr is not None and lr.lora_int_id in errors}

    def clear(self) -> None:
        self.plan, self.host_slots, self.active_slots = None, None, frozenset()

    def _ensure_slot(self, lora: LoRARequest, keep: set[int]) -> int:
        aid = lora.lora_int_id
        if aid in self.slot_of:
            self.slot_of.move_to_end(aid)
            return self.slot_of[aid]
        weights = self._host_weights(lora)
        used = set(self.slot_of.values())
        free = [s for s in range(self.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:  # evict the least recently used adapter that this step does not need
            victim = next(a for a in self.slot_of if a not in keep)
            slot = self.slot_of.pop(victim)
        self._write_slot(slot, weights)
        self.slot_of[aid] = slot
        return slot

    def _host_weights(self, lora: LoRARequest) -> dict:
        aid = lora.lora_int_id
        if aid in self.host and self.host[aid][0] == lora.lora_path:
            self.host.move_to_end(aid)
            return self.host[aid][1]
        _, weights = load_adapter(lora.lora_path, self.max_rank, self.targets, self.base_weights)
        self.host[aid] = (lora.lora_path, weights)
        while len(self.host) > self.max_cpu:
            self.host.popitem(last=False)
        return weights

    def _write_slot(self, slot: int, weights: dict) -> None:
        for proj in [*self.projections.values(), *self.embeddings.values()]:
            proj.lora_a[slot].zero_()
            proj.lora_b[slot].zero_()
            proj.used.discard(slot)
            for shard, a, b in weights.get(proj.name, []):
                proj.used.add(slot)
                r0, o0 = shard * self.max_rank, proj.offsets[shard]
                if proj.b_rows is not None:  # column-parallel: this rank's output rows of the part
                    b = b[proj.b_rows[shard]:proj.b_rows[shard] + proj.sizes[shard]]
                if proj.a_cols is not None:  # row-parallel: this rank's input columns
                    a = a[:, proj.a_cols:proj.a_cols + proj.lora_a.shape[2]]
                r = a.shape[0]
                proj.lora_a[slot, r0:r0 + r].copy_(a)
                proj.lora_b[slot, o0:o0 + b.shape[0], r0:r0 + r].copy_(b)


def _shard(proj: _Projection, module: Any) -> tuple[list[int], int]:
    """Set ``proj``'s tensor-parallel slices for ``module``; returns the full (checkpoint) part sizes and input size.

    Column-parallel layers (q/k/v, gate/up) own rows of each part's output: B is sliced by rows, A is whole;
    KV heads replicated over ranks (``tp > num_kv_heads``) take the rows of their head group. Row-parallel layers
    (o, down) own columns of the input: A is sliced by columns, B is whole, and the partial deltas are summed.
    """
    from octavo.nn import ColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear

    tp, rank = getattr(module, "tp_size", 1), getattr(module, "tp_rank", 0)
    sizes = list(module.output_sizes)
    if tp == 1 or isinstance(module, ReplicatedLinear):  # whole weights on every rank
        return sizes, module.input_size
    if isinstance(module, ColumnParallelLinear) and not module.gather_output:
        if isinstance(module, QKVParallelLinear):
            kv_rank = rank // module.num_kv_head_replicas
            proj.b_rows = [rank * sizes[0], kv_rank * sizes[1], kv_rank * sizes[2]]
        else:
            proj.b_rows = [rank * s for s in sizes]
        return list(module.full_output_sizes), module.input_size
    if isinstance(module, RowParallelLinear) and module.input_is_parallel:
        proj.a_cols = rank * module.input_size
        proj.reduce = module.reduce_results  # else the caller sums the layer's output, delta included
        return sizes, module.input_size * tp
    raise ValueError(f"{proj.name}: LoRA on a {type(module).__name__} under tensor parallelism is not implemented")


def _graphs_on(device) -> bool:
    """Whether a platform captures graphs on ``device`` (CUDA): only then the hooks get static buffers and B the
    flat layout (on CPU the per-step layouts read B per slot; tests force this on to run the graph ops on CPU)."""
    return torch.device(device).type == "cuda"


def _triton_min_tokens() -> int:
    """``OCTAVO_LORA_TRITON_MIN_TOKENS`` (with ``auto`` on CUDA): eager steps of at least this many tokens run the
    Triton SGMV kernels instead of the torch layouts; 0 = never. Default 512: on an H100 (session 5, batch 1, 8B,
    2048-token prefill chunks over 8 adapters) the SGMV kernels took 18.8 ms a step for the LoRA of 32 layers vs 27.9 ms
    for the torch layouts, and the batch-64 mixed run went from 0.67x to 0.77x the base model with k_per_split=128."""
    raw = os.environ.get("OCTAVO_LORA_TRITON_MIN_TOKENS", "512")
    try:
        val = int(raw)
    except ValueError:
        raise ValueError(f"OCTAVO_LORA_TRITON_MIN_TOKENS={raw!r}: expected a whole number of tokens (0 = never)") \
            from None
    if val < 0:
        raise ValueError(f"OCTAVO_LORA_TRITON_MIN_TOKENS={raw!r} must be >= 0")
    return val


def _kernel_choice(device, kernels: Any = None) -> str:
    """``OCTAVO_LORA_KERNEL``: ``auto`` (default), ``torch``, ``triton`` or ``fused``. ``kernels``: the
    platform's LoRA kernels (``Platform.make_lora_kernels()``; CUDA: Triton, plugins/platforms/cuda_lora.py).

    - ``auto``: eager steps run the torch layouts of octavo.lora.ops; CUDA graphs the fixed-grid SGMV kernels
      (octavo.lora.static) where the platform has them, else the dense torch op. On CPU: ``torch``.
    - ``torch``: eager steps the torch layouts, graphs the dense torch op (no device kernels).
    - ``triton`` (CUDA): eager steps and graphs the platform's SGMV kernels.
    - ``fused`` (CUDA): as ``torch``, with the dense op's mask and expand in one kernel of the platform.

    Measured on an H100 (docs/performance.md "LoRA on GPU", Llama-3-8B widths, batch 64, 8 mixed adapters): in
    graphs the SGMV op ran the mixed batch at 0.80x the base model, dense torch 0.64x, fused 0.66x; eager (before
    graphs) the torch layouts ran 1.84x faster than the Triton kernels, whose Python launch cost dominates there.
    """
    choice = os.environ.get("OCTAVO_LORA_KERNEL", "auto")
    if choice not in ("auto", "torch", "triton", "fused"):
        raise ValueError(f"OCTAVO_LORA_KERNEL={choice!r}: use 'auto' (default), 'torch', 'triton' or 'fused' "
                         "(the last two CUDA only)")
    if choice == "torch":
        return choice
    if torch.device(device).type != "cuda":
        if choice == "auto":
            return "torch"
        raise ValueError(f"OCTAVO_LORA_KERNEL={choice} needs a CUDA device")
    if kernels is None:  # the platform has no LoRA kernels (CUDA: Triton missing)
        if choice == "auto":
            return "torch"
        raise ValueError(f"OCTAVO_LORA_KERNEL={choice} needs the platform's LoRA kernels "
                         "(Platform.make_lora_kernels; CUDA: pip install 'octavo[cuda]' for Triton); none here")
    return choice
