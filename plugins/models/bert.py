"""BERT-family sentence encoders (all-MiniLM-L6-v2, E5, BGE): ``BertModel`` served as an embedding model.

The encoder attends bidirectionally within each request, so it has no paged ``Attention`` layer and no KV
cache: each layer runs torch SDPA over the step's requests padded to the longest one (the engine schedules
pooling requests whole, so a request's tokens all arrive in one step; ``ctx.query_start_loc`` gives the
boundaries). Token types are all 0 (one segment per input).

``pool`` returns the RAW pooled state; L2 normalisation (the default declared in ``pooler_info``) and
Matryoshka truncation are applied per request by the front end (``octavo.pooling``, ``PoolingParams``).

Pooling and normalisation follow the checkpoint's sentence-transformers files, read from the model
directory (``config._name_or_path``): ``modules.json`` (a ``Normalize`` module means L2 normalisation) and
the pooling module's ``config.json`` (``pooling_mode_mean_tokens`` / ``pooling_mode_cls_token`` /
``pooling_mode_max_tokens``). Without them: CLS pooling, normalised. ``matryoshka_dimensions`` in
``config.json`` (or ``config_sentence_transformers.json``) declares which truncated sizes are meaningful.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octavo.model import ForwardContext
from octavo.nn import (
    ColumnParallelLinear,
    LayerNorm,
    QKVParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)

_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def read_pooling_config(directory: str | None) -> dict[str, Any]:
    """``{"mode": "mean"|"cls"|"max", "normalize": bool, "matryoshka_dimensions": list|None}`` for a model dir."""
    out: dict[str, Any] = {"mode": "cls", "normalize": True, "matryoshka_dimensions": None}
    if not directory or not os.path.isdir(directory):
        return out
    modules_path = os.path.join(directory, "modules.json")
    if os.path.isfile(modules_path):
        with open(modules_path) as f:
            modules = json.load(f)
        out["normalize"] = any(m.get("type", "").endswith(".Normalize") for m in modules)
        for m in modules:
            if m.get("type", "").endswith(".Pooling"):
                with open(os.path.join(directory, m.get("path", ""), "config.json")) as f:
                    pooling = json.load(f)
                if pooling.get("pooling_mode_mean_tokens"):
                    out["mode"] = "mean"
                elif pooling.get("pooling_mode_max_tokens"):
                    out["mode"] = "max"
                elif pooling.get("pooling_mode_cls_token"):
                    out["mode"] = "cls"
                else:
                    raise ValueError(f"{directory}: the sentence-transformers pooling config asks for a pooling "
                                     f"mode octavo does not implement ({pooling}); supported: mean, cls, max")
    st_config = os.path.join(directory, "config_sentence_transformers.json")
    if os.path.isfile(st_config):
        with open(st_config) as f:
            out["matryoshka_dimensions"] = json.load(f).get("matryoshka_dimensions")
    return out


class BertSelfAttention(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.head_dim = hidden // heads
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias=True, prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads
        self.dense = RowParallelLinear(hidden, hidden, bias=True, prefix=f"{prefix}.dense")
        self.norm = LayerNorm(hidden, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, gather: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``x [n, H]``; ``gather [B, L]`` flat index of each padded slot; ``valid [B, L]`` real-token mask."""
        b, length = gather.shape
        size = self.num_heads * self.head_dim
        qkv = self.qkv_proj(x)[gather]  # [B, L, 3 * heads * d]
        q, k, v = (t.view(b, length, self.num_heads, self.head_dim).transpose(1, 2) for t in qkv.split(size, -1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])  # [B, heads, L, d]
        out = out.transpose(1, 2).reshape(b, length, size)[valid]  # [n, heads * d]
        return self.norm(self.dense(out), x)[0]  # LayerNorm(dense(attn) + x)


class BertLayer(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.attention = BertSelfAttention(config, prefix=f"{prefix}.attention")
        self.intermediate = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=True,
                                                 prefix=f"{prefix}.intermediate")
        self.output = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=True,
                                        prefix=f"{prefix}.output")
        self.output_norm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if config.hidden_act not in _GELU:
            raise ValueError(f"BERT hidden_act={config.hidden_act!r} is not supported; known: {sorted(_GELU)}")
        self.approximate = _GELU[config.hidden_act]

    def forward(self, x: torch.Tensor, gather: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, gather, valid)
        h = self.output(F.gelu(self.intermediate(x), approximate=self.approximate))
        return self.output_norm(h, x)[0]


class BertModel(nn.Module):
    """A BERT encoder that returns one embedding per request (``pool``), no logits.

    Args:
        config: a transformers ``BertConfig`` (read from a sentence-transformers directory).
        prefix: name prefix of this model's parameters.
    """

    packed_modules_mapping = {"qkv_proj": ["query", "key", "value"]}

    supports_quantization = False  # the loader refuses a quantization setting for this model

    def __init__(self, *, config: Any, prefix: str = "") -> None:
        super().__init__()
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT position_embedding_type={config.position_embedding_type!r} is not supported; "
                             "only 'absolute'")
        self.config = config
        hidden = config.hidden_size
        self.word_embeddings = nn.Parameter(torch.empty(config.vocab_size, hidden), requires_grad=False)
        self.position_embeddings = nn.Parameter(torch.empty(config.max_position_embeddings, hidden),
                                                requires_grad=False)
        self.token_type_embeddings = nn.Parameter(torch.empty(config.type_vocab_size, hidden), requires_grad=False)
        self.embeddings_norm = LayerNorm(hidden, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(config, prefix=f"encoder.layer.{i}")
                                    for i in range(config.num_hidden_layers))
        pooling = read_pooling_config(getattr(config, "_name_or_path", None))
        self.pooling_mode, self.normalize = pooling["mode"], pooling["normalize"]
        self.matryoshka_dimensions = pooling["matryoshka_dimensions"] or getattr(config, "matryoshka_dimensions", None)
        self.embedding_dim = hidden
        # the defaults the front end applies to ``pool``'s raw output (octavo.pooling)
        self.pooler_info = {"task": "embed", "tasks": ["embed"], "normalize": self.normalize, "hidden_size": hidden,
                            "matryoshka_dimensions": self.matryoshka_dimensions,
                            "is_matryoshka": bool(getattr(config, "is_matryoshka", False))}

    @staticmethod
    def _padding(query_start_loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts = query_start_loc[:-1].long()
        lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
        length = int(lens.max().item())  # one host read per step: the padded width
        offsets = torch.arange(length, device=starts.device)
        valid = offsets[None, :] < lens[:, None]  # [B, L]
        gather = torch.where(valid, starts[:, None] + offsets[None, :], 0)  # [B, L]
        return gather, valid

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n]`` ids and positions of whole requests -> ``[n, hidden]`` final token states."""
        if ctx.query_start_loc is None:
            raise ValueError("BertModel needs ctx.query_start_loc (request boundaries) to attend within requests")
        gather, valid = self._padding(ctx.query_start_loc)
        x = self.embeddings_norm(self.embed(input_ids, positions, ctx))  # [n, hidden]
        for layer in self.layers:
            x = layer(x, gather, valid)
        return x

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Word + position + token-type embeddings before the norm (one segment: type 0)."""
        x = F.embedding(input_ids, self.word_embeddings) + F.embedding(positions, self.position_embeddings)
        return x + self.token_type_embeddings[0]

    def pool(self, hidden_states: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``[n, hidden]`` -> ``[num_reqs, hidden]``: mean/CLS/max per request (raw; the front end normalises)."""
        qsl = ctx.query_start_loc.long()
        if self.pooling_mode == "cls":
            pooled = hidden_states[qsl[:-1]].float()
        else:
            gather, valid = self._padding(qsl)
            padded = hidden_states[gather].float()  # [B, L, hidden]
            if self.pooling_mode == "mean":
                pooled = (padded * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)
            else:
                pooled = padded.masked_fill(~valid[..., None], float("-inf")).amax(1)
        return pooled

    # checkpoint name fragments -> this model's names
    _RENAMES = [("embeddings.word_embeddings.weight", "word_embeddings"),
                ("embeddings.position_embeddings.weight", "position_embeddings"),
                ("embeddings.token_type_embeddings.weight", "token_type_embeddings"),
                ("embeddings.LayerNorm.", "embeddings_norm."), ("encoder.layer.", "layers."),
                (".attention.output.dense.", ".attention.dense."),
                (".attention.output.LayerNorm.", ".attention.norm."),
                (".intermediate.dense.", ".intermediate."), (".output.dense.", ".output."),
                (".output.LayerNorm.", ".output_norm."), (".gamma", ".weight"), (".beta", ".bias")]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load a BERT checkpoint (with or without the ``bert.`` prefix); heads and the pooler are skipped."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("bert.")
            if name.startswith(("pooler.", "cls.")) or name.endswith("position_ids"):
                continue  # unused by sentence embeddings; a buffer
            shard_id = None
            for part, sid in ((".attention.self.query.", "q"), (".attention.self.key.", "k"),
                              (".attention.self.value.", "v")):
                if part in name:
                    name, shard_id = name.replace(part, ".attention.qkv_proj."), sid
            for old, new in self._RENAMES:
                name = name.replace(old, new)
            if name not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no matching parameter in BertModel")
            param = params[name]
            if shard_id is not None:
                param.weight_loader(param, tensor, shard_id)
            else:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        return loaded

