"""The torch side of the EAGLE heads (see ``eagle.py`` for the method and the checkpoint layouts).

Attention keeps a dense K/V buffer per request indexed by position (grown by doubling) with a ``known`` mask:
positions never fed (a prefix-cache hit the target skipped) are masked out, which can only lower acceptance,
never change the output (the engine verifies every draft). Requests are processed one by one (small
matmuls); the target's forward dominates a step at the batch sizes where speculation is on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.spec_heads import DraftHead


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class _Layer(nn.Module):
    """One Llama decoder layer (EAGLE-1: no input norm; EAGLE-3: q/k/v over [embeds; hidden], two input norms)."""

    def __init__(self, cfg: dict, v3: bool) -> None:
        super().__init__()
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv, hd = cfg.get("num_key_value_heads") or nh, cfg.get("head_dim") or H // nh
        bias, eps = bool(cfg.get("attention_bias", False)), cfg.get("rms_norm_eps", 1e-6)
        qkv_in = 2 * H if v3 else H
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(qkv_in, nh * hd, bias=bias)
        self.self_attn.k_proj = nn.Linear(qkv_in, nkv * hd, bias=bias)
        self.self_attn.v_proj = nn.Linear(qkv_in, nkv * hd, bias=bias)
        self.self_attn.o_proj = nn.Linear(nh * hd, H, bias=bias)
        mlp_bias, inter = bool(cfg.get("mlp_bias", False)), cfg["intermediate_size"]
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, inter, bias=mlp_bias)
        self.mlp.up_proj = nn.Linear(H, inter, bias=mlp_bias)
        self.mlp.down_proj = nn.Linear(inter, H, bias=mlp_bias)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"EAGLE head hidden_act={cfg.get('hidden_act')!r}: only 'silu' (Llama) is supported")
        self.post_attention_layernorm = RMSNorm(H, eps)
        if v3:
            self.input_layernorm = RMSNorm(H, eps)
            self.hidden_norm = RMSNorm(H, eps)


class EagleHead(nn.Module, DraftHead):
    def __init__(self, cfg: dict, version: int, target, target_hidden: int, vocab_size: int, state: dict,
                 max_drafts: int, max_num_tokens: int = 8192) -> None:
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.v3 = version == 3
        self.max_drafts = max_drafts
        H = cfg["hidden_size"]
        if not self.v3 and H != target_hidden:
            raise ValueError(f"EAGLE head hidden_size={H} but the target's hidden size is {target_hidden}")
        self.layers = nn.ModuleList([_Layer(cfg, self.v3)])
        fc_in = 3 * (cfg.get("target_hidden_size") or target_hidden) if self.v3 else 2 * H
        self.fc = nn.Linear(fc_in, H, bias=any(k.removeprefix("model.") == "fc.bias" for k in state))
        if any(k.removeprefix("model.") == "embed_tokens.weight" for k in state):
            self.embed_tokens = nn.Embedding(vocab_size, H)
        else:
            self._target_embed = [target.model.embed_tokens]  # shared with the target, not loaded
        if self.v3:
            self.draft_vocab = cfg.get("draft_vocab_size") or vocab_size
            self.norm = RMSNorm(H, cfg.get("rms_norm_eps", 1e-6))
            self.lm_head = nn.Linear(H, self.draft_vocab, bias=False)
            self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.int64))
            n = len(target.model.layers)
            ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or (2, n // 2, n - 3)
            if len(ids) != 3 or fc_in != 3 * target_hidden:
                raise ValueError(f"EAGLE-3 head: fc takes {fc_in} features, the target gives 3 x {target_hidden} "
                                 f"(aux layers {list(ids)})")
            self._aux = torch.zeros(0, fc_in)
            self._aux_layers = list(ids)
            self._target_layers = [target.model.layers]
            self._max_num_tokens = max_num_tokens
        self._target_logits = [target.compute_logits]
        rope_cfg = {k: cfg[k] for k in ("rope_theta", "rope_scaling", "max_position_embeddings", "head_dim",
                                        "partial_rotary_factor") if k in cfg}
        self.rotary = LlamaRotaryEmbedding(config=LlamaConfig(
            hidden_size=H, num_attention_heads=cfg["num_attention_heads"], **rope_cfg))
        self.kv: dict[str, list] = {}  # request id -> [K, V, known]

    # ---- loading ---------------------------------------------------------------------------------
    def trainable(self) -> nn.Module:
        return self

    def rename(self, state: dict) -> dict:
        out = {}
        for name, t in state.items():
            name = name.removeprefix("model.").replace("midlayer.", "layers.0.")
            if name == "d2t":
                self.d2t.copy_(t.to(torch.int64))
            elif name == "t2d" or (name == "embed_tokens.weight" and not hasattr(self, "embed_tokens")):
                continue
            else:
                out[name] = t
        return out

    def ready(self) -> EagleHead:
        """After ``.to(device, dtype)``: the aux-feature buffer and the target-layer hooks (EAGLE-3). The hooks
        copy into a fixed buffer, so a CUDA graph captured afterwards writes where the head reads."""
        self.rotary.float()  # rotary angles in float32 whatever the head's dtype (as transformers computes them)
        if self.v3:
            p = self.fc.weight
            self._aux = torch.zeros(self._max_num_tokens, self.fc.in_features, device=p.device, dtype=p.dtype)
            width = self.fc.in_features // 3
            for i, layer_id in enumerate(self._aux_layers):
                self._target_layers[0][layer_id].register_forward_pre_hook(self._hook(i * width, width))
        return self

    def _hook(self, col: int, width: int):
        def capture(module, args):
            hidden, residual = args[1], args[2]
            x = hidden if residual is None else hidden + residual
            self._aux[: x.shape[0], col:col + width].copy_(x)
        return capture

    # ---- running ---------------------------------------------------------------------------------
    def embed(self, ids):
        return self.embed_tokens(ids) if hasattr(self, "embed_tokens") else self._target_embed[0](ids)

    def logits(self, out):
        if not self.v3:
            return self._target_logits[0](out)
        return self.lm_head(self.norm(out))

    def to_target_ids(self, ids):
        return ids + self.d2t[ids] if self.v3 else ids

    def reset(self, request_ids) -> None:
        for rid in request_ids:
            self.kv.pop(rid, None)

    def _attend(self, rid: str, q, k, v, pos):
        K, V, known = self.kv.get(rid) or (None, None, None)
        top = int(pos.max()) + 1
        if K is None or K.shape[0] < top:
            cap = max(64, 1 << (top - 1).bit_length())
            nK = k.new_zeros(cap, *k.shape[1:])
            nV, nknown = nK.clone(), torch.zeros(cap, dtype=torch.bool, device=k.device)
            if K is not None:
                nK[: K.shape[0]], nV[: K.shape[0]], nknown[: K.shape[0]] = K, V, known
            K, V, known = nK, nV, nknown
            self.kv[rid] = [K, V, known]
        K[pos], V[pos], known[pos] = k, v, True
        keys = torch.arange(top, device=k.device)
        mask = known[:top].unsqueeze(0) & (keys.unsqueeze(0) <= pos.unsqueeze(1))  # [n, top]
        rep = self.layers[0].nh // self.layers[0].nkv
        kk = K[:top].repeat_interleave(rep, dim=1).transpose(0, 1)  # [nh, top, hd]
        vv = V[:top].repeat_interleave(rep, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), kk, vv, attn_mask=mask.unsqueeze(0))
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def run(self, rid: str, tokens, feat, pos):
        """One pass of the layer at positions ``pos`` for one request; returns the next feature [n, H]."""
        L = self.layers[0]
        emb = self.embed(tokens)
        if self.v3:
            residual = feat
            h = torch.cat([L.input_layernorm(emb), L.hidden_norm(feat)], dim=-1)
        else:
            h = residual = self.fc(torch.cat([emb, feat], dim=-1))
        n = h.shape[0]
        q = L.self_attn.q_proj(h).view(n, L.nh, L.hd)
        k = L.self_attn.k_proj(h).view(n, L.nkv, L.hd)
        v = L.self_attn.v_proj(h).view(n, L.nkv, L.hd)
        cos, sin = self.rotary(h, pos.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1).to(q.dtype), sin[0].unsqueeze(1).to(q.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        residual = L.self_attn.o_proj(self._attend(rid, q, k, v, pos)) + residual
        x = L.post_attention_layernorm(residual)
        return L.mlp.down_proj(F.silu(L.mlp.gate_proj(x)) * L.mlp.up_proj(x)) + residual

    @torch.inference_mode()
    def feed(self, hidden, feeds: list, num_drafts: int) -> dict:
        """``feeds``: (request id, start position, next token ids [n] (device), flat rows [n] (device), draft?)
        per request -> {request id: int64 device tensor of drafts} for those that draft."""
        out = {}
        for rid, start, nxt, rows, propose in feeds:
            if self.v3:
                feat = self.fc(self._aux.index_select(0, rows))
            else:
                feat = hidden.index_select(0, rows)
            pos = torch.arange(start, start + nxt.shape[0], device=nxt.device)
            h = self.run(rid, nxt, feat, pos)
            if not propose or num_drafts <= 0:
                continue
            last, p, drafts = h[-1:], start + nxt.shape[0] - 1, []
            for j in range(num_drafts):
                d = self.to_target_ids(self.logits(last).argmax(-1))
                drafts.append(d)
                if j + 1 < num_drafts:
                    last = self.run(rid, d, last, torch.tensor([p + j + 1], device=d.device))
            out[rid] = torch.cat(drafts)
        return out

    def propose(self, hidden, last_tokens, num_drafts: int):
        raise NotImplementedError("EAGLE heads are stateful: the runner calls feed() every step")
