"""Token embeddings and the LM head, split over the vocabulary for tensor parallelism.

Each rank holds rows ``[rank * V/tp, (rank + 1) * V/tp)`` of the (padded) vocabulary. The embedding looks up
the ids it owns, zeroes the rest and all-reduces; the LM head computes its slice of the logits and
all-gathers. The vocabulary is padded only to a multiple of the tensor-parallel size, and logits are cut
back to ``num_embeddings``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.nn.linear import set_weight_attrs
from octavo.nn.parallel import get_tp_rank, get_tp_size, tp_all_gather, tp_all_reduce


class VocabParallelEmbedding(nn.Module):
    """``ids [n] -> [n, embedding_dim]`` with the table split over ranks by vocabulary rows."""

    def __init__(self, num_embeddings: int, embedding_dim: int, prefix: str = "") -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings_padded = -(-num_embeddings // self.tp_size) * self.tp_size
        self.shard_size = self.num_embeddings_padded // self.tp_size
        self.vocab_start = self.tp_rank * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, embedding_dim), requires_grad=False)
        set_weight_attrs(self.weight, weight_loader=self.weight_loader, output_dim=0)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.num_embeddings or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(f"embedding of shape {tuple(loaded.shape)} does not match vocab_size="
                             f"{self.num_embeddings}, hidden={self.embedding_dim} of the config")
        rows = loaded[self.vocab_start:self.vocab_start + self.shard_size]
        param.data[: rows.shape[0]].copy_(rows)
        param.data[rows.shape[0]:].zero_()  # padding rows: never looked up, zero logits are cut away

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        owned = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight)
        out = out * owned.unsqueeze(-1).to(out.dtype)
        return tp_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection ``hidden -> logits`` sharing the embedding's vocabulary split.

    Use :meth:`tie_weights` for models with ``tie_word_embeddings``: the head then reuses the embedding's
    parameter and the checkpoint's ``lm_head.weight`` (if any) is ignored.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False, prefix: str = "") -> None:
        super().__init__(num_embeddings, embedding_dim, prefix)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.shard_size), requires_grad=False)
            set_weight_attrs(self.bias, weight_loader=self._bias_loader, output_dim=0)
        else:
            self.register_parameter("bias", None)
        from octavo.quant import lm_head_method  # a quantizer may compute logits from its own copy

        self.logits_method = lm_head_method()

    def process_weights_after_loading(self) -> None:
        if self.logits_method is not None:
            self.logits_method.process_weights_after_loading(self)

    def _bias_loader(self, param, loaded, shard_id=None):
        rows = loaded[self.vocab_start:self.vocab_start + self.shard_size]
        param.data[: rows.shape[0]].copy_(rows)
        param.data[rows.shape[0]:].zero_()

    def tie_weights(self, embedding: VocabParallelEmbedding) -> ParallelLMHead:
        """Share ``embedding``'s weight (same storage, loaded once)."""
        self.weight = embedding.weight
        return self

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[n, hidden] -> [n, num_embeddings]`` float32 logits, gathered over ranks."""
        if self.logits_method is not None:
            logits = self.logits_method.apply(self, hidden_states, self.bias)
        else:
            logits = F.linear(hidden_states, self.weight, self.bias)
        logits = tp_all_gather(logits)
        return logits[..., : self.num_embeddings].float()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden_states)
