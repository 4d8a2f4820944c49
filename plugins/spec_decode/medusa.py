"""The ``medusa`` proposer: Medusa heads (Cai et al. 2024) on the target's last hidden state.

Head ``i`` is ``num_hidden_layers`` residual blocks ``x + SiLU(W x + b)`` then its own lm head; from the
hidden state ``h_t`` that produced token ``t+1`` it guesses token ``t+2+i``. So with ``k`` heads one step
drafts ``k`` tokens at once, with no state kept between steps::

    h_t ──▶ ResBlock_0 ──▶ lm_head_0 ──▶ d1 (after the token just emitted)
        ──▶ ResBlock_1 ──▶ lm_head_1 ──▶ d2
        ...

Checkpoint layouts read (``config.json`` + weights in the directory ``speculative_config["model"]``):

- vLLM's (``MedusaModel``): ``blocks.{i}.layers.{j}.weight`` (``.bias`` when ``medusa_fc_bias``),
  ``lm_heads.{i}.weight`` (only ``lm_heads.0`` with ``original_lm_head``), optional ``token_map`` with
  ``truncated_vocab_size`` (the heads' vocabulary is a subset of the target's), optional ``medusa_heads.``
  prefix; config keys ``num_heads`` / ``num_hidden_layers`` (or ``medusa_num_heads`` / ``medusa_num_layers``).
- FasterDecoding's original (``medusa_lm_head.safetensors`` or ``.pt``): ``{i}.{j}.linear.weight/bias`` for
  the blocks and ``{i}.{num_layers}.weight`` for head ``i``'s lm head; hidden size and vocabulary are the
  target's.
"""

from __future__ import annotations

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


def medusa_config(cfg: dict) -> dict:
    """Normalise both config spellings (vLLM maps any key with "num" and "heads"/"layers" the same way)."""
    out = dict(cfg)
    for key in list(cfg):
        if "num" in key and "heads" in key and key != "num_attention_heads":
            out["num_heads"] = cfg[key]
        elif "num" in key and "layers" in key:
            out["num_hidden_layers"] = cfg[key]
    if "num_heads" not in out:
        raise ValueError("Medusa config.json has no 'num_heads' (or 'medusa_num_heads')")
    out.setdefault("num_hidden_layers", 1)
    return out


def convert_original(state: dict, num_layers: int) -> dict:
    """FasterDecoding's ``{i}.{j}.linear.*`` / ``{i}.{L}.weight`` keys -> vLLM's names."""
    out = {}
    for name, t in state.items():
        m = re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", name)
        if m:
            out[f"blocks.{m[1]}.layers.{m[2]}.{m[3]}"] = t
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)\.weight", name)
        if m and int(m[2]) == num_layers:
            out[f"lm_heads.{m[1]}.weight"] = t
            continue
        out[name] = t  # left for load_exact to report
    return out


def _build(cfg: dict, hidden_size: int, vocab_size: int, bias: bool, shared_lm_head: bool, head_vocab: int):
    import torch
    from torch import nn

    class ResidualBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=bias)
                                        for _ in range(cfg["num_hidden_layers"]))
            self.act = nn.SiLU()

        def forward(self, x):
            for layer in self.layers:
                x = x + self.act(layer(x))
            return x

    class MedusaHeads(nn.Module, DraftHead):
        def __init__(self) -> None:
            super().__init__()
            n = cfg["num_heads"]
            self.max_drafts = n
            self.blocks = nn.ModuleList(ResidualBlock() for _ in range(n))
            self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, head_vocab, bias=False)
                                          for _ in range(1 if shared_lm_head else n))
            self.register_buffer("token_map", None)

        @torch.inference_mode()
        def propose(self, hidden, last_tokens, num_drafts: int):
            outs = []
            for i in range(num_drafts):
                lm_head = self.lm_heads[0 if len(self.lm_heads) == 1 else i]
                outs.append(lm_head(self.blocks[i](hidden)).argmax(-1))
            drafts = torch.stack(outs, dim=1)
            return drafts if self.token_map is None else self.token_map[drafts]

    return MedusaHeads()


class MedusaSpeculator(HeadSpeculator):
    name = "medusa"

    @classmethod
    def check(cls, config, settings, platform, vocab_size: int) -> None:
        cfg = medusa_config(read_config(checkpoint_dir(config.model)))
        if config.num_speculative_tokens > cfg["num_heads"]:
            raise ValueError(f"speculative_config num_speculative_tokens={config.num_speculative_tokens} but the "
                             f"Medusa checkpoint {config.model!r} has {cfg['num_heads']} heads (one draft each)")
        check_dense_head(config, cfg.get("vocab_size", vocab_size), vocab_size, f"Medusa checkpoint {config.model!r}",
                         "Medusa heads")

    @classmethod
    def load_head(cls, config, *, hidden_size: int, vocab_size: int, device, dtype, target=None,
                  **_) -> DraftHead:
        import torch

        path = checkpoint_dir(config.model)
        cfg = medusa_config(read_config(path))
        state = read_state_dict(path, ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors"))
        state = {k.removeprefix("medusa_heads."): v for k, v in state.items()}
        if any(re.fullmatch(r"\d+\.\d+\.(linear\.)?weight", k) for k in state):
            state = convert_original(state, cfg["num_hidden_layers"])
        if cfg.get("hidden_size", hidden_size) != hidden_size:
            raise ValueError(f"Medusa checkpoint {config.model!r} has hidden_size={cfg['hidden_size']} but the "
                             f"target has {hidden_size}")
        token_map = state.pop("token_map", None)
        head_vocab = cfg.get("truncated_vocab_size") or vocab_size
        if (token_map is None) != (head_vocab == vocab_size):
            raise ValueError(f"Medusa checkpoint {config.model!r}: truncated_vocab_size={head_vocab} needs a "
                             f"token_map of that length (target vocab {vocab_size}), and a token_map needs it")
        bias = any(k.endswith(".bias") for k in state)
        shared = bool(cfg.get("original_lm_head")) and "lm_heads.1.weight" not in state
        head = _build(cfg, hidden_size, vocab_size, bias, shared, head_vocab)
        load_exact(head, state, f"Medusa ({config.model})")
        if token_map is not None:
            head.token_map = token_map.to(torch.int64)
        return head.to(device=device, dtype=dtype).eval()
