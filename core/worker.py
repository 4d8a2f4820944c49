"""The worker: owns one device — sets it up, loads the model, sizes and allocates the KV cache, binds the
attention layers, and runs steps through its ModelRunner. It describes itself once as a :class:`WorkerInfo`
and otherwise speaks only the step contract (``octavo.core.step``), so it can live in any process."""

from __future__ import annotations

import json
import logging
import math
import os

import torch

from octavo.config import OctavoSettings
from octavo.core.loader import get_eos_token_ids, get_max_model_len, resolve_dtype
from octavo.core.model_runner import ModelRunner
from octavo.core.platform_setup import prepare_on_platform
from octavo.core.spec_decode_heads import attach_spec_head
from octavo.core.spec_verify import verify_graph_shapes
from octavo.nn.kv_quant import check_kv_cache_dtype, kv_cache_torch_dtype, set_kv_scales
from octavo.nn.parallel import get_tp_rank, get_tp_size, set_expert_parallel
from octavo.nn.pipeline import get_pp_rank, get_pp_size
from octavo.step import RunnerOutput, StepBatch, WorkerInfo

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30


def choose_dtype(name: str, platform, hf_config) -> torch.dtype:
    """The loader's dtype rule (``auto`` -> the platform default, a bf16 checkpoint never squeezed into fp16).
    An explicit dtype the device does not compute natively still runs (torch emulates it, e.g. bf16 on an
    AVX2-only CPU) but is logged as a warning, since it is slow."""
    dtype = resolve_dtype(name, hf_config, platform.default_dtype())
    native = platform.supported_dtypes()
    if str(dtype).removeprefix("torch.") not in native:
        logger.warning("dtype=%s is not native on platform %s (native: %s); it runs emulated and slowly.",
                       name, platform.name, ", ".join(native))
    return dtype


def create_worker(settings: OctavoSettings | str, *, rank: int = 0, world_size: int = 1,
                  init_method: str | None = None, platform=None) -> Worker:
    """Build a worker in the calling process: the target executors name (``octavo.executor``).

    With ``world_size > 1`` it first joins ``torch.distributed`` with the platform's backend (gloo on CPU,
    nccl on CUDA) at ``init_method``, so the model's parallel layers shard for this rank while they are built.
    On a CPU the ranks share the cores: each gets ``cpus // world_size`` threads unless ``num_threads`` is set.
    """
    from octavo.core.plugin_manager import get_plugin_manager

    if isinstance(settings, str):
        settings = OctavoSettings(**json.loads(settings))
    platform = platform or get_plugin_manager().select_platform(settings)
    device_index = 0 if platform.device_type == "cpu" else rank % max(1, platform.device_count())
    if world_size > 1:
        import torch.distributed as dist

        platform.set_device(device_index)
        dist.init_process_group(backend=platform.distributed_backend, init_method=init_method, rank=rank,
                                world_size=world_size)
        if settings.parallel.pipeline_parallel_size > 1:  # stage groups + this rank's stage (core/pp_runner.py)
            from octavo.core.pp_runner import join_pipeline

            join_pipeline(rank, settings.parallel.tensor_parallel_size, settings.parallel.pipeline_parallel_size)
            # stages run eager: a captured graph would hold one stage's send/recv shapes
            settings = settings.model_copy(update={"device": settings.device.model_copy(
                update={"enforce_eager": True})})
        if platform.device_type == "cpu" and not settings.device.num_threads:
            threads = max(1, len(os.sched_getaffinity(0)) // world_size)
            settings = settings.model_copy(update={"device": settings.device.model_copy(
                update={"num_threads": threads})})
    return Worker(settings, platform, device_index)


class Worker:
    def __init__(self, settings: OctavoSettings, platform, device_index: int = 0) -> None:
        from octavo.core.engine_start import start_phase
        from octavo.core.loader import load_model, resolve_model
        from octavo.core.plugin_manager import get_plugin_manager

        start_phase("settings + plugins + platform selection")
        self.settings = settings
        self.platform = platform
        self.rank = get_tp_rank()
        self.world_size = get_tp_size()
        pm = get_plugin_manager()
        platform.set_device(device_index)
        platform.install_shipped_kernels()  # precompiled kernels into the compiler's cache (CUDA: Triton's)
        self.device = torch.device(platform.device_type, device_index) if platform.device_type != "cpu" \
            else torch.device("cpu")
        if platform.device_type == "cpu":
            threads = settings.device.num_threads or len(os.sched_getaffinity(0))
            torch.set_num_threads(threads)
        torch.manual_seed(settings.model.seed)

        self.resolved = resolve_model(settings.model)
        start_phase("resolve model and config")
        hf_config = self.resolved.hf_config
        self.dtype = choose_dtype(settings.model.dtype, platform, hf_config)
        if self.world_size > 1:  # OCTAVO_TP_ALLREDUCE: nccl (default) or a one-shot symm_mem (core/tp_comm.py)
            from octavo.core.tp_comm import install_all_reduce

            install_all_reduce(platform, self.device, self.dtype)
        model_cls = pm.resolve("models", self.resolved.architecture)
        set_expert_parallel(settings.parallel.enable_expert_parallel)  # read by FusedMoE as it is built
        self.pp_rank, self.pp_size = get_pp_rank(), get_pp_size()
        if self.pp_size > 1:
            from octavo.core.pp_runner import check_pipeline_settings

            check_pipeline_settings(settings, model_cls, platform)
        from octavo.core.loader.quant import resolve_quantizer

        quantizer = resolve_quantizer(settings.model.quantization, self.resolved, platform, pm)
        self.quantization = getattr(quantizer, "name", None)
        self.model = load_model(self.resolved, model_cls=model_cls, dtype=self.dtype, device=self.device,
                                quantizer=quantizer)
        start_phase("build model + load weights")
        self.model.eval()
        if settings.parallel.enable_expert_parallel and not any(
                hasattr(m, "num_local_experts") for m in self.model.modules()):
            raise ValueError(f"enable_expert_parallel: {self.resolved.architecture} has no experts (not a "
                             "mixture-of-experts model); drop the setting.")
        text_config = hf_config.get_text_config()  # a vision-language config nests the language model's
        self.max_model_len = get_max_model_len(text_config, settings.model.max_model_len)
        self.vocab_size = text_config.vocab_size

        self.attn_layers = [m for m in self.model.modules() if hasattr(m, "bind") and hasattr(m, "num_kv_heads")]
        block_size = settings.cache.block_size
        self.block_size = block_size
        if self.attn_layers:
            first = self.attn_layers[0]
            self.attn_backend_cls = pm.select_attention_backend(
                settings, platform, dtype=self.dtype, head_size=first.head_size,
                sliding_window=max((layer.sliding_window or 0) for layer in self.attn_layers) or None,
                logits_soft_cap=first.logits_soft_cap, block_size=block_size)
        else:
            self.attn_backend_cls = None
        if self.attn_layers:  # an fp8 KV cache this device or backend cannot run fails here (nn/kv_quant.py)
            check_kv_cache_dtype(settings.cache.kv_cache_dtype, self.attn_backend_cls, self.device)
        self.kv_sizing: dict = {}  # the profiled sizing pass's device readings (GPUs; core/profiling.py)
        self.num_blocks = self._determine_num_blocks()
        start_phase("attention backend + KV cache size (profile run)")
        self._allocate_kv_cache()
        start_phase("KV cache allocation")
        runner_cls, extra = ModelRunner, {}
        if self.pp_size > 1:  # this stage's layers only; intermediate tensors to/from the neighbours
            from octavo.core.pp_runner import PipelineStageRunner, StageLink

            runner_cls = PipelineStageRunner
            extra["link"] = StageLink(self.pp_rank * self.world_size + self.rank, self.world_size, self.pp_rank,
                                      self.pp_size, text_config.hidden_size, self.dtype, self.device)
        self.runner = runner_cls(self.model, self.attn_backend_cls, self.device, block_size, self.vocab_size,
                                 synchronize=platform.synchronize, task=settings.model.task,
                                 grammar_apply=platform.make_grammar_mask_apply(),
                                 fused_sampler=platform.make_fused_sampler(),
                                 greedy_argmax=platform.make_greedy_argmax(), **extra)
        attach_spec_head(self)  # speculator heads draft next to the target, hooks before graphs (spec_decode_heads.py)
        if settings.lora.enable_lora:  # adapter slots + a hook on every projection, before graphs (docs/lora.md)
            from octavo.lora.manager import LoRAManager

            graph_tokens = 0 if settings.device.enforce_eager else max(  # static LoRA rows (octavo.lora.static)
                [settings.scheduler.max_num_seqs] + [r * q for r, q in verify_graph_shapes(settings)])
            self.runner.lora = LoRAManager(self.model, settings.lora, self.dtype, self.device, graph_tokens,
                                           kernels=platform.make_lora_kernels())
        self.prepared = prepare_on_platform(self)  # typed handle in, step runner out (core/platform_setup.py)
        start_phase("platform set-up (fused kernels + CUDA graphs)")
        if settings.scheduler.async_scheduling:  # placeholders + deferred outputs (core/async_runner.py)
            from octavo.core.tp_comm import make_async_steps  # TP: sampled ids broadcast from rank 0

            self.runner.async_steps = make_async_steps(self)
        logger.info("Loaded %s (%s) on %s as %s; attention backend %s; KV cache %d blocks x %d tokens",
                    self.resolved.source, self.resolved.architecture, self.device, str(self.dtype).split(".")[-1],
                    getattr(self.attn_backend_cls, "name", None), self.num_blocks, block_size)
        if self.pp_size > 1:
            logger.info("pipeline stage %d of %d: layers [%d, %d) of %d, %d attention layers in this KV cache",
                        self.pp_rank, self.pp_size, self.model.model.start_layer, self.model.model.end_layer,
                        len(self.model.model.layers), len(self.attn_layers))

    @property
    def returns_output(self) -> bool:
        """Whether this rank's ``RunnerOutput`` is the step's: tp rank 0 of the last pipeline stage."""
        return self.rank == 0 and self.pp_rank == self.pp_size - 1

    def _bytes_per_block(self) -> int:
        elem = torch.empty((), dtype=self._kv_dtype()).element_size()
        return sum(math.prod(self.attn_backend_cls.kv_cache_shape(1, self.block_size, layer.num_kv_heads,
                                                                   layer.head_size)) * elem
                   for layer in self.attn_layers)

    def _kv_dtype(self) -> torch.dtype:
        return kv_cache_torch_dtype(self.settings.cache.kv_cache_dtype, self.dtype)  # fp8: 1 byte per element

    def _determine_num_blocks(self) -> int:
        cache = self.settings.cache
        if not self.attn_layers:
            # no paged attention (e.g. an encoder): blocks are bookkeeping only, enough for a full step
            budget = max(self.settings.scheduler.max_num_batched_tokens or 2048, self.max_model_len)
            return 1 + 2 * math.ceil(budget / self.block_size)
        if cache.num_gpu_blocks_override:
            return cache.num_gpu_blocks_override
        per_block = self._bytes_per_block()
        if cache.kv_cache_memory_bytes:
            budget, source = cache.kv_cache_memory_bytes, "kv_cache_memory_bytes"
        elif self.platform.capabilities().memory_profiling:
            budget, source = self._profile_free_bytes(), f"gpu_memory_utilization={cache.gpu_memory_utilization}"
        else:
            default = type(cache).model_fields["gpu_memory_utilization"].default
            if cache.gpu_memory_utilization != default:  # nothing to profile here: not ignored silently
                raise ValueError(f"gpu_memory_utilization applies to devices whose memory is profiled (GPUs); on "
                                 f"{self.platform.name} size the KV cache with kv_cache_memory_bytes instead.")
            budget, source = DEFAULT_CPU_KV_CACHE_BYTES, "the CPU default (set kv_cache_memory_bytes to change)"
        num_blocks = budget // per_block
        need = math.ceil(self.max_model_len / self.block_size) + 1
        if num_blocks < need:
            raise ValueError(
                f"The KV cache ({budget / 2**20:.0f} MiB from {source}, {num_blocks} blocks of {self.block_size} "
                f"tokens at {per_block / 2**10:.0f} KiB each) cannot hold one request of max_model_len="
                f"{self.max_model_len} ({need} blocks). Lower --max-model-len or give the cache more memory "
                "(--kv-cache-memory-bytes, --gpu-memory-utilization).")
        logger.info("KV cache: %d blocks (%.0f MiB, from %s)", num_blocks, num_blocks * per_block / 2**20, source)
        return num_blocks

    def _profile_free_bytes(self) -> int:
        """Run the largest batch once so activation memory is reserved, then give the KV cache what is left
        of ``gpu_memory_utilization`` of the device (vendor-neutral: uses the platform's memory readings;
        ``self.kv_sizing`` keeps them, core/profiling.py says what is counted)."""
        from octavo.core.profiling import kv_budget_from_profile

        budget, self.kv_sizing = kv_budget_from_profile(self)
        logger.info("KV sizing (GiB): %s", ", ".join(f"{k.removesuffix('_GiB')} {v:.2f}"
                                                    for k, v in self.kv_sizing.items()))
        return budget

    def _allocate_kv_cache(self) -> None:
        from octavo.core.lazy_zeros import zeros as lazy_zeros
        from octavo.env_flags import env_switch

        lazy = env_switch("OCTAVO_LAZY_KV_CACHE", True)
        self.kv_caches = []
        for layer in self.attn_layers:
            shape = self.attn_backend_cls.kv_cache_shape(self.num_blocks, self.block_size, layer.num_kv_heads,
                                                         layer.head_size)
            # CPU: calloc'd, pages zeroed on first touch; OCTAVO_LAZY_KV_CACHE=0 writes them all now (resident at once)
            kv = (lazy_zeros if lazy else torch.zeros)(shape, dtype=self._kv_dtype(), device=self.device)
            impl = self.attn_backend_cls(num_heads=layer.num_heads, head_size=layer.head_size,
                                         num_kv_heads=layer.num_kv_heads, scale=layer.scale,
                                         sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap)
            set_kv_scales(impl, layer)  # checkpoint k_scale/v_scale, else 1.0; read only by an fp8 cache
            layer.bind(impl, kv)
            self.kv_caches.append(kv)

    def info(self) -> WorkerInfo:
        from octavo.core.kv_cache.manager import uniform_sliding_window

        return WorkerInfo(
            num_blocks=self.num_blocks, block_size=self.block_size, max_model_len=self.max_model_len,
            vocab_size=self.vocab_size, architecture=self.resolved.architecture, model_source=self.resolved.source,
            dtype=str(self.dtype).split(".")[-1], device=str(self.device),
            sliding_window=uniform_sliding_window(self.model), is_pooling=self.runner.is_pooling,
            embedding_dim=getattr(self.model, "embedding_dim", None),
            pooler=dict(getattr(self.model, "pooler_info", None) or {}) if self.runner.is_pooling else {},
            eos_token_ids=list(get_eos_token_ids(self.resolved)),
            tokenizer_path=getattr(self.resolved, "path", None),
            attention_backend=getattr(self.attn_backend_cls, "name", None), quantization=self.quantization,
            world_size=self.world_size * self.pp_size)

    def rpc(self, method, args: list | tuple = (), kwargs: dict | None = None):
        """``collective_rpc``'s worker side: sleep/wake_up/reload_weights, ``module:function`` or a method name
        (core/worker_rpc.py)."""
        from octavo.core.worker_rpc import call_worker

        return call_worker(self, method, list(args), dict(kwargs or {}))

    def execute(self, batch: StepBatch, grammar=None) -> RunnerOutput:
        return self.runner.execute(batch, grammar)  # grammar: in-process GrammarStep (core/grammar_step.py)

    def release(self) -> None:
        """Drop the model, the KV cache and everything built on them, and hand the device memory back.

        An in-process engine's worker outlives ``shutdown()`` for as long as the ``LLM`` object does, so
        without this a second engine in the same process found the first one's weights and cache still
        counted as used (0 MiB of KV cache on an H100 in benchmarks/lora_gpu.py). The caching allocator
        keeps freed blocks, hence ``empty_cache``: the next engine reads device memory as free."""
        import gc

        for name in ("prepared", "runner", "kv_caches", "attn_layers", "model"):
            if hasattr(self, name):
                setattr(self, name, None)
        gc.collect()
        if hasattr(self.platform, "empty_cache"):
            self.platform.empty_cache()
