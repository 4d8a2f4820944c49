"""The Triton fused MoE kernel on ``FusedMoE`` layers: tile configs per shape, support checks, installing.

``install_moe_kernels`` (called by the CUDA platform's ``prepare_model``, before CUDA-graph capture) gives
every supported :class:`octavo.nn.fused_moe.FusedMoE` layer an ``apply_experts`` that runs
:func:`~octavo.plugins.platforms.cuda_moe_kernels.fused_experts`; unsupported layers keep the grouped torch
path and the log says why. ``OCTAVO_MOE_TRITON=0`` keeps the torch path everywhere.

Tile configs come from JSON files named ``E=<E>,N=<I>,device_name=<name>,dtype=<dtype>.json`` (``I`` is the
layer's local intermediate size, the device name as ``torch.cuda.get_device_name`` with spaces as ``_``),
looked up first in ``$OCTAVO_MOE_CONFIG_DIR`` then in ``moe_configs/`` next to this file. Each maps a token
count ``M`` to a config; the nearest ``M`` is used (up to twice the largest). Without a file (or past it),
:func:`default_config` picks by the mean tokens per expert. ``benchmarks/moe_tune.py`` writes the files.

One token (batch-1 decode) takes a two-launch path instead (``moe_decode_kernels``: routing inside the w13
GEMV, the top-k weighted sum inside the w2 GEMV) through an instance ``forward``, checked at install like the
rest; ``OCTAVO_MOE_FUSED_DECODE=0`` keeps the general kernel there. Its tiles: :func:`decode_config`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import types
from pathlib import Path

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).with_name("moe_configs")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def config_file_name(num_experts: int, inter: int, device_name: str, dtype: torch.dtype) -> str:
    return f"E={num_experts},N={inter},device_name={device_name.replace(' ', '_')},dtype={str(dtype)[6:]}.json"


@functools.cache
def load_configs(num_experts: int, inter: int, device_name: str, dtype: torch.dtype) -> dict[int, dict] | None:
    """``{M: config}`` from the first config file found for this shape and device, else ``None``."""
    name = config_file_name(num_experts, inter, device_name, dtype)
    dirs = [Path(d) for d in os.environ.get("OCTAVO_MOE_CONFIG_DIR", "").split(os.pathsep) if d] + [CONFIG_DIR]
    for folder in dirs:
        path = folder / name
        if path.is_file():
            table = json.loads(path.read_text())
            logger.info("fused MoE configs from %s", path)
            return {int(m): cfg for m, cfg in table.items() if m.isdigit()}
    return None


def default_config(m: int, num_experts: int, top_k: int, n: int | None = None) -> dict:
    """Tiles for one GEMM of output width ``n`` by the mean number of token-slots per expert. Small M is a
    weight-streaming GEMV (tall K tiles, BLOCK_M 16, the smallest ``tl.dot`` takes; BLOCK_N 32 when 64 would
    leave fewer than ~2 programs per SM of an H100); large M reuses each weight tile over more rows."""
    per_expert = m * top_k / num_experts
    if per_expert <= 16:
        programs = min(num_experts, m * top_k) * -(-(n or 1 << 30) // 64)  # m-blocks with tokens x n-blocks
        return {"BLOCK_M": 16, "BLOCK_N": 32 if programs < 256 else 64, "BLOCK_K": 128, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 3}
    if per_expert <= 48:
        return {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}


def pick_config(table: dict[int, dict] | None, m: int, num_experts: int, top_k: int, inter: int | None = None,
                hidden: int | None = None) -> tuple[dict, dict | None]:
    """(w13 config, w2 overrides or None) for ``m`` tokens: the entry of the nearest tuned M, unless ``m`` is
    more than twice the largest tuned M (a file tuned for decode sizes says nothing about prefill tiles);
    else the defaults for the w13 GEMM (width ``inter``) and the w2 GEMM (width ``hidden``)."""
    if not table or m > 2 * max(table):
        c13 = default_config(m, num_experts, top_k, inter)
        c2 = default_config(m, num_experts, top_k, hidden)
        return c13, {key: v for key, v in c2.items() if c13[key] != v} or None
    cfg = dict(table[min(table, key=lambda k: abs(k - m))])
    cfg.pop("decode", None)  # the batch-1 two-launch path's tiles (decode_config)
    return cfg, cfg.pop("w2", None)


def decode_config(table: dict[int, dict] | None, top_k: int, inter: int, hidden: int) -> dict:
    """Tiles of the batch-1 two-launch path: the ``"decode"`` entry of the file's ``M=1`` config
    (``{"w13": {...}, "w2": {...}}``, each overriding the default's keys), else the defaults."""
    from octavo.plugins.platforms.moe_decode_kernels import default_decode_config

    cfg = default_decode_config(top_k, inter, hidden)
    tuned = (table or {}).get(1, {}).get("decode") or {}
    unknown = set(tuned) - set(cfg)
    if unknown:
        raise ValueError(f"fused MoE config: 'decode' entry has unknown keys {sorted(unknown)} (w13, w2)")
    return {part: {**cfg[part], **tuned.get(part, {})} for part in cfg}


def _runs_on(t: torch.Tensor) -> bool:
    """CUDA tensors; CPU tensors too under ``TRITON_INTERPRET=1`` (the CPU tests run the kernel that way)."""
    return t.is_cuda or (t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type


def unsupported_reason(layer, device: torch.device) -> str | None:
    """Why the kernel cannot run ``layer`` (a ``FusedMoE``), or ``None`` when it can."""
    from octavo.nn.activation import SiluAndMul

    w13, w2 = layer.w13_weight, layer.w2_weight
    if not _runs_on(w13):
        return f"weights on {w13.device}, the kernel needs a CUDA device"
    if torch.version.hip is not None:
        return "ROCm build: the kernel and its configs are only measured on NVIDIA GPUs so far"
    if w13.dtype not in SUPPORTED_DTYPES:
        return f"dtype {w13.dtype} (the kernel takes float16 / bfloat16; float32 stays on the torch path)"
    if w2.dtype != w13.dtype:
        return f"w13 {w13.dtype} and w2 {w2.dtype} differ"
    if not isinstance(layer.act_fn, SiluAndMul):
        return f"activation {type(layer.act_fn).__name__} (the kernel fuses SiLU-and-mul only)"
    if not (w13.is_contiguous() and w2.is_contiguous()):
        return "non-contiguous expert weights"
    e, two_i, h = w13.shape
    if two_i != 2 * layer.intermediate_size or tuple(w2.shape) != (e, h, two_i // 2):
        return f"unexpected weight shapes {tuple(w13.shape)} / {tuple(w2.shape)}"
    return None


def _triton_apply_experts(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor):
    """``FusedMoE.apply_experts`` through the Triton kernel (same contract); torch path for other dtypes."""
    if x.dtype != self.w13_weight.dtype or not _runs_on(x):
        return type(self).apply_experts(self, x, topk_weights, topk_ids)
    m = x.shape[0]
    cfg = self._moe_cfg_cache.get(m)
    if cfg is None:
        cfg = self._moe_cfg_cache[m] = pick_config(self._moe_table, m, self.num_local_experts, self.top_k,
                                                   self.intermediate_size, self.hidden_size)
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return self._moe_fused(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, cfg[0], cfg[1],
                             zero_missing=self.expert_parallel)
    except self._moe_oor as e:  # a config too big for this card's shared memory: torch path from now on
        logger.warning("fused MoE kernel off for %s (%d tokens, config %s): %s", self.prefix, m, cfg, e)
        use_torch_path(self)
        return type(self).apply_experts(self, x, topk_weights, topk_ids)


def _decode_one_ok(self, x: torch.Tensor) -> bool:
    """One token that the two-launch batch-1 path (``moe_decode_kernels``) takes: not expert parallelism
    (its ids of other ranks need the general path's zero rows), the weights' dtype, a device the kernel runs on."""
    return (x.shape[0] == 1 and self._moe_decode is not None and not self.expert_parallel
            and x.dtype == self.w13_weight.dtype and _runs_on(x))


def _triton_forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
    """``FusedMoE.forward``; one token runs routing + w13 and w2 + the weighted sum as two launches."""
    routed = self.__dict__.pop("_moe_routed", None)  # (logits, weights, ids) of the norm + router launch's top-k
    if not _decode_one_ok(self, hidden_states):
        return type(self).forward(self, hidden_states, router_logits)
    kw = {"routed": routed[1:]} if routed is not None and routed[0] is router_logits else {}
    try:
        out = self._moe_decode(hidden_states, router_logits, self.w13_weight, self.w2_weight, self.top_k,
                               self.renormalize, self._moe_decode_cfg, self.__dict__.get("_moe_next_weight"), **kw)[0]
    except self._moe_oor as e:  # tiles too big for this card's shared memory: the general path from now on
        logger.warning("fused MoE batch-1 kernel off for %s (config %s): %s", self.prefix, self._moe_decode_cfg, e)
        self._moe_decode = None
        return type(self).forward(self, hidden_states, router_logits)
    if self.tp_size > 1 and self.reduce_results:  # as FusedMoE.forward: the ranks' partial outputs summed
        out = self._moe_layer_module.tp_all_reduce(out)  # the all-reduce FusedMoE.forward calls, looked up now
    return out


def _triton_select_experts(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``FusedMoE.select_experts`` as one Triton launch (softmax, top-k, renormalise; same contract)."""
    if not _runs_on(router_logits):
        return type(self).select_experts(self, router_logits)
    return self._moe_topk(router_logits, self.top_k, self.renormalize)


def use_triton_kernel(layer) -> None:
    """Route ``layer.apply_experts`` and ``layer.select_experts`` through the kernels (configs for its shape
    and device looked up now)."""
    from triton.runtime.errors import OutOfResources

    from octavo.plugins.platforms import cuda_moe_kernels

    dev = layer.w13_weight.device
    layer._moe_fused, layer._moe_oor = cuda_moe_kernels.fused_experts, OutOfResources  # no imports per call
    layer._moe_topk = cuda_moe_kernels.topk_softmax
    layer._moe_table = load_configs(layer.num_local_experts, layer.intermediate_size,
                                    _device_name(dev), layer.w13_weight.dtype)
    layer._moe_cfg_cache = {}
    layer.apply_experts = types.MethodType(_triton_apply_experts, layer)
    layer.select_experts = types.MethodType(_triton_select_experts, layer)
    layer._moe_decode = None
    if env_switch("OCTAVO_MOE_FUSED_DECODE"):
        from octavo.nn import fused_moe
        from octavo.plugins.platforms import moe_decode_kernels

        layer._moe_decode, layer._moe_layer_module = moe_decode_kernels.decode_one, fused_moe
        layer._moe_decode_cfg = decode_config(layer._moe_table, layer.top_k, layer.intermediate_size,
                                              layer.hidden_size)
        layer.forward = types.MethodType(_triton_forward, layer)


def use_torch_path(layer) -> None:
    """Undo :func:`use_triton_kernel` (the class's routing and grouped torch path again)."""
    for name in ("apply_experts", "select_experts", "forward"):
        layer.__dict__.pop(name, None)


def check_sizes(layer) -> tuple[int, ...]:
    """Token counts the install check runs: a decode-sized batch, and (on a GPU) one large enough for the
    largest default tiles (64 slots per expert), so every default tile shape has compiled before it is used."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return (7,)
    return (7, min(4096, -(-64 * layer.num_local_experts // layer.top_k)))


@torch.inference_mode()
def _agrees(layer) -> str | None:
    """Run the kernel against the layer's torch path on random tokens; ``None`` when they agree."""
    gen = torch.Generator(device=layer.w13_weight.device).manual_seed(0)
    dev, dtype = layer.w13_weight.device, layer.w13_weight.dtype
    for n in check_sizes(layer):
        x = torch.randn(n, layer.hidden_size, generator=gen, device=dev).to(dtype)
        logits = torch.randn(n, layer.num_experts, generator=gen, device=dev)  # float32: no ties to break
        weights, ids = type(layer).select_experts(layer, logits)
        try:
            got_w, got_ids = layer.select_experts(logits)
        except Exception as e:  # noqa: BLE001 - the routing kernel cannot compile here: keep the torch path
            return f"routing, {n} tokens: {type(e).__name__}: {e}"
        if not torch.equal(got_ids, ids) or (got_w - weights).abs().max().item() > 1e-5:
            return f"routing, {n} tokens: top-k ids or weights differ from torch's"
        if layer.expert_parallel:  # this rank's experts only, as FusedMoE.forward passes them
            ids = ids % layer.num_local_experts
        want = type(layer).apply_experts(layer, x, weights, ids)
        try:
            got = layer.apply_experts(x, weights, ids)
        except Exception as e:  # noqa: BLE001 - a shape or config the kernel cannot compile: keep the torch path
            return f"{n} tokens: {type(e).__name__}: {e}"
        scale = want.float().abs().max().item() + 1e-6
        err = (got.float() - want.float()).abs().max().item()
        tol = 3e-2 if dtype == torch.bfloat16 else 5e-3  # a few ulps of the output's scale
        if err > tol * scale:
            return f"{n} tokens: max error {err:.3g} vs output scale {scale:.3g}"
    return None


@torch.inference_mode()
def _decode_agrees(layer) -> str | None:
    """The batch-1 two-launch path (before any all-reduce) against the torch routing + torch path on a few
    random tokens; ``None`` when they agree (same ids, weights within 1e-5, output within a few ulps)."""
    gen = torch.Generator(device=layer.w13_weight.device).manual_seed(1)
    dev, dtype = layer.w13_weight.device, layer.w13_weight.dtype
    for _ in range(3):
        x = torch.randn(1, layer.hidden_size, generator=gen, device=dev).to(dtype)
        logits = torch.randn(1, layer.num_experts, generator=gen, device=dev)
        weights, ids = type(layer).select_experts(layer, logits)
        want = type(layer).apply_experts(layer, x, weights, ids)
        try:
            got, got_w, got_ids = layer._moe_decode(x, logits, layer.w13_weight, layer.w2_weight, layer.top_k,
                                                    layer.renormalize, layer._moe_decode_cfg)
        except Exception as e:  # noqa: BLE001 - cannot compile here: keep the general kernel at batch 1
            return f"batch-1 path: {type(e).__name__}: {e}"
        if not torch.equal(got_ids, ids) or (got_w - weights).abs().max().item() > 1e-5:
            return "batch-1 path: top-k ids or weights differ from torch's"
        scale = want.float().abs().max().item() + 1e-6
        err = (got.float() - want.float()).abs().max().item()
        if err > (3e-2 if dtype == torch.bfloat16 else 5e-3) * scale:
            return f"batch-1 path: max error {err:.3g} vs output scale {scale:.3g}"
    return None


def _decode_off(layer) -> None:
    """The general kernel at batch 1 too (routing launch, w13, w2, sum over k)."""
    layer._moe_decode = None
    layer.__dict__.pop("forward", None)


def link_next_weights(model: torch.nn.Module) -> int:
    """Give each batch-1 MoE layer ``_moe_next_weight``: the qkv weight of the next attention module in module
    order (the next layer's first GEMV), which its w2 launch may ask L2 for (``"PF_NEXT"``, moe_prefetch.py).
    Returns how many layers got one."""
    from octavo.nn.fused_moe import FusedMoE

    pending, n = [], 0
    for m in model.modules():
        if isinstance(m, FusedMoE) and m.__dict__.get("_moe_decode") is not None:
            pending.append(m)
        qkv = getattr(getattr(m, "qkv_proj", None), "weight", None)
        if pending and isinstance(qkv, torch.Tensor) and qkv.dim() == 2 and qkv.is_contiguous():
            for layer in pending:  # a plain reference, not a registered parameter of the experts module
                object.__setattr__(layer, "_moe_next_weight", qkv)
                n += 1
            pending = []
    return n


def install_moe_kernels(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> dict:
    """Give every supported ``FusedMoE`` of ``model`` the Triton kernel; returns counts for the logs/notes.

    The first layer of each (experts, hidden, intermediate, dtype) shape is checked against the torch path
    at :func:`check_sizes`; a disagreement or compile failure keeps the torch path for that shape, with a
    warning.
    """
    from octavo.nn.fused_moe import FusedMoE

    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    notes: dict = {"triton": 0, "torch": 0, "reasons": {}}
    if not layers:
        return notes
    if not env_switch("OCTAVO_MOE_TRITON"):
        notes["torch"] = len(layers)
        notes["reasons"]["all"] = "OCTAVO_MOE_TRITON=0"
        logger.info("fused MoE kernel off (OCTAVO_MOE_TRITON=0): %d layers on the torch path", len(layers))
        return notes
    verified: dict[tuple, str | None] = {}
    decode_verified: dict[tuple, str | None] = {}
    notes["decode_one"] = 0
    for layer in layers:
        reason = unsupported_reason(layer, device)
        if reason is None:
            key = (tuple(layer.w13_weight.shape), layer.w13_weight.dtype, layer.top_k, layer.expert_parallel)
            use_triton_kernel(layer)
            if key not in verified:
                verified[key] = _agrees(layer)
            reason = verified[key]
            if reason is None and layer._moe_decode is not None and not layer.expert_parallel:
                key = (*key, layer.renormalize)
                if key not in decode_verified:
                    decode_verified[key] = _decode_agrees(layer)
                    if decode_verified[key]:
                        logger.warning("fused MoE batch-1 path not used for %s shape: %s", layer.prefix,
                                       decode_verified[key])
                if decode_verified[key]:
                    _decode_off(layer)
                else:
                    notes["decode_one"] += 1
            elif layer.expert_parallel:
                _decode_off(layer)
        if reason is None:
            notes["triton"] += 1
        else:
            use_torch_path(layer)
            notes["torch"] += 1
            notes["reasons"][layer.prefix or "layer"] = reason
            logger.warning("fused MoE kernel not used for %s: %s", layer.prefix, reason)
    notes["next_weight_links"] = link_next_weights(model)
    from octavo.plugins.platforms.moe_norm_router import install_norm_router

    notes["norm_router"] = len(install_norm_router(model))  # batch 1: post-attention norm + router, one launch
    from octavo.plugins.platforms.moe_attention import install_decode_attention

    notes["decode_attention"] = install_decode_attention(model, dtype, device)  # batch 1: attention in one launch
    from octavo.plugins.platforms.moe_norm_qkv import install_norm_qkv

    notes["norm_qkv"] = len(install_norm_qkv(model))  # batch 1: input norm + qkv GEMV in one launch (default on)
    logger.info("fused MoE kernel: %d layers Triton (%d with the batch-1 two-launch path, %d with norm + router "
                "fused), %d torch", notes["triton"], notes["decode_one"], notes["norm_router"], notes["torch"])
    return notes
