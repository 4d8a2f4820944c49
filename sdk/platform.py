"""The ``Platform`` interface: what the engine may ask of a kind of hardware.

A platform plugin registers a subclass under a name (``cpu``, ``cuda``, ...). The core asks for
capabilities, never for identity: there is no ``is_cuda()`` anywhere in ``octavo.core``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


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


class Platform(ABC):
    """A kind of hardware octavo can run on.

    Subclasses are instantiated with no arguments; the constructor must be cheap and must not create a
    device context (``octavo plugins`` builds every platform to report availability).
    """

    #: registry name, e.g. ``"cpu"``.
    name: ClassVar[str]
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
        """Attention backend names to try, best first; the reference backend is always the last resort."""
        return ["torch_sdpa"]

    def prepare_worker(self, worker: Any) -> None:
        """Device-specific set-up of a loaded worker, once, after its KV cache is bound and before the first
        step: e.g. swapping fused kernels into the model or capturing graphs for decode batches (which then
        replace the eager forward through ``worker.runner.graph_runner``). Runs in the worker's process.
        Default: nothing."""

    def synchronize(self) -> None:
        """Wait for queued device work (used by benchmarks and the memory profiler)."""

    def set_device(self, index: int) -> None:
        """Make device ``index`` current for this process (one worker per device)."""

    def __repr__(self) -> str:
        return f"<Platform {self.name}>"
