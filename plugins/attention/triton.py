"""The ``triton`` attention backend: paged attention in Triton for NVIDIA (and, untested, AMD) GPUs.

Owns the backend class, its per-step metadata and the launch heuristics (tile shapes, split-KV for decode
of few requests over long contexts); the kernels live in ``_triton_kernels``. Handles prefill, chunked
prefill over cached prefix blocks and decode in one kernel, GQA/MQA, fp16/bf16/fp32, any power-of-two
block size, head sizes up to 256, sliding windows and logit soft-capping. The cache keeps the default
layout ``[2, num_blocks, block_size, num_kv_heads, head_size]``. ``forward`` never syncs with the host, so
decode steps can be captured in CUDA graphs (``octavo.plugins.platforms.cuda_graphs``); metadata tensors are built with
``Tensor.to`` so a graph runner that hands in static device tensors gets them back unchanged.

An fp8 cache (``kv_cache_dtype="fp8"``/``"fp8_e5m2"``, ``octavo.nn.kv_quant``) is written quantized by the
KV-write kernel and read as fp8 by the attention kernel, with the layer's ``k_scale``/``v_scale`` (Python
floats set once by the worker, so they are constants in a captured graph) applied inside the kernels.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from octavo import AttentionBackend
from octavo.attention import AttentionLayout
from octavo.platform import Availability


@dataclass
class TritonAttentionMetadata:
    """Device-side view of one step's :class:`AttentionLayout` (shared by every layer of the step)."""

    query_start_loc: Any  # int32 [num_reqs + 1]
    seq_lens: Any  # int32 [num_reqs]
    block_tables: Any  # int32 [num_reqs, max_blocks]
    slot_mapping: Any  # int64 [num_tokens]; < 0 means "do not write" (padding)
    block_size: int
    max_query_len: int
    max_seq_len: int  # an upper bound is enough (graph capture passes max_model_len)
    num_reqs: int
    num_tokens: int
    num_decodes: int = 0  # leading requests with one new token (AttentionLayout.num_decode_reqs)
    #: split-KV scratch buffers, allocated by the first layer of the step and reused by the others
    scratch: dict = field(default_factory=dict, repr=False)


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


_NUM_SMS: dict[int, int] = {}


def _split_rule_from_env() -> tuple[int, int]:
    """``OCTAVO_TRITON_SPLIT_KV=below,target`` (integers >= 1): decode steps whose requests x KV heads are at most
    ``below`` x SMs split each context over programs, aiming at ``target`` x SMs programs (at least 2 splits, at
    most 16). Unset: ``DEFAULT_SPLIT_RULE``."""
    raw = os.environ.get("OCTAVO_TRITON_SPLIT_KV", "").strip()
    if not raw:
        return DEFAULT_SPLIT_RULE
    parts = raw.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and 1 <= int(p) <= 64 for p in parts):
        raise ValueError(f"OCTAVO_TRITON_SPLIT_KV={raw!r}: expected 'below,target', two integers in 1..64 "
                         "(programs per SM: split below, aim at)")
    return int(parts[0]), int(parts[1])


#: (below, target) programs per SM of the split-KV decode rule (``_num_splits``); (1, 2) is the rule since session 1:
#: split when requests x KV heads leave SMs idle, aiming at two programs per SM
DEFAULT_SPLIT_RULE = (1, 2)
#: the rule in use (read once; benchmarks switch it at run time and recapture their graphs)
SPLIT_RULE = _split_rule_from_env()
#: the attention launches (K/V write, decode / general kernel, split merge) use programmatic dependent launch when
#: the platform's PDL is on (plugins/platforms/cuda_pdl.py, ``OCTAVO_PDL``); ``OCTAVO_TRITON_PDL=0`` keeps them
#: plain (A/B runs); read at each launch, so a graph captured after a switch uses it
ATTN_PDL = None  # None: OCTAVO_TRITON_PDL, read on first use


def _pdl_opts() -> dict:
    """Launch options of one attention kernel: ``{"PDL": ..., "launch_pdl": ...}`` or ``{}`` (switched off)."""
    global ATTN_PDL
    if ATTN_PDL is None:
        from octavo.env_flags import env_switch

        ATTN_PDL = env_switch("OCTAVO_TRITON_PDL", True)
    if not ATTN_PDL:
        return {}
    from octavo.plugins.platforms.cuda_pdl import launch_opts

    return launch_opts()


def _num_sms(device) -> int:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _NUM_SMS:
        _NUM_SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _NUM_SMS[index]


class TritonAttentionBackend(AttentionBackend):
    """Paged attention with Triton kernels (see the module docstring for what it covers)."""

    name = "triton"
    # above flashinfer on cuda: this backend's metadata is graph-safe, so decode runs in CUDA graphs; flashinfer
    # plans on the host each step (eager only) and JIT-compiles for tens of seconds on first use (docs/gpu.md).
    platform_priority = {"cuda": 200, "rocm": 200}

    @classmethod
    def is_available(cls) -> Availability:
        try:
            import triton  # noqa: F401
        except ImportError:
            return Availability(False, "triton is not installed; pip install 'octavo[cuda]' (or triton)")
        import torch

        if os.environ.get("TRITON_INTERPRET") == "1":
            return Availability(True)  # CPU interpreter: slow, for kernel tests only
        if torch.version.cuda is None and torch.version.hip is None:
            return Availability(False, f"PyTorch {torch.__version__} has no GPU support (CUDA or ROCm)")
        return Availability(True)

    @classmethod
    def supports(cls, *, device_type, dtype, head_size, sliding_window=None, logits_soft_cap=None,
                 block_size=16) -> Availability:
        import torch

        if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            return Availability(False, f"triton kernels run on GPUs (device_type 'cuda'), not {device_type!r}")
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            return Availability(False, f"dtype {dtype} not supported; use float16, bfloat16 or float32")
        if not 1 <= head_size <= 256:
            return Availability(False, f"head_size {head_size} not supported (1..256)")
        if block_size & (block_size - 1):
            return Availability(False, f"block_size {block_size} is not a power of two")
        return Availability(True)

    @classmethod
    def supports_kv_cache_dtype(cls, name: str, device) -> Availability:
        """fp8 caches on NVIDIA GPUs of compute capability >= 8.9 (Triton's fp8 conversions; checked on H100)
        and in the CPU interpreter (tests)."""
        import torch

        from octavo.nn.kv_quant import FP8_KV_DTYPES

        if name not in FP8_KV_DTYPES:
            return Availability(False, f"unknown fp8 KV-cache dtype {name!r}")
        if getattr(device, "type", device) != "cuda":
            return Availability(os.environ.get("TRITON_INTERPRET") == "1", "triton runs on GPUs")
        if torch.version.hip is not None:
            return Availability(False, "fp8 KV cache with triton is untested on ROCm (its fp8 types differ); use "
                                       "kv_cache_dtype=auto")
        cc = torch.cuda.get_device_capability(device)
        if cc < (8, 9):
            return Availability(False, f"compute capability {cc[0]}.{cc[1]} < 8.9: Triton's fp8 conversions need "
                                       "Ada/Hopper or newer; use kv_cache_dtype=auto")
        return Availability(True)

    @classmethod
    def build_metadata(cls, layout: AttentionLayout, device) -> TritonAttentionMetadata:
        import torch

        def dev(t, dtype):
            return t.to(device=device, dtype=dtype, non_blocking=True)

        return TritonAttentionMetadata(
            query_start_loc=dev(layout.query_start_loc, torch.int32),
            seq_lens=dev(layout.seq_lens, torch.int32),
            block_tables=dev(layout.block_tables, torch.int32),
            slot_mapping=dev(layout.slot_mapping, torch.int64),
            block_size=layout.block_size,
            max_query_len=int(layout.max_query_len),
            max_seq_len=int(layout.max_seq_len),
            num_reqs=layout.num_reqs,
            num_tokens=layout.num_tokens,
            num_decodes=int(getattr(layout, "num_decode_reqs", 0) or 0),
        )

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        self.group = self.num_heads // self.num_kv_heads
        self.group_p = _next_pow2(self.group)
        self.head_dp = max(16, _next_pow2(self.head_size))
        self.window = self.sliding_window or 0
        self.soft_cap = float(self.logits_soft_cap or 0.0)
        self.k_scale = self.v_scale = 1.0  # per-layer fp8 scales; the worker sets checkpoint values
        from octavo.plugins.attention._triton_decode import decode_kernel_enabled

        self.decode_kernel = decode_kernel_enabled()  # decode rows without split-KV (_triton_decode.py); None: table
        if self.decode_kernel is False and os.environ.get("OCTAVO_TRITON_DECODE_LAUNCH", "").strip():
            raise ValueError("OCTAVO_TRITON_DECODE_LAUNCH is set but OCTAVO_TRITON_DECODE_KERNEL=0 turns the decode "
                             "kernel off; unset one of them")
        self._launches: dict = {}  # cache dtype -> DecodeLaunch | None (_triton_decode_table.py)

    # --- heuristics ------------------------------------------------------------------------------------
    def _num_splits(self, md: TritonAttentionMetadata, block_n: int, device) -> int:
        """Split the context across programs only when requests x KV heads leave the GPU mostly idle
        (``SPLIT_RULE``: at most ``below`` programs per SM; then aim at ``target`` per SM)."""
        if md.max_query_len != 1 or device.type != "cuda":
            return 1
        below, target = SPLIT_RULE
        programs = max(1, md.num_reqs * self.num_kv_heads)
        sms = _num_sms(device)
        if programs > below * sms:
            return 1
        want = max(2, (target * sms) // programs)
        useful = max(1, math.ceil(md.max_seq_len / (2 * block_n)))  # at least two key tiles per split
        splits = min(want, useful, 16)
        return 1 << (splits.bit_length() - 1)  # power of two: the merge kernel's arange needs one

    def _tiles(self, md: TritonAttentionMetadata) -> tuple[int, int, int]:
        """(BLOCK_Q, BLOCK_M, BLOCK_N): rows = tokens x GQA group, padded to the 16 rows tl.dot needs. Steps whose
        longest query has more than 8 tokens (prefill chunks) all take the full tile: BLOCK_Q is a build-time
        constant, and a chunked prefill's tail (any length) made a new build inside timed runs (session 7);
        2-8 tokens (speculative verification, captured per size) keep a tile that fits them."""
        rows = 64 if self.head_dp <= 128 else 32
        q = md.max_query_len if md.max_query_len <= 8 else rows
        block_q = max(1, min(rows // self.group_p, _next_pow2(q)))
        block_m = max(16, block_q * self.group_p)
        block_n = 64 if self.head_dp <= 128 else 32
        return block_q, block_m, block_n

    def _decode_launch(self, cache_dtype, fp8: bool):
        """The decode kernel's launch for this layer's shape and cache, or None for the general kernel:
        ``OCTAVO_TRITON_DECODE_KERNEL`` 0/1 forces it off/on, unset follows ``_triton_decode_table``."""
        if cache_dtype not in self._launches:
            import torch

            from octavo.plugins.attention._triton_decode_table import decode_launch

            kind = "fp8" if fp8 else "16bit" if cache_dtype in (torch.bfloat16, torch.float16) else "fp32"
            launch = None
            if self.decode_kernel is not False:
                launch = decode_launch(kind, self.group, self.head_dp, forced=bool(self.decode_kernel))
            self._launches[cache_dtype] = launch
        return self._launches[cache_dtype]

    def _longest_first(self, md: TritonAttentionMetadata, seq_lens, n: int):
        """The decode rows' order, longest context first, computed once per step: by the first layer that
        runs with this metadata (in a CUDA graph that layer's launch is captured and recomputes it every replay;
        the others read its buffer). Any order gives the same output, so a stale one would only be slower."""
        from octavo.plugins.attention._triton_decode import longest_first

        owner = md.scratch.setdefault(("order_owner", n), id(self))
        buf = md.scratch.get(("order", n))
        if owner == id(self) or buf is None:
            buf = md.scratch[("order", n)] = longest_first(seq_lens, n, out=buf)
        return buf

    def _chunk_scratch(self, md: TritonAttentionMetadata, query, chunk: int):
        """The chunked decode launch's partial buffers, allocated by the step's first layer, shared by all."""
        from octavo.plugins.attention._triton_decode import chunk_scratch, chunk_splits

        splits = chunk_splits(md.max_seq_len, chunk)
        if splits == 1:
            return None
        key = ("chunks", query.shape[0], self.num_heads, splits, self.head_dp)
        if key not in md.scratch:
            md.scratch[key] = chunk_scratch(query.shape[0], self.num_heads, splits, self.head_dp, query.device)
        return md.scratch[key]

    # --- forward ---------------------------------------------------------------------------------------
    def write_kv(self, key, value, kv_cache, slot_mapping) -> None:
        """Store this step's K/V at their slots (one program per token, all KV heads at once); an fp8 cache
        stores ``clamp(x / scale)``."""
        from octavo.nn.kv_quant import FP8_MAX
        from octavo.plugins.attention._triton_kernels import _kv_write_kernel

        if key.shape[0] == 0:
            return
        if key.stride(-1) != 1 or value.stride(-1) != 1:
            key, value = key.contiguous(), value.contiguous()
        pdl = _pdl_opts()
        _kv_write_kernel[(key.shape[0],)](
            key, value, kv_cache, slot_mapping,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1),
            kv_cache.stride(0), self.num_kv_heads, self.k_scale, self.v_scale,
            HEAD_D=self.head_size, BLOCK_H=_next_pow2(self.num_kv_heads), BLOCK_D=_next_pow2(self.head_size),
            KV_FP8=kv_cache.dtype in FP8_MAX, FP8_MAX=FP8_MAX.get(kv_cache.dtype, 448.0), **pdl,
        )

    def forward(self, query, key, value, kv_cache, metadata: TritonAttentionMetadata):
        import torch

        from octavo.plugins.attention._triton_kernels import (
            LOG2E,
            _merge_splits_kernel,
            _paged_attention_kernel,
        )

        md = metadata
        if not (kv_cache.is_contiguous() and kv_cache.shape[0] == 2):
            raise ValueError(f"triton backend expects a contiguous [2, blocks, block_size, kv_heads, head] cache, "
                             f"got shape {tuple(kv_cache.shape)} strides {kv_cache.stride()}")
        num_tokens = query.shape[0]
        out = torch.empty(num_tokens, self.num_heads, self.head_size, dtype=query.dtype, device=query.device)
        if num_tokens == 0 or md.num_reqs == 0:
            self.write_kv(key, value, kv_cache, md.slot_mapping)
            return out
        if query.stride(-1) != 1:
            query = query.contiguous()
        if num_tokens == 1 and md.num_reqs == 1:  # e4m3 cache: KV write + split-KV + merge in one launch (fp8 area)
            from octavo.plugins.attention._fp8_kv_decode_bs1 import fp8_decode_one, one_launch

            one = one_launch(kv_cache.dtype, self.group, self.head_size, num_tokens, md.num_reqs, self.window,
                             self.soft_cap)
            if one is not None:
                fp8_decode_one(query, key, value, kv_cache[0], kv_cache[1], md.block_tables[0], md.seq_lens,
                               md.slot_mapping, out, scale=self.scale * self.k_scale, k_scale=self.k_scale,
                               v_scale=self.v_scale, pdl=_pdl_opts(), **one)
                return out

        block_q, block_m, block_n = self._tiles(md)
        splits = self._num_splits(md, block_n, query.device)
        num_q_tiles = triton_cdiv(md.max_query_len, block_q)
        if splits > 1:
            scratch_key = (num_tokens, self.num_heads, splits, self.head_dp)
            if scratch_key not in md.scratch:
                md.scratch[scratch_key] = (
                    torch.empty(num_tokens, self.num_heads, splits, self.head_dp, dtype=torch.float32,
                                device=query.device),
                    torch.empty(num_tokens, self.num_heads, splits, dtype=torch.float32, device=query.device))
            dst, lse = md.scratch[scratch_key]
            strides = (dst.stride(0), dst.stride(1), dst.stride(2), lse.stride(0), lse.stride(1))
        else:
            dst, lse = out, out  # lse unused
            strides = (out.stride(0), out.stride(1), 0, 0, 0)
        grid = (md.num_reqs, num_q_tiles * splits, self.num_kv_heads)
        fp8 = kv_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        scale = self.scale * (self.k_scale if fp8 else 1.0)  # K's scale folds into the softmax scale
        tables, seq_lens, qsl = md.block_tables, md.seq_lens, md.query_start_loc
        launch = self._decode_launch(kv_cache.dtype, fp8)
        decode_ok = splits == 1 and launch is not None and not self.window and not self.soft_cap
        # a decode-only step whose launch stores the K/V itself: no write launch (table field write_kv)
        fused_write = decode_ok and launch.write_kv and md.max_query_len == 1 and num_tokens == md.num_reqs
        if not fused_write:
            self.write_kv(key, value, kv_cache, md.slot_mapping)
        if decode_ok:
            # decode rows (all of them, or the leading ones of a step with prefills) -> the decode kernel
            from octavo.plugins.attention._triton_decode import paged_decode

            first = md.num_reqs if md.max_query_len == 1 else min(md.num_decodes, md.num_reqs)
            from octavo.plugins.attention._fp8_kv_decode import fp8_kv_decode, fp8_launch

            fp8_kv = fp8_launch(kv_cache.dtype, self.group, self.head_size) if fp8 and not fused_write else None
            if first and fp8_kv is not None:  # e4m3 cache: the fp8 decode kernel where measured (_fp8_kv_decode.py)
                fp8_kv_decode(query, kv_cache[0], kv_cache[1], out, tables, seq_lens, qsl, num_reqs=first,
                              num_kv_heads=self.num_kv_heads, scale=scale, v_scale=self.v_scale,
                              block_size=md.block_size, order=self._longest_first(md, seq_lens, first), **fp8_kv)
            elif first:
                paged_decode(query, kv_cache[0], kv_cache[1], out, tables, seq_lens, qsl, num_reqs=first,
                             num_kv_heads=self.num_kv_heads, scale=scale, v_scale=self.v_scale if fp8 else 1.0,
                             block_size=md.block_size, block_n=launch.block_n, num_warps=launch.num_warps,
                             num_stages=launch.num_stages,
                             order=self._longest_first(md, seq_lens, first) if launch.ordered else None,
                             chunk=launch.chunk, max_seq_len=md.max_seq_len,
                             scratch=self._chunk_scratch(md, query, launch.chunk),
                             new_kv=(key, value, md.slot_mapping, self.k_scale, self.v_scale) if fused_write else None,
                             pdl=_pdl_opts())
            if first:
                if first == md.num_reqs:
                    return out
                tables, seq_lens, qsl = tables[first:], seq_lens[first:], qsl[first:]
                grid = (md.num_reqs - first, *grid[1:])
        _paged_attention_kernel[grid](
            query, kv_cache[0], kv_cache[1], dst, lse,
            tables, seq_lens, qsl,
            scale * LOG2E, scale, self.soft_cap or 1.0, self.window, self.v_scale if fp8 else 1.0,
            query.stride(0), query.stride(1), *strides,
            kv_cache.stride(1), kv_cache.stride(2), tables.stride(0),
            GROUP=self.group, GROUP_P=self.group_p, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n,
            HEAD_D=self.head_size, HEAD_DP=self.head_dp, PAGE=md.block_size, NUM_SPLITS=splits,
            USE_SOFTCAP=self.soft_cap > 0, USE_WINDOW=self.window > 0,
            DOT_PREC="ieee" if query.dtype == torch.float32 else "tf32", KV_FP8=fp8,
            num_warps=4, num_stages=2, **_pdl_opts(),
        )
        if splits > 1:
            _merge_splits_kernel[(num_tokens, self.num_heads)](
                dst, lse, out, self.num_heads, out.stride(0), out.stride(1),
                NUM_SPLITS=splits, HEAD_D=self.head_size, HEAD_DP=self.head_dp, **_pdl_opts())
        return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
