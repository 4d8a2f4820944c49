"""The ``cuda`` platform: NVIDIA GPUs through PyTorch's CUDA build.

Owns device discovery without a CUDA context (NVML first, so ``octavo plugins`` and forking executors stay
safe), device properties and memory, the dtypes and capability flags a compute capability implies
(bf16 from sm_80, fp8 from sm_89), and the attention backends to try on NVIDIA hardware. The class
``TorchGpuPlatform`` holds what CUDA and ROCm share; ``octavo.plugins.platforms.rocm`` builds on it.
"""

from __future__ import annotations

import os

from octavo.platform import Availability, ModelHandle, Platform, PlatformCapabilities, PreparedModel


def _visible_env() -> str:
    return f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}"


class TorchGpuPlatform(Platform):
    """What every GPU reached through ``torch.cuda`` shares (NVIDIA CUDA and AMD ROCm/HIP builds).

    Nothing here touches the device in ``__init__`` or ``is_available``; properties are read lazily, which
    initialises the CUDA runtime the first time (after platform selection, never while listing plugins).
    """

    device_type = "cuda"
    distributed_backend = "nccl"
    priority = 100

    # --- discovery -------------------------------------------------------------------------------------
    @classmethod
    def _count_without_context(cls) -> int:
        """Device count without creating a context: NVML/amdsmi when torch offers it, else the runtime."""
        import torch

        if torch.cuda.is_initialized():
            return torch.cuda.device_count()
        counter = getattr(torch.cuda, "_device_count_amdsmi" if torch.version.hip else "_device_count_nvml", None)
        if counter is not None:
            try:
                n = counter()
            except Exception:  # NVML library missing or broken: fall back to the runtime query
                n = -1
            if n >= 0:  # torch's helper applies CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES itself
                return n
        # cudaGetDeviceCount initialises the driver but creates no context.
        return torch.cuda.device_count()

    # --- Platform interface ----------------------------------------------------------------------------
    def device_count(self) -> int:
        return self._count_without_context()

    def device_name(self, index: int = 0) -> str:
        import torch

        return torch.cuda.get_device_name(index)

    def memory_total(self, index: int = 0) -> int:
        import torch

        return int(torch.cuda.get_device_properties(index).total_memory)

    def memory_free(self, index: int = 0) -> int:
        import torch

        free, _total = torch.cuda.mem_get_info(index)
        return int(free)

    def compute_capability(self, index: int = 0) -> tuple[int, int]:
        """``(major, minor)`` of device ``index``."""
        import torch

        return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]

    def multiprocessor_count(self, index: int = 0) -> int:
        """Streaming multiprocessors (CUs on AMD): kernels size split-KV grids from it."""
        import torch

        return int(torch.cuda.get_device_properties(index).multi_processor_count)

    def supports_bf16(self, index: int = 0) -> bool:
        return self.compute_capability(index)[0] >= 8

    def supports_fp8(self, index: int = 0) -> bool:
        return self.compute_capability(index) >= (8, 9)

    def supported_dtypes(self) -> list[str]:
        dtypes = ["float32", "float16"]
        if self.device_count() > 0 and self.supports_bf16():
            dtypes.insert(1, "bfloat16")
        return dtypes

    def default_dtype(self) -> str:
        # bf16 has fp32's range, so checkpoints stored in fp32 or bf16 run without overflow; fp16 on old cards.
        if self.device_count() > 0 and not self.supports_bf16():
            return "float16"
        return "bfloat16"

    def prepare_model(self, handle: ModelHandle) -> PreparedModel:
        """Fused small-op kernels, then CUDA graphs for decode batches (see ``cuda_graphs``)."""
        from octavo.plugins.platforms.cuda_graphs import prepare_gpu_model

        return prepare_gpu_model(handle, graphs=self.capabilities().graphs)

    def capabilities(self) -> PlatformCapabilities:
        import torch

        fp8 = self.device_count() > 0 and self.supports_fp8()
        extra = {}
        if self.device_count() > 0:
            extra = {"compute_capability": self.compute_capability(), "multiprocessor_count":
                     self.multiprocessor_count(), "nccl": torch.distributed.is_nccl_available()}
        return PlatformCapabilities(graphs=True, fp8=fp8, pinned_memory=True, memory_profiling=True, extra=extra)

    def make_tp_all_reduce(self, group, device, max_bytes: int):
        """The one-shot small-message all-reduce for ``group`` (``plugins/platforms/cuda_allreduce.py``;
        ``OCTAVO_TP_ALLREDUCE=custom``); collective: every rank of ``group`` calls it at once."""
        from octavo.plugins.platforms.cuda_allreduce import OneShotAllReduce

        return OneShotAllReduce(group, device, max_bytes)

    def install_shipped_kernels(self) -> int | None:
        """The Triton cache entries shipped in ``plugins/platforms/kernel_caches/`` for the installed Triton
        (``plugins/platforms/cuda_kernel_cache.py``; ``OCTAVO_SHIPPED_KERNELS=0`` skips them)."""
        from octavo.plugins.platforms.cuda_kernel_cache import seed_triton_cache

        return seed_triton_cache()

    def make_grammar_mask_apply(self):
        """One Triton launch per step (``plugins/platforms/cuda_grammar_mask.py``), or None without Triton."""
        try:
            from octavo.plugins.platforms.cuda_grammar_mask import apply_bitmask_
        except ImportError:
            return None
        return apply_bitmask_

    def make_greedy_argmax(self):
        """All-greedy batches of up to 16 rows in two Triton launches (``cuda_argmax.greedy_argmax``: torch.argmax's
        answers) when ``OCTAVO_CUDA_GREEDY_ARGMAX=1``; None (torch.argmax) otherwise or without Triton."""
        try:
            from octavo.plugins.platforms.cuda_argmax import make_greedy_argmax
        except ImportError:
            return None
        return make_greedy_argmax()

    def make_fused_sampler(self):
        """One Triton pass per step (``plugins/platforms/cuda_sampler.py``), or None without Triton."""
        try:
            from octavo.plugins.platforms.cuda_sampler import sample_rows
        except ImportError:
            return None
        return sample_rows

    def make_lora_kernels(self):
        """The Triton SGMV LoRA kernels (``plugins/platforms/cuda_lora.py``, the module itself), or None without
        Triton."""
        try:
            from octavo.plugins.platforms import cuda_lora
        except ImportError:
            return None
        return cuda_lora

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def set_device(self, index: int) -> None:
        import torch

        torch.cuda.set_device(index)

    def empty_cache(self) -> None:
        """Return cached, unused allocator blocks to the driver (before measuring free memory)."""
        import torch

        torch.cuda.empty_cache()

    def peak_memory_allocated(self, index: int = 0) -> int:
        """Peak bytes held by PyTorch's allocator since the last reset (the profiling pass reads it)."""
        import torch

        return int(torch.cuda.max_memory_allocated(index))

    def memory_reserved(self, index: int = 0) -> int:
        """Bytes PyTorch's allocator holds from the device (tensors + its cache); the rest of the used memory
        is outside torch (context, kernels): the KV sizing pass logs both (core/profiling.py)."""
        import torch

        return int(torch.cuda.memory_reserved(index))

    def reset_peak_memory_stats(self, index: int = 0) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(index)


class CudaPlatform(TorchGpuPlatform):
    """NVIDIA GPUs (``device="cuda"``).

    Available when PyTorch was built with CUDA (not HIP) and at least one device is visible. bf16 is the
    default dtype from Ampere (sm_80) on, fp16 before; fp8 capability from Ada/Hopper (sm_89+).
    """

    name = "cuda"

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import torch
        except ImportError as e:  # pragma: no cover - torch is a hard dependency
            return Availability(False, f"torch is not importable: {e}")
        if torch.version.hip is not None:
            return Availability(False, "this PyTorch is a ROCm (HIP) build; use device='rocm'")
        if torch.version.cuda is None:
            return Availability(False, f"PyTorch {torch.__version__} was built without CUDA; install a CUDA "
                                       "build of torch (https://pytorch.org/get-started/locally/)")
        try:
            n = cls._count_without_context()
        except Exception as e:
            return Availability(False, f"CUDA device query failed: {e}")
        if n <= 0:
            return Availability(False, f"no NVIDIA GPU visible (driver missing, or {_visible_env()})")
        return Availability(True)
