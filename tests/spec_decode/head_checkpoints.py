"""Builders for the head-speculator tests: tiny Llama targets and Medusa / MLP-speculator checkpoints written in
the layouts the plugins load (vLLM's Medusa, FasterDecoding's original Medusa, IBM's MLP speculator).

Two kinds of heads:
- random weights (shapes only): every draft is almost surely rejected, so the engine's output must still be
  the target's (exactness, rollback);
- "oracle" weights computed from the target: on the **shift target** (attention and MLP outputs zeroed, so
  the residual stream is the token's embedding and the next token is ``perm[token]``) they draft exactly
  the target's greedy chain (acceptance ~100%: the proposal path is wired end to end); on a random target
  they draft the target's single-token bigram guess (acceptance between 0 and 1).
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
import transformers as T
from safetensors.torch import save_file

from octavo.testing.model import randomize_

TINY = dict(vocab_size=96, hidden_size=128, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=False)


def make_target(path: str, kind: str) -> dict:
    """``kind`` "shift": next token = perm[token] exactly; "random": a random-weight Llama. Returns the
    tensors the oracle heads are built from (embedding, lm_head, final norm, perm)."""
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY)).float()
    randomize_(model, std=0.08 if kind == "shift" else 0.3)
    V, H = TINY["vocab_size"], TINY["hidden_size"]
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if kind == "shift":
            # orthonormal, zero-mean embeddings; no attention/MLP output; lm_head row perm[x] = e_x
            a = torch.randn(H, V, generator=torch.Generator().manual_seed(2))
            a -= a.mean(0, keepdim=True)
            e = torch.linalg.qr(a).Q.T  # [V, H]
            model.model.embed_tokens.weight.copy_(e)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
            model.model.norm.weight.fill_(1.0)
            model.lm_head.weight.copy_(e[torch.argsort(perm)])
    model.save_pretrained(path)
    return {"embed": model.model.embed_tokens.weight.detach().clone(), "lm_head": model.lm_head.weight.detach().clone(),
            "perm": perm, "model": model}


def next_token_map(target: dict) -> torch.Tensor:
    """f[x] = the target's greedy next token after the one-token prompt [x] (exactly perm on the shift target)."""
    V = TINY["vocab_size"]
    with torch.no_grad():
        return target["model"](torch.arange(V).view(V, 1)).logits[:, -1].argmax(-1)


def _power(f: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.arange(len(f))
    for _ in range(n):
        out = f[out]
    return out


def class_rows(vectors: torch.Tensor, labels: torch.Tensor, V: int) -> torch.Tensor:
    """Row y = sum of the unit vectors whose label is y: argmax_y <row_y, v_x> picks x's label when the
    vectors are nearly orthogonal."""
    unit = vectors / vectors.norm(dim=-1, keepdim=True)
    return torch.zeros(V, vectors.shape[1]).index_add_(0, labels, unit)


def write_medusa(path: str, num_heads: int, num_layers: int = 1, target: dict | None = None,
                 layout: str = "vllm", seed: int = 0, vocab_size: int | None = None,
                 hidden_size: int | None = None) -> None:
    """A Medusa checkpoint: random, or the oracle (identity residual blocks; lm_head_i maps the token the target
    would emit to its f^(i+1) image)."""
    V, H = vocab_size or TINY["vocab_size"], hidden_size or TINY["hidden_size"]
    if target is not None:
        V, H = target["lm_head"].shape
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(num_heads):
        for j in range(num_layers):
            zero = target is not None
            state[f"blocks.{i}.layers.{j}.weight"] = torch.zeros(H, H) if zero else torch.randn(H, H, generator=gen) * 0.05
            state[f"blocks.{i}.layers.{j}.bias"] = torch.zeros(H) if zero else torch.randn(H, generator=gen) * 0.05
        if target is None:
            state[f"lm_heads.{i}.weight"] = torch.randn(V, H, generator=gen) * 0.05
        else:
            f = next_token_map(target)
            state[f"lm_heads.{i}.weight"] = class_rows(target["lm_head"], _power(f, i + 1), V)
    os.makedirs(path, exist_ok=True)
    if layout == "vllm":
        cfg = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": H, "vocab_size": V,
               "num_heads": num_heads, "num_hidden_layers": num_layers, "medusa_fc_bias": True}
        save_file({f"medusa_heads.{k}": v.contiguous() for k, v in state.items()},
                  os.path.join(path, "model.safetensors"))
    else:  # FasterDecoding: {i}.{j}.linear.*, {i}.{L}.weight in medusa_lm_head.safetensors
        cfg = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": "x"}
        orig = {}
        for k, v in state.items():
            p = k.split(".")
            orig[f"{p[1]}.{p[3]}.linear.{p[4]}" if p[0] == "blocks" else f"{p[1]}.{num_layers}.weight"] = v
        save_file({k: v.contiguous() for k, v in orig.items()}, os.path.join(path, "medusa_lm_head.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)


def write_mlp_speculator(path: str, n_predict: int, target: dict | None = None, tie_weights: bool = False,
                         scale_input: bool = False, seed: int = 0, vocab_size: int | None = None,
                         emb_dim: int | None = None) -> None:
    """An MLP-speculator checkpoint: random, or the oracle (projections zero, so each stage sees only the last
    token's embedding; head_i maps it to f of that token)."""
    V, H = vocab_size or TINY["vocab_size"], emb_dim or TINY["hidden_size"]
    gen = torch.Generator().manual_seed(seed)
    stages = 1 if tie_weights else n_predict
    state = {}
    for i in range(stages):
        if target is None:
            emb = torch.randn(V, H, generator=gen)
            head = torch.randn(V, H, generator=gen) * 0.05
            w, b = 1 + 0.1 * torch.randn(H, generator=gen), 0.1 * torch.randn(H, generator=gen)
        else:
            emb = target["embed"]
            w, b = torch.ones(H), torch.zeros(H)
            s = F.gelu(emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6))
            head = class_rows(s, next_token_map(target), V)
        state[f"emb.{i}.weight"], state[f"head.{i}.weight"] = emb, head
        state[f"ln.{i}.weight"], state[f"ln.{i}.bias"] = w, b
    for i in range(min(n_predict, 2) if tie_weights else n_predict):
        proj = torch.zeros(H, H) if target is not None else torch.randn(H, H, generator=gen) * 0.05
        state[f"proj.{i}.weight"] = proj
    os.makedirs(path, exist_ok=True)
    save_file({f"speculator.{k}": v.clone().contiguous() for k, v in state.items()}, os.path.join(path, "model.safetensors"))
    cfg = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", "emb_dim": H,
           "inner_dim": H, "n_predict": n_predict, "vocab_size": V, "top_k_tokens_per_head": [1] * n_predict,
           "n_candidates": 1, "tie_weights": tie_weights, "scale_input": scale_input}
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)


def write_eagle(path: str, version: int, target: dict | None = None, seed: int = 0, draft_vocab: int | None = None,
                aux_layers: tuple | None = (0, 1, 1), shape: tuple | None = None) -> None:
    """An EAGLE-1 / EAGLE-3 head for the tiny targets: random, or the oracle for the shift target (attention
    and MLP outputs zero, so the layer passes its input through): EAGLE-1's fc keeps the embedding of the
    next token (the target's lm_head then gives its successor: every draft right); EAGLE-3's fc keeps the
    aux feature entering layer 0 (the current token) and its lm_head, over a permuted draft vocabulary
    (d2t), names the token two ahead (its first draft right)."""
    # shape: (vocab, hidden, heads, kv heads, intermediate); default the tiny targets'
    V, H, nh, nkv, inter = shape or (TINY["vocab_size"], TINY["hidden_size"], 4, 2, 160)
    hd = H // nh
    dv = draft_vocab or V
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.05):
        return torch.randn(*shape, generator=gen) * std

    layer = {"self_attn.q_proj.weight": rnd(nh * hd, (2 if version == 3 else 1) * H),
             "self_attn.k_proj.weight": rnd(nkv * hd, (2 if version == 3 else 1) * H),
             "self_attn.v_proj.weight": rnd(nkv * hd, (2 if version == 3 else 1) * H),
             "self_attn.o_proj.weight": rnd(H, nh * hd), "mlp.gate_proj.weight": rnd(inter, H),
             "mlp.up_proj.weight": rnd(inter, H), "mlp.down_proj.weight": rnd(H, inter),
             "post_attention_layernorm.weight": 1 + rnd(H)}
    if version == 3:
        layer["input_layernorm.weight"], layer["hidden_norm.weight"] = 1 + rnd(H), 1 + rnd(H)
    if target is not None:
        layer["self_attn.o_proj.weight"].zero_()
        layer["mlp.down_proj.weight"].zero_()
    state = {}
    cfg = {"hidden_size": H, "num_attention_heads": nh, "num_key_value_heads": nkv, "intermediate_size": inter,
           "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V,
           "max_position_embeddings": 512, "hidden_act": "silu"}
    if version == 1:
        cfg["architectures"] = ["LlamaForCausalLM"]
        state.update({f"layers.0.{k}": v for k, v in layer.items()})
        state["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, H)], 1) if target is not None else rnd(H, 2 * H)
    else:
        cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=dv)
        if aux_layers is not None:  # else the target's layers 2, N/2, N-3
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layers)}
        state.update({f"midlayer.{k}": v for k, v in layer.items()})
        sigma = torch.randperm(V, generator=gen)[:dv].sort().values if dv < V else torch.randperm(V, generator=gen)
        state["d2t"] = sigma - torch.arange(dv)
        state["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, sigma, True)
        state["norm.weight"] = torch.ones(H) if target is not None else 1 + rnd(H)
        if target is not None:
            state["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, 2 * H)], 1)
            perm = target["perm"]
            inv2 = torch.argsort(perm[perm])  # x such that perm(perm(x)) = y
            state["lm_head.weight"] = target["embed"][inv2[sigma]]
        else:
            state["fc.weight"] = rnd(H, 3 * H)
            state["lm_head.weight"] = rnd(dv, H)
    os.makedirs(path, exist_ok=True)
    save_file({k: v.clone().contiguous() for k, v in state.items()}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)
