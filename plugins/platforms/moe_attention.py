"""Installs the one-launch batch-1 attention (``moe_decode_attention.py``) on the Qwen3 attention modules of MoE
models, checked at install against the module's own forward.

Why here (the MoE platform files): the issue-17 MoE key is Qwen3-30B-A3B's batch-1 decode step, whose layer spends
~12 us in four attention launches for 1.3 MB of KV; dense models keep the general path (nano's backend).

``install_decode_attention(model, dtype, device)`` (run by ``install_moe_kernels`` when the model has MoE layers)
gives each eligible ``Qwen3Attention`` an instance ``forward`` that, for ONE token of ONE decode request on the
``triton`` backend with a 16-bit cache of the model dtype and no window / soft cap, runs qkv GEMV -> the one
launch -> o_proj; anything else calls the module's previous forward (the fused q/k norm + rope one). The launch
settings live in ``module._attn_one`` (``on``, ``splits``, ``block_n``, ``num_warps``, ``early``, ``dot16``): a benchmark can switch
them and re-capture (``benchmarks/moe_profile.py``). On by default; ``OCTAVO_MOE_DECODE_ATTN=0`` turns it off.
"""

from __future__ import annotations

import logging
import types

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)

DEFAULTS = {"splits": 16, "block_n": 64, "num_warps": 8, "early": True, "dot16": True,
            "prefetch": 0,  # 1/2: ask L2 for o_proj's weight after/before the PDL wait (moe_prefetch.py)
            "merge": 1,  # 1: the merge of the splits unrolled (session 8 batch 1: forward 2.893 vs 3.029 ms), 0: a loop
            # 1..8: o_proj as cuda_moe_oproj.gemv_early, this many K-blocks loaded before its PDL wait (0: the engine
            # GEMV). On since session 10 (session 9's H200 A/B, forward 2.417 -> 2.332 ms, same bits); PRE 4 at 4 warps
            # since session 11: H100 forward 2.741 -> 2.720 ms (8 warps PRE 8; off: 2.809), H200 (s10) 2.296 -> 2.275
            "o_early": 4,
            "o_tile": (8, None, 4),  # its (BLOCK_N, BLOCK_K, num_warps); BLOCK_K None: the engine GEMV's (same bits)
            "q_early": 0,  # 1..8: the same for the qkv GEMV (its wait is on the input norm, 2 us: session 10)
            "q_tile": (8, None, 4)}


DEFAULT_ON = True  # session 7 batch 2 (H100): Qwen3-30B-A3B forward 3.035 vs 3.100 ms, same engine (docs/moe.md)


def enabled() -> bool:
    """``OCTAVO_MOE_DECODE_ATTN`` (1/0; unset: :data:`DEFAULT_ON`)."""
    return env_switch("OCTAVO_MOE_DECODE_ATTN", default=DEFAULT_ON)


def runs_here(m, n: int, dtype: torch.dtype, md) -> bool:
    """Whether this call (``n`` tokens, activations of ``dtype``, the step's metadata) takes the one launch."""
    impl, cache = m.attn.impl, m.attn.kv_cache
    return (m._attn_one["on"] and n == 1 and getattr(impl, "name", None) == "triton" and cache is not None
            and cache.dtype == dtype and dtype in (torch.float16, torch.bfloat16) and cache.dim() == 5
            and cache.shape[0] == 2 and cache.is_contiguous() and not getattr(impl, "window", 1)
            and not getattr(impl, "soft_cap", 1) and getattr(md, "num_reqs", 0) == 1
            and getattr(md, "max_query_len", 0) == 1 and getattr(md, "num_tokens", 0) == 1)


def one_launch(m, positions: torch.Tensor, qkv: torch.Tensor, md) -> torch.Tensor:
    """The attention output ``[1, q_size]`` of the one launch (stores the new K/V into the module's cache)."""
    from octavo.plugins.platforms.moe_decode_attention import attention_one

    rope, cfg = m.rotary_emb, m._attn_one
    return attention_one(qkv, positions, rope.cos_cache, rope.sin_cache, m.q_norm.weight, m.k_norm.weight,
                         m.q_norm.eps, m.attn.kv_cache, md.block_tables[0], md.seq_lens, md.slot_mapping,
                         num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_size=m.head_dim,
                         scale=m.attn.scale, neox=bool(rope.is_neox_style), splits=cfg["splits"],
                         block_n=cfg["block_n"], num_warps=cfg["num_warps"], early=cfg["early"],
                         dot16=cfg["dot16"], prefetch=cfg["prefetch"],
                         prefetch_t=m.o_proj.weight if cfg["prefetch"] else None, merge=cfg["merge"])


def _forward(self, positions, hidden_states, ctx):
    md = ctx.attn_metadata
    pre = None
    if "_norm_qkv" in vars(self):  # moe_norm_qkv.py: the input norm may have computed qkv for this very tensor
        from octavo.plugins.platforms.moe_norm_qkv import take_qkv

        pre = take_qkv(self, hidden_states)
    if runs_here(self, hidden_states.shape[0], hidden_states.dtype, md):
        cfg = self._attn_one
        qkv = pre if pre is not None else _early(self.qkv_proj, hidden_states, cfg["q_early"], cfg["q_tile"])
        out = one_launch(self, positions, qkv, md)
        return _early(self.o_proj, out, cfg["o_early"], cfg["o_tile"])
    return self._attn_one_prev(positions, hidden_states, ctx)


def _early(lin, x: torch.Tensor, pre: int, tile) -> torch.Tensor:
    """``lin(x)``, as cuda_moe_oproj.gemv_early with ``pre`` K-blocks loaded before the PDL wait when ``pre`` and the
    layer is one plain GEMV. A ``tile`` BLOCK_K of None takes the engine GEMV's (its sums in its order: the same
    bits); until the engine GEMV has tuned this shape (its first call), wherever the layer does not run that GEMV,
    and where it has forward hooks (LoRA), the layer runs."""
    if not pre or not _plain_o_proj(lin, x.dtype) or _hooked(lin):
        return lin(x)
    from octavo.plugins.platforms.cuda_moe_oproj import gemv_early

    bn, bk, warps = tile
    if bk is None:  # only where the layer runs cuda_fusions' GEMV (not cuBLAS: OCTAVO_TRITON_GEMV=0)
        from octavo.plugins.platforms.cuda_allreduce_gemv import plain_gemv_config

        engine = plain_gemv_config(*lin.weight.shape, lin.weight.dtype, lin.weight.device)
        if engine is None or type(lin.quant_method).__name__ != "TritonGemvLinearMethod":
            return lin(x)
        bk = engine["BLOCK_K"]
    return gemv_early(x, lin.weight, pre, bn, bk, warps)


def _hooked(lin) -> bool:
    """Whether calling the layer does more than its GEMV: forward hooks (LoRA adds its delta in one,
    octavo.lora.manager) or an instance forward. Then the early GEMV would drop that work: the layer runs."""
    return bool(lin._forward_hooks or lin._forward_pre_hooks or "forward" in vars(lin))


def _plain_o_proj(o, dtype: torch.dtype | None = None) -> bool:
    """An o_proj that is one bias-free, dense (unquantized: the platform's GEMV method subclasses it), unsharded
    GEMV of 16-bit weights, of the activations' dtype when given (what gemv_early runs)."""
    from octavo.nn.linear import UnquantizedLinearMethod

    w = getattr(o, "weight", None)
    return (isinstance(w, torch.Tensor) and getattr(o, "bias", None) is None and getattr(o, "tp_size", 1) == 1
            and isinstance(getattr(o, "quant_method", None), UnquantizedLinearMethod)
            and w.dtype in (torch.float16, torch.bfloat16) and (dtype is None or w.dtype == dtype)
            and w.dim() == 2 and w.is_contiguous())


def eligible(m) -> bool:
    """A Qwen3 attention with plain RMSNorm q/k norms and a full-width plain rotary, head size a power of two."""
    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.rotary import RotaryEmbedding

    rope = getattr(m, "rotary_emb", None)
    head = getattr(m, "head_dim", 0)
    return (type(getattr(m, "q_norm", None)) is RMSNorm and type(getattr(m, "k_norm", None)) is RMSNorm
            and type(rope) is RotaryEmbedding and rope.rotary_dim == head == rope.head_size
            and head >= 32 and head & (head - 1) == 0 and m.q_norm.eps == m.k_norm.eps
            and m.num_heads % m.num_kv_heads == 0 and m.attn.sliding_window is None
            and m.attn.logits_soft_cap is None)


@torch.inference_mode()
def check(m, dtype: torch.dtype, device: torch.device, ctx_len: int = 77, page: int = 16) -> str | None:
    """The one launch against the module's previous forward's q/k/v path on the triton backend's own kernels
    (a private cache and metadata, random qkv), ``None`` when they agree; else why not."""
    from octavo.plugins.attention.triton import TritonAttentionBackend, TritonAttentionMetadata
    from octavo.plugins.platforms.cuda_qk_norm_rope import close

    gen = torch.Generator(device=device).manual_seed(7)
    hq, hk, d = m.num_heads, m.num_kv_heads, m.head_dim
    blocks = -(-ctx_len // page) + 1
    cache = (torch.randn(2, blocks, page, hk, d, generator=gen, device=device) * 2).to(dtype)
    cache2 = cache.clone()
    qkv = (torch.randn(1, (hq + 2 * hk) * d, generator=gen, device=device) * 3).to(dtype)
    table = torch.randperm(blocks, generator=gen, device=device).to(torch.int32)[None]
    pos = torch.tensor([ctx_len - 1], device=device)
    slot = table[0, (ctx_len - 1) // page].long() * page + (ctx_len - 1) % page
    md = TritonAttentionMetadata(query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=device),
                                 seq_lens=torch.tensor([ctx_len], dtype=torch.int32, device=device),
                                 block_tables=table, slot_mapping=slot.view(1), block_size=page, max_query_len=1,
                                 max_seq_len=ctx_len, num_reqs=1, num_tokens=1, num_decodes=1)
    try:
        q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
        q = m.q_norm(q.reshape(1, hq, d)).reshape(1, hq * d)
        k = m.k_norm(k.reshape(1, hk, d)).reshape(1, hk * d)
        q, k = m.rotary_emb(pos, q, k)
        impl = TritonAttentionBackend(num_heads=hq, head_size=d, num_kv_heads=hk, scale=m.attn.scale)
        want = impl.forward(q.view(1, hq, d), k.view(1, hk, d), v.reshape(1, hk, d), cache, md).reshape(1, hq * d)
        saved_cache, m.attn.kv_cache = m.attn.kv_cache, cache2
        try:
            got = one_launch(m, pos, qkv, md)
        finally:
            m.attn.kv_cache = saved_cache
    except Exception as e:  # noqa: BLE001 - a shape or build the kernel cannot run: keep the previous forward
        return f"{type(e).__name__}: {e}"
    if not close(got, want):
        return f"attention output differs (max abs {float((got.float() - want.float()).abs().max()):.3g})"
    if not close(cache2, cache):
        return "the stored K/V differ from the backend's"
    return None


def install_decode_attention(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> int:
    """Give eligible Qwen3 attention modules the batch-1 one-launch forward; returns how many (0 when off)."""
    if not enabled() or dtype not in (torch.float16, torch.bfloat16) or torch.version.hip is not None:
        return 0
    from octavo.plugins.models.qwen3 import Qwen3Attention

    count, verdict = 0, {}
    for m in model.modules():
        if not isinstance(m, Qwen3Attention) or "_attn_one" in vars(m) or not eligible(m):
            continue
        key = (m.num_heads, m.num_kv_heads, m.head_dim, bool(m.rotary_emb.is_neox_style), id(m.rotary_emb.cos_cache))
        m._attn_one = {"on": True, **DEFAULTS}
        if key not in verdict:
            verdict[key] = check(m, dtype, device)
            if verdict[key] is not None:
                logger.warning("batch-1 one-launch attention not used: %s", verdict[key])
        if verdict[key] is not None:
            del m._attn_one
            continue
        prev = m.__dict__.get("forward")
        m._attn_one_prev = prev if prev is not None else types.MethodType(type(m).forward, m)
        m.forward = types.MethodType(_forward, m)
        count += 1
    return count


def set_attn_one(model: torch.nn.Module, **settings) -> int:
    """Change the launch settings (``on``, ``splits``, ``block_n``, ``num_warps``, ``early``, ``dot16``) of every installed module; a
    CUDA graph captured afterwards uses them. Returns how many modules changed."""
    bad = set(settings) - {"on", *DEFAULTS}
    if bad:
        raise ValueError(f"unknown one-launch attention settings {sorted(bad)}")
    mods = [m for m in model.modules() if "_attn_one" in vars(m)]
    for key, lin in (("o_early", "o_proj"), ("q_early", "qkv_proj")):  # refused, not ignored, where not one plain GEMV
        bad = [getattr(getattr(m, lin), "prefix", lin) for m in mods if settings.get(key) and not _plain_o_proj(getattr(m, lin))]
        if bad:
            raise ValueError(f"{key} needs a bias-free, dense, unsharded 16-bit {lin}; not {bad[:3]}")
    for m in mods:
        m._attn_one.update(settings)
    return len(mods)
