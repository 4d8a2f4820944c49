"""The ``Platform`` interface: what the engine may ask of a kind of hardware, and the small typed handle a
platform gets to prepare a loaded model.

A platform plugin registers a subclass under a name (``cpu``, ``cuda``, ...). The core asks for
capabilities, never for identity: there is no ``is_cuda()`` anywhere in ``octavo.core``. Device-specific
set-up of a loaded model goes through :meth:`Platform.prepare_model`::

    worker (core): load model, pick backend, allocate KV cache
        -> platform.prepare_model(ModelHandle(model, device, dtype, attn_backend, block_size, limits...))
        <- PreparedModel(step_runner=...)   core installs it: the runner asks it first every step
                                            (``step_runner.maybe_run(inputs)``; ``None`` = run eagerly)

The plugin sees only the handle's fields and returns data; it never reads or writes a core object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from octavo.attention import AttentionBackend, AttentionLayout


@dataclass(frozen=True)
class Availability:
    """Whether a platform or backend can run here, and why not when it cannot."""

    available: bool
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.available


@dataclass(frozen=True)
class PlatformCapabilities:
    """Capability flags the core and backends consult instead of asking which vendor this is.

    Attributes:
        graphs: the device can capture and replay whole decode steps (CUDA graphs and the like).
        fp8: native fp8 matmul.
        pinned_memory: host memory can be pinned for asynchronous copies.
        memory_profiling: free memory can be measured after a profiling forward pass, so the KV cache
            is sized from ``gpu_memory_utilization``; without it, from ``kv_cache_memory_bytes``.
    """

    graphs: bool = False
    fp8: bool = False
    pinned_memory: bool = False
    memory_profiling: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class StepInputs(Protocol):
    """The read-only view of one step's flat inputs that a :class:`StepRunner` receives."""

    input_ids: torch.Tensor  # [num_tokens] on the device
    positions: torch.Tensor  # [num_tokens] on the device
    query_start_loc: torch.Tensor  # [num_reqs + 1] on the device
    layout: AttentionLayout  # host tensors: seq lens, block tables, slot mapping


class StepRunner(Protocol):
    """Something that can run the model's forward for some steps faster than eager (captured graphs, a
    compiled forward). The model runner asks it first on every step.

    ``holds_addresses`` (optional attribute, default True): the runner keeps the weights' or KV cache's device
    addresses between steps (captured graphs), so sleep mode, which moves them, is refused. A runner that finds
    its tensors again at every step sets it False."""

    def maybe_run(self, inputs: StepInputs) -> torch.Tensor | None:
        """The hidden states ``[num_tokens, hidden]`` for this step, or ``None`` to let the eager forward run."""


@dataclass(frozen=True)
class ModelHandle:
    """What a platform may see of a loaded model, once, when it prepares it (:meth:`Platform.prepare_model`).

    Attributes:
        model: the loaded ``torch.nn.Module`` (built from ``octavo.nn`` layers), weights on ``device``.
        device: the worker's ``torch.device``.
        dtype: the compute dtype.
        attn_backend: the chosen :class:`~octavo.AttentionBackend` class, ``None`` for a model without
            paged attention (an encoder).
        block_size: tokens per KV block.
        max_model_len: the longest sequence a request may reach.
        max_num_seqs: the most requests in one step (the largest decode batch).
        max_num_batched_tokens: the step's token budget.
        enforce_eager: the user asked for no graphs/compilation (``--enforce-eager``); honour it.
        spec_verify_shapes: ``(requests, tokens per request)`` of the speculative-decoding verify steps worth
            capturing (empty without speculation); a platform may ignore it (those steps then run eagerly).
    """

    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    attn_backend: type[AttentionBackend] | None
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    spec_verify_shapes: tuple = ()


@dataclass
class PreparedModel:
    """What :meth:`Platform.prepare_model` hands back for the core to install.

    Attributes:
        step_runner: asked first on every step (see :class:`StepRunner`); ``None`` keeps the eager forward.
        notes: short facts for the start-up log (``{"graph_sizes": [1, 2, 4], "fused": {...}}``).
    """

    step_runner: StepRunner | None = None
    notes: dict[str, Any] = field(default_factory=dict)


class Platform(ABC):
    """A kind of hardware octavo can run on.

    Subclasses are instantiated with no arguments; the constructor must be cheap and must not create a
    device context (``octavo plugins`` builds every platform to report availability).
    """

    #: registry name, e.g. ``"cpu"``.
    name: ClassVar[str]
    #: rank in default platform selection: the available platform with the highest priority wins (``cpu``,
    #: always available, is -100; accelerators are 100). An ``octavo_select_platform`` hook or ``--device``
    #: overrides it. Ties are broken by name.
    priority: ClassVar[int] = 0
    #: the ``torch.device`` type string, e.g. ``"cpu"`` or ``"cuda"``.
    device_type: ClassVar[str]
    #: the ``torch.distributed`` backend for collectives on this platform (``"gloo"``, ``"nccl"``, ...).
    distributed_backend: ClassVar[str]

    @classmethod
    @abstractmethod
    def is_available(cls) -> Availability:
        """Whether this platform can run here. Cheap: no device context, no kernel compilation."""

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices of this kind visible to this process."""

    @abstractmethod
    def device_name(self, index: int = 0) -> str:
        """A human-readable name of one device (for logs and benchmark records)."""

    @abstractmethod
    def memory_total(self, index: int = 0) -> int:
        """Total memory of one device, in bytes."""

    @abstractmethod
    def memory_free(self, index: int = 0) -> int:
        """Currently free memory of one device, in bytes."""

    @abstractmethod
    def supported_dtypes(self) -> list[str]:
        """Dtype names (``"float32"``, ``"bfloat16"``, ``"float16"``) this device computes natively."""

    def default_dtype(self) -> str:
        """The dtype ``dtype="auto"`` resolves to when the checkpoint does not force one."""
        return "float32"

    def capabilities(self) -> PlatformCapabilities:
        """Capability flags; see :class:`PlatformCapabilities`."""
        return PlatformCapabilities()

    def preferred_attention_backends(self) -> list[str]:
        """Attention backend names this platform wants tried first, best first. Default: none -- backends
        declare the platforms they suit themselves (``AttentionBackend.platform_priority``), and the
        reference backend ``torch_sdpa`` is always the last resort."""
        return []

    def prepare_model(self, handle: ModelHandle) -> PreparedModel | None:
        """Device-specific set-up of a loaded model, once, after its KV cache is bound and before the first
        step (fused kernels, captured graphs, a compiled forward). Runs in the worker's process. Return
        what the core should install, or ``None`` for nothing. Default: nothing."""
        return None

    def install_shipped_kernels(self) -> int | None:
        """Put the kernels this platform's package ships precompiled where this process's compiler looks them
        up (e.g. Triton's cache), so a fresh machine does not compile them at start. Runs once per worker
        process, after :meth:`set_device` and before the model loads; must be safe to repeat and must never
        overwrite what the user's cache holds. Returns the entries added, ``None``: nothing to do. Default:
        nothing."""
        return None

    def make_greedy_argmax(self) -> Callable[..., Any] | None:
        """This device's own greedy choice for all-greedy batches, or ``None`` (``torch.argmax``). Asked once per
        worker. The callable is ``argmax(logits) -> [R] int64`` over float ``[R, V]`` logits, exactly
        ``logits.argmax(dim=-1)``: the first index of the largest value, a NaN counting as the largest. The core
        calls it only for all-greedy batches without logit processors (logprobs come from the raw logits apart).
        Default: none."""
        return None

    def make_grammar_mask_apply(self) -> Callable[..., Any] | None:
        """This device's own way to apply structured outputs' token masks, or ``None`` (the core's torch
        byte-table add then runs: same result). Asked once per worker, after the platform was selected.

        The callable is ``apply(logits, packed, rows) -> logits``, in place: ``logits[rows[j], t] = -inf``
        wherever bit ``t % 32`` of word ``t // 32`` of ``packed[j]`` is clear. ``logits`` [R, V] (last dim
        contiguous) and ``packed`` int32 [n, ceil(V/32)] (contiguous) are on the device; ``rows`` is an int32
        device tensor [n], or ``None`` when packed row j is logits row j. Default: none."""
        return None

    def make_fused_sampler(self) -> Callable[..., Any] | None:
        """This device's own one-pass sampler, or ``None`` (the core's torch sampler then runs everywhere).
        Asked once per worker. The core still routes (all-greedy batches, top-p without a bounded top-k and
        ``OCTAVO_FUSED_SAMPLER=0`` keep the torch path) and applies the logit processors first.

        The callable is ``sample(logits, temperature, generators, thresholds) -> [R] int64``: ``logits`` [R, V],
        ``temperature`` [R] (``<= 0``: greedy, exactly ``argmax``, lowest index on ties), ``generators``
        ``{row: torch.Generator}`` for seeded rows (a seeded row's draw depends only on its generator, which the
        sampler advances, never on the rest of the batch), ``thresholds`` [R] fp32 or ``None``: random rows draw
        from ``softmax(logits / temperature)`` restricted to the logits ``>= thresholds[row]``. Default: none."""
        return None

    def make_lora_kernels(self) -> Any | None:
        """This device's own LoRA shrink/expand kernels, or ``None`` (``octavo.lora`` then runs its torch ops:
        same results). Asked once per worker with LoRA on; the manager uses them in eager steps
        (``OCTAVO_LORA_KERNEL=triton``, or prefill chunks) and in captured graphs.

        The object (CUDA: the module plugins/platforms/cuda_lora.py) has ``BLOCK_M`` (16: tokens per block),
        ``CONFIG`` (launch settings, key ``static_h``: graphs keep one zeroed fp32 shrink buffer per projection),
        ``load_env_config()``, ``plan_blocks(rows, segments, device) -> plan``, ``BlockPlan(rows, blk_slot,
        blk_start, blk_end, num_blocks, num_rows)``, ``lora_shrink_expand_triton(x, y, lora_a, lora_b, plan,
        parts=None, h=None) -> y`` (``y[t] += B[slot] @ A[slot] @ x[t]`` in place for the plan's tokens) and
        ``masked_expand(h, mask, b_flat, y) -> y`` (``y += (h * mask per slot) @ b_flat^T``). Default: none."""
        return None

    def synchronize(self) -> None:
        """Wait for queued device work (used by benchmarks and the memory profiler)."""

    def set_device(self, index: int) -> None:
        """Make device ``index`` current for this process (one worker per device)."""

    def __repr__(self) -> str:
        return f"<Platform {self.name}>"
