"""``LLM`` methods for pooling models, as vLLM names them: ``embed``, ``encode``, ``classify``, ``score``, ``reward``.

A mixin of :class:`octavo.LLM`. Every method queues pooling requests with a ``PoolingParams`` whose ``task``
says what to do with the model's raw pooled vector (``octavo.pooling``) and steps the engine until all are
done; results come back in input order as vLLM's output classes (``octavo.pooling_outputs``).

    llm = LLM("BAAI/bge-reranker-base")                        # XLMRobertaForSequenceClassification
    llm.score("what is panda?", ["hi", "The giant panda ..."])  # [ScoringRequestOutput(... score=...)]

``score`` runs a cross-encoder on (text_1, text_2) pairs when the model has a one-label head, and the cosine
similarity of the two embeddings when it is an embedding model (both as vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from octavo.pooling_outputs import (
    ClassificationRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from octavo.pooling_params import PoolingParams


class PoolingLLMMethods:
    """vLLM's pooling methods of ``LLM`` (mixed into :class:`octavo.LLM`)."""

    def embed(self, prompts: Any, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              lora_request: Any = None) -> list:
        """Embed each input with an embedding model (its pooling; L2-normalised unless ``normalize=False``).

        Args:
            prompts: a string, token ids, a prompt dict, or a list of them.
            truncate_prompt_tokens: keep only the last k tokens of each input (-1: the model's maximum).
            pooling_params: one ``PoolingParams`` for all inputs or one per input (``dimensions``, ``normalize``).

        Returns:
            One ``EmbeddingRequestOutput`` per input, in order; ``.outputs.embedding`` is the vector.
        """
        return self._pool(prompts, pooling_params, "embed", use_tqdm, truncate_prompt_tokens, lora_request)

    def encode(self, prompts: Any, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
               truncate_prompt_tokens: int | None = None, use_tqdm: bool = True, lora_request: Any = None,
               pooling_task: str | None = None) -> list[PoolingRequestOutput]:
        """vLLM's generic pooling call: ``PoolingRequestOutput`` with ``outputs.data`` a torch tensor.

        Args:
            pooling_task: ``embed``, ``classify``, ``score`` or ``reward``; default: the params' ``task``, else the
                model's own (``embed`` for embedding models, ``classify`` for classifiers). Per-token tasks
                (``token_embed``, ``token_classify``, ``encode``) are refused: octavo pools whole sequences.
        """
        tasks = self._pooling_tasks()
        first = pooling_params[0] if isinstance(pooling_params, Sequence) and pooling_params else pooling_params
        task = pooling_task or getattr(first, "task", None) or (tasks[0] if tasks else "embed")
        outs = self._pool(prompts, pooling_params, task, use_tqdm, truncate_prompt_tokens, lora_request)
        return [_with_tensor(o) for o in outs]

    def classify(self, prompts: Any, *, pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
                 use_tqdm: bool = True, lora_request: Any = None,
                 truncate_prompt_tokens: int | None = None) -> list[ClassificationRequestOutput]:
        """Class probabilities of each input (softmax over labels; sigmoid for one label; the raw logits with
        ``PoolingParams(use_activation=False)``). ``outputs.probs`` is a list; ``num_classes`` its length."""
        outs = self._pool(prompts, pooling_params, "classify", use_tqdm, truncate_prompt_tokens, lora_request)
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def reward(self, prompts: Any, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
               lora_request: Any = None) -> list[PoolingRequestOutput]:
        """The reward head's raw output for each input (``outputs.data``: a tensor of ``num_labels`` values).

        NOTE: sequence-level (the head at the last token, e.g. Skywork-Reward ``*ForSequenceClassification``);
        vLLM's per-token reward models (``Qwen2ForRewardModel``) are not built.
        """
        outs = self._pool(prompts, pooling_params, "reward", use_tqdm, truncate_prompt_tokens, lora_request)
        return [_with_tensor(o) for o in outs]

    def score(self, data_1: Any, data_2: Any, /, *, truncate_prompt_tokens: int | None = None,
              use_tqdm: bool = True, pooling_params: PoolingParams | None = None,
              lora_request: Any = None) -> list[ScoringRequestOutput]:
        """Relevance of each (data_1, data_2) pair: a cross-encoder's score, or the cosine similarity of the
        embeddings of an embedding model. One ``data_1`` is paired with every ``data_2`` (1:N); otherwise the
        lists pair up one to one (N:N).

        Raises:
            ValueError: the model can do neither; lists of different lengths; non-text pairs for a cross-encoder.
        """
        from octavo.pooling import cosine, model_tasks, pair_prompts

        info = self.llm_engine.model_info
        tasks = model_tasks(getattr(info, "pooler", None), info.is_pooling)
        left, right = _pairs(data_1, data_2)
        if "score" in tasks:
            prompts = pair_prompts(self.get_tokenizer(), left, right, "data_1")
            outs = self._pool(prompts, pooling_params, "score", use_tqdm, truncate_prompt_tokens, lora_request)
            return [ScoringRequestOutput.from_base(o) for o in outs]
        if "embed" in tasks:
            embs = self._pool(left + right, pooling_params, "embed", use_tqdm, truncate_prompt_tokens, lora_request)
            a, b = embs[:len(left)], embs[len(left):]
            return [ScoringRequestOutput(f"{x.request_id}_{y.request_id}",
                                         ScoringOutput(cosine(x.outputs.embedding, y.outputs.embedding)),
                                         x.prompt_token_ids + y.prompt_token_ids) for x, y in zip(a, b)]
        kind = f"serves {tasks}" if tasks else "is a generative model"
        raise ValueError(f"LLM.score: {info.architecture} {kind}; score needs a cross-encoder (a classifier with "
                         "one label) or an embedding model")

    # -------------------------------------------------------------------------------------------- helpers
    def _pooling_tasks(self) -> list[str]:
        from octavo.pooling import model_tasks

        info = self.llm_engine.model_info
        return model_tasks(getattr(info, "pooler", None), info.is_pooling)

    def _pool(self, prompts: Any, pooling_params: Any, task: str, use_tqdm: bool,
              truncate_prompt_tokens: int | None, lora_request: Any) -> list:
        """Queue one pooling request per prompt (all validated before any runs) and collect the results."""
        from octavo.prompt_batch import _as_list

        if lora_request is not None:
            raise ValueError("lora_request is not supported for pooling models in octavo")
        prompts = _as_list(prompts)
        if isinstance(pooling_params, Sequence) and not isinstance(pooling_params, PoolingParams):
            if len(pooling_params) != len(prompts):
                raise ValueError(f"pooling_params: {len(pooling_params)} given for {len(prompts)} prompts")
            params = list(pooling_params)
        else:
            params = [pooling_params] * len(prompts)
        bad = [type(p).__name__ for p in params if p is not None and not isinstance(p, PoolingParams)]
        if bad:
            raise TypeError(f"pooling_params must be octavo.PoolingParams (or a list of them), not {bad[0]}")
        engine, ids = self.llm_engine, []
        try:
            for prompt, pp in zip(prompts, params):
                pp = pp.clone() if pp is not None else PoolingParams()
                pp.task = pp.task or task
                if truncate_prompt_tokens is not None:
                    pp.truncate_prompt_tokens = truncate_prompt_tokens
                rid = str(next(self._counter))
                engine.add_embedding_request(rid, prompt, pooling_params=pp)
                ids.append(rid)
        except ValueError:
            engine.abort_request(ids)
            raise
        return self._collect(ids, use_tqdm)


def _pairs(data_1: Any, data_2: Any) -> tuple[list, list]:
    left = [data_1] if isinstance(data_1, (str, dict)) else list(data_1)
    right = [data_2] if isinstance(data_2, (str, dict)) else list(data_2)
    if len(left) == 1:
        left = left * len(right)
    if len(left) != len(right) or not right:
        raise ValueError(f"score: data_1 has {len(left)} inputs and data_2 {len(right)}; give one data_1 for many "
                         "data_2, or two lists of the same (non-zero) length")
    return left, right


def _with_tensor(out: Any) -> PoolingRequestOutput:
    """Front-end result (list data, or an embedding) -> vLLM's ``PoolingRequestOutput`` with a tensor."""
    import torch

    data = out.outputs.embedding if hasattr(out.outputs, "embedding") else out.outputs.data
    return PoolingRequestOutput(out.request_id, PoolingOutput(torch.tensor(data, dtype=torch.float32)),
                                out.prompt_token_ids, out.finished)
