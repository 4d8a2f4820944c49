"""The ``mlp_speculator`` proposer: IBM's MLP speculator (Wertheimer et al. 2024, "Accelerating Production
LLMs with Combined Token/Embedding Speculators"; checkpoints ``ibm-fms/*-accelerator``).

A chain of ``n_predict`` small stages. Stage ``i`` mixes the running state (at first the target's last
hidden state) with the embedding of the token drafted before it, then predicts the next token::

    state = ln0(h_t) / sqrt(2)            (only with scale_input)
    for i in 0..k-1:
        state = proj_i(state) + emb_i(last_token) * emb_weight / state_weight
        state = GELU(ln_i(state))         (ln: RMS-normalise, then weight * x + bias)
        last_token = argmax(head_i(state))          -> draft i

with ``state_weight = 0.5 ** (0.5 / n_predict)`` and ``emb_weight = sqrt((1 - state_weight**2) * inner_dim / 2)``,
as in fms-extras and vLLM. Checkpoint (``config.json`` + ``*.safetensors``, keys optionally prefixed
``speculator.``): ``emb.{i}.weight`` [vocab, inner], ``proj.{i}.weight`` ([inner, emb_dim] for i=0, else
[inner, inner]), ``head.{i}.weight`` [vocab, inner], ``ln.{i}.weight`` / ``ln.{i}.bias`` [inner]. With
``tie_weights`` every stage shares ``emb.0``, ``head.0``, ``ln.0`` and the stages after the first share
``proj.1`` (copies stored under the other indices are accepted and must be equal).
"""

from __future__ import annotations

import math
import re

from octavo.spec_heads import (
    DraftHead,
    HeadSpeculator,
    check_dense_head,
    checkpoint_dir,
    load_exact,
    read_config,
    read_state_dict,
)


def _build(cfg: dict):
    import torch
    from torch import nn

    n, emb_dim, vocab = cfg["n_predict"], cfg["emb_dim"], cfg["vocab_size"]
    inner = cfg.get("inner_dim") or emb_dim
    tied, scale_input = bool(cfg.get("tie_weights")), bool(cfg.get("scale_input"))

    class LayerNorm(nn.Module):  # MLPSpeculatorLayerNorm: an RMS norm with an optional scale and shift
        def __init__(self, dim: int, affine: bool) -> None:
            super().__init__()
            self.affine = affine
            if affine:
                self.weight = nn.Parameter(torch.empty(dim))
                self.bias = nn.Parameter(torch.empty(dim))

        def forward(self, x):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * x + self.bias if self.affine else x

    class MLPSpeculator(nn.Module, DraftHead):
        def __init__(self) -> None:
            super().__init__()
            self.max_drafts = n
            if tied:
                if n < 2:
                    raise ValueError("MLP speculator config: tie_weights needs n_predict > 1")
                emb, head, ln = nn.Embedding(vocab, inner), nn.Linear(inner, vocab, bias=False), LayerNorm(inner, True)
                proj_tied = nn.Linear(inner, inner, bias=False)
                self.emb = nn.ModuleList([emb] * n)
                self.proj = nn.ModuleList([nn.Linear(emb_dim, inner, bias=False)] + [proj_tied] * (n - 1))
                self.head = nn.ModuleList([head] * n)
                self.ln = nn.ModuleList([ln] * n)
            else:
                self.emb = nn.ModuleList(nn.Embedding(vocab, inner) for _ in range(n))
                self.proj = nn.ModuleList(nn.Linear(emb_dim if i == 0 else inner, inner, bias=False) for i in range(n))
                self.head = nn.ModuleList(nn.Linear(inner, vocab, bias=False) for _ in range(n))
                self.ln = nn.ModuleList(LayerNorm(inner, True) for _ in range(n))
            self.ln0 = LayerNorm(emb_dim, False) if scale_input else None
            self.state_weight = 0.5 ** (0.5 / n)
            self.emb_weight = math.sqrt((1 - self.state_weight ** 2) * (inner / 2))
            self.act = nn.GELU()

        @torch.inference_mode()
        def propose(self, hidden, last_tokens, num_drafts: int):
            state = hidden if self.ln0 is None else self.ln0(hidden) / math.sqrt(2)
            last, outs = last_tokens, []
            for i in range(num_drafts):
                state = self.proj[i](state) + self.emb[i](last) * (self.emb_weight / self.state_weight)
                state = self.act(self.ln[i](state))
                last = self.head[i](state).argmax(-1)
                outs.append(last)
            return torch.stack(outs, dim=1)

    return MLPSpeculator()


def _untie(state: dict, n: int) -> dict:
    """With tie_weights the module owns ``emb.0``, ``head.0``, ``ln.0``, ``proj.0``, ``proj.1``; other indices
    stored in the file must repeat them."""
    import torch

    out = {}
    for name, t in state.items():
        m = re.fullmatch(r"(emb|head|ln|proj)\.(\d+)\.(weight|bias)", name)
        if m and int(m[2]) > (1 if m[1] == "proj" else 0):
            owner = f"{m[1]}.{1 if m[1] == 'proj' else 0}.{m[3]}"
            if owner in state and not torch.equal(state[owner], t):
                raise ValueError(f"MLP speculator: tie_weights is set but {name} differs from {owner}")
            if owner not in state:
                out[owner] = t
            continue
        out[name] = t
    return out


class MLPSpeculatorProposer(HeadSpeculator):
    name = "mlp_speculator"

    @classmethod
    def check(cls, config, settings, platform, vocab_size: int) -> None:
        cfg = read_config(checkpoint_dir(config.model))
        for key in ("n_predict", "emb_dim", "vocab_size"):
            if key not in cfg:
                raise ValueError(f"MLP speculator config.json of {config.model!r} has no {key!r}")
        if config.num_speculative_tokens > cfg["n_predict"]:
            raise ValueError(f"speculative_config num_speculative_tokens={config.num_speculative_tokens} but the "
                             f"MLP speculator {config.model!r} predicts n_predict={cfg['n_predict']} tokens")
        check_dense_head(config, cfg["vocab_size"], vocab_size, f"MLP speculator {config.model!r}", "MLP speculators")

    @classmethod
    def load_head(cls, config, *, hidden_size: int, vocab_size: int, device, dtype, target=None,
                  **_) -> DraftHead:
        path = checkpoint_dir(config.model)
        cfg = read_config(path)
        if cfg["emb_dim"] != hidden_size:
            raise ValueError(f"MLP speculator {config.model!r} has emb_dim={cfg['emb_dim']} but the target's "
                             f"hidden size is {hidden_size}")
        state = {k.removeprefix("speculator."): v for k, v in read_state_dict(path).items()}
        if cfg.get("tie_weights"):
            state = _untie(state, cfg["n_predict"])
        head = _build(cfg)
        load_exact(head, state, f"MLP speculator ({config.model})")
        return head.to(device=device, dtype=dtype).eval()
