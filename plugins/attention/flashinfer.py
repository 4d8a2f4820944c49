"""The ``flashinfer`` attention backend: FlashInfer's paged prefill kernel for every step (extra ``cuda``).

Owns the backend class and its per-step planning. One ``BatchPrefillWithPagedKVCacheWrapper`` (FlashAttention-2
template, ``backend="fa2"``) serves prefill, chunks over cached prefixes and decode alike: its causal mask is
aligned to the end of each request's context, which is exactly octavo's "new tokens sit after the cached
ones". The cache keeps the default layout ``[2, num_blocks, block_size, kv_heads, head]`` and is handed over
as a ``(keys, values)`` pair of NHD page tensors; new K/V are written by the ``triton`` backend's KV-write
kernel first.

Planning is host work (FlashInfer's scheduler reads the page tables on the CPU), so it runs once per step
and per distinct layer shape, lazily in the first layer's ``forward``; wrappers are cached per device and
shape across steps. This makes the backend *eager only*: its metadata is not graph-safe, so with it the
engine runs decode steps without CUDA graphs (``octavo.plugins.platforms.cuda_graphs`` detects this). That is why the
``cuda`` platform prefers ``triton`` first.

FlashInfer JIT-compiles each kernel variant with nvcc on first use (tens of seconds); set
``FLASHINFER_WORKSPACE_BASE`` to keep the cache (``<base>/.cache/flashinfer``) between runs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from octavo import AttentionBackend
from octavo.attention import AttentionLayout
from octavo.platform import Availability

WORKSPACE_BYTES = 128 << 20
SUPPORTED_HEAD_SIZES = (64, 128, 256)


@dataclass
class FlashInferMetadata:
    """One step's page tables: host copies for planning, device copies for the KV write."""

    qo_indptr: Any  # int32 [num_reqs + 1], host
    kv_indptr: Any  # int32 [num_reqs + 1], host
    kv_indices: Any  # int32 [total pages], host
    kv_last_page_len: Any  # int32 [num_reqs], host
    slot_mapping: Any  # int64 [num_tokens], device
    block_size: int
    num_tokens: int
    planned: dict = field(default_factory=dict, repr=False)  # layer shape -> planned wrapper, this step


_WORKSPACES: dict = {}
_WRAPPERS: dict = {}


class FlashInferAttentionBackend(AttentionBackend):
    """Paged attention through FlashInfer (see the module docstring)."""

    name = "flashinfer"
    platform_priority = {"cuda": 100}

    @classmethod
    def is_available(cls) -> Availability:
        if importlib.util.find_spec("flashinfer") is None:
            return Availability(False, "flashinfer is not installed; pip install 'octavo[cuda]' "
                                       "(flashinfer-python)")
        import torch

        if torch.version.cuda is None:
            return Availability(False, "flashinfer needs a CUDA build of PyTorch")
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        if shutil.which("nvcc") is None and not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
            return Availability(False, "flashinfer JIT-compiles its kernels and needs nvcc (set CUDA_HOME)")
        return Availability(True)

    @classmethod
    def supports(cls, *, device_type, dtype, head_size, sliding_window=None, logits_soft_cap=None,
                 block_size=16) -> Availability:
        import torch

        if device_type != "cuda":
            return Availability(False, f"flashinfer runs on NVIDIA GPUs, not {device_type!r}")
        if dtype not in (torch.float16, torch.bfloat16):
            return Availability(False, f"flashinfer computes in float16/bfloat16, not {dtype}")
        if head_size not in SUPPORTED_HEAD_SIZES:
            return Availability(False, f"head_size {head_size} not in flashinfer's {SUPPORTED_HEAD_SIZES}")
        return Availability(True)

    @classmethod
    def supports_kv_cache_dtype(cls, name: str, device) -> Availability:
        """Refused: FlashInfer's API takes an fp8 paged cache (``kv_data_type`` at plan, ``k_scale``/``v_scale``
        at run), but this backend's fa2 prefill path with an fp8 cache has not been built or checked on a GPU."""
        return Availability(False, "the flashinfer backend does not read an fp8 KV cache in octavo yet; use "
                                   "attention_backend=triton with kv_cache_dtype=" + repr(name))

    @classmethod
    def build_metadata(cls, layout: AttentionLayout, device) -> FlashInferMetadata:
        import torch

        bs = layout.block_size
        seq_lens = layout.seq_lens.to(torch.int32)
        pages = (seq_lens + bs - 1) // bs
        kv_indptr = torch.zeros(layout.num_reqs + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(pages, 0)
        width = layout.block_tables.shape[1]
        used = torch.arange(width)[None, :] < pages[:, None]  # [num_reqs, width]
        return FlashInferMetadata(
            qo_indptr=layout.query_start_loc.to(torch.int32).cpu(),
            kv_indptr=kv_indptr,
            kv_indices=layout.block_tables.to(torch.int32)[used].contiguous(),
            kv_last_page_len=(seq_lens - (pages - 1) * bs).to(torch.int32),
            slot_mapping=layout.slot_mapping.to(device=device, dtype=torch.int64, non_blocking=True),
            block_size=bs, num_tokens=layout.num_tokens)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        from octavo.plugins.attention.triton import TritonAttentionBackend

        self._kv_writer = TritonAttentionBackend(**kwargs)  # reuse its KV-write kernel
        self.window_left = (self.sliding_window - 1) if self.sliding_window else -1

    def _wrapper(self, md: FlashInferMetadata, query, kv_cache):
        import flashinfer
        import torch

        key = (query.device, self.num_heads, self.num_kv_heads, self.head_size, self.window_left,
               self.logits_soft_cap, self.scale, query.dtype, kv_cache.dtype, md.block_size)
        wrapper = md.planned.get(key)
        if wrapper is not None:
            return wrapper
        if query.device not in _WORKSPACES:
            _WORKSPACES[query.device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=query.device)
        wrapper = _WRAPPERS.get(key)
        if wrapper is None:
            wrapper = _WRAPPERS[key] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                _WORKSPACES[query.device], "NHD", backend="fa2")
        wrapper.plan(md.qo_indptr, md.kv_indptr, md.kv_indices, md.kv_last_page_len, self.num_heads,
                     self.num_kv_heads, self.head_size, md.block_size, causal=True, sm_scale=self.scale,
                     window_left=self.window_left, logits_soft_cap=self.logits_soft_cap or None,
                     q_data_type=query.dtype, kv_data_type=kv_cache.dtype)
        md.planned[key] = wrapper
        return wrapper

    def forward(self, query, key, value, kv_cache, metadata: FlashInferMetadata):
        import torch

        md = metadata
        self._kv_writer.write_kv(key, value, kv_cache, md.slot_mapping)
        if md.num_tokens == 0:
            return torch.empty_like(query)
        query = query.contiguous()  # q/k/v arrive as strided views of the fused qkv projection
        wrapper = self._wrapper(md, query, kv_cache)
        return wrapper.run(query, (kv_cache[0], kv_cache[1]))
