"""Beam search: ``BeamSearchParams``, vLLM's output types, and the search itself, independent of the engine.

The engine is asked, each round, for the next-token log-probabilities of every live beam (one 1-token
request per beam with ``logprobs = beams_to_keep``, prefix caching reusing the shared KV blocks, as vLLM
does); :class:`BeamSearch` turns those candidates into the next beams. The sync driver is
``octavo.llm_beam`` (``LLM.beam_search``), the async one ``octavo.server.beam`` (``use_beam_search``).

The selection rules are Hugging Face transformers' ``generate(num_beams=K, do_sample=False,
early_stopping=False)``, so the two agree token for token (tests/e2e/test_beam_search.py)::

    each round:  candidates = top (1 + #eos) * K  of  {beam score + logprob(token)}  over all beams
                 a candidate ending in EOS (or reaching max_tokens) among the top K  -> finished, scored
                     cum_logprob / generated_len ** length_penalty   (generated_len counts the EOS)
                 the best K candidates that did not finish                          -> next beams
    stop when:   max_tokens reached, or K beams finished and the best live beam's
                 cum_logprob / current_len ** length_penalty cannot beat the worst finished one

NOTE: vLLM scores finished beams with the prompt counted in the length and keeps every EOS candidate of a
beam's top 2K; we follow transformers (the reference the issue names). Both agree when no beam ends early
and ``length_penalty`` is 1 (docs/compatibility.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BeamSearchParams:
    """Beam search parameters (vLLM's ``vllm.sampling_params.BeamSearchParams``).

    Attributes:
        beam_width: beams kept per prompt, and sequences returned (K).
        max_tokens: most tokens generated per beam.
        ignore_eos: EOS does not end a beam.
        temperature: passed to each step's sampler as vLLM does; candidates are the top log-probabilities of
            the raw distribution plus the token that step sampled (at 0 that is the top token, so the search
            is deterministic; above 0 one random extra candidate may enter).
        length_penalty: finished beams are ranked by ``cum_logprob / generated_len ** length_penalty``
            (> 1 favours longer sequences, < 1 shorter ones).
        include_stop_str_in_output: keep the EOS token's text at the end of ``text``.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or self.beam_width < 1:
            raise ValueError(f"beam_width must be an integer >= 1, got {self.beam_width!r}.")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}.")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}.")
        if not abs(self.length_penalty) < float("inf"):
            raise ValueError(f"length_penalty must be finite, got {self.length_penalty!r}.")


@dataclass
class BeamSearchSequence:
    """One returned beam (vLLM's class and fields). ``tokens`` include the prompt; ``logprobs`` hold one
    ``{token_id: Logprob}`` per generated token (the candidates seen at that step); ``text`` is the decoded
    prompt + output."""

    tokens: list[int]
    logprobs: list[dict[int, Any]]
    lora_request: Any = None
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (EOS) or "length"
    stop_reason: int | None = None  # the EOS id that ended it
    multi_modal_data: Any = None
    mm_processor_kwargs: Any = None
    score: float = 0.0  # cum_logprob / generated_len ** length_penalty (how the beams are ranked)
    num_prompt_tokens: int = 0


@dataclass
class BeamSearchOutput:
    """The result for one prompt: ``sequences``, best first (vLLM's ``vllm.beam_search.BeamSearchOutput``)."""

    sequences: list[BeamSearchSequence] = field(default_factory=list)


@dataclass
class _Beam:
    gen: list[int]
    cum: float
    logprobs: list[dict[int, Any]]


class BeamSearch:
    """The search state of one prompt. Call ``live()`` for the sequences to extend, ``advance()`` with each
    one's candidates ``{token_id: Logprob}``, until ``done``; then ``output()``.

    Args:
        prompt_ids: the prompt's token ids.
        params: the search parameters.
        eos_token_ids: the ids that end a beam (unless ``ignore_eos``).
    """

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams, eos_token_ids: list[int]) -> None:
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.beams_to_keep = max(2, 1 + len(self.eos)) * params.beam_width
        self.beams = [_Beam([], 0.0, [])]
        self.finished: list[tuple[float, _Beam, str]] = []  # (score, beam, finish_reason), best first
        self.improvable = True
        self.num_generated = 0
        self.done = False

    def live(self) -> list[list[int]]:
        """Token ids (prompt + generated) of each live beam, in order."""
        return [self.prompt_ids + b.gen for b in self.beams]

    def advance(self, candidates: list[dict[int, Any]]) -> None:
        """One round: ``candidates[i]`` are beam i's next-token log-probabilities (``Logprob`` values)."""
        k, lp = self.params.beam_width, self.params.length_penalty
        pool = [(beam.cum + c.logprob, i, tok, cands)
                for i, (beam, cands) in enumerate(zip(self.beams, candidates)) for tok, c in cands.items()]
        pool.sort(key=lambda x: -x[0])  # stable: ties keep beam order, then the engine's candidate order
        pool = pool[:self.beams_to_keep]
        new_len = self.num_generated + 1
        at_max = new_len >= self.params.max_tokens
        running: list[_Beam] = []
        for rank, (score, i, tok, cands) in enumerate(pool):
            parent = self.beams[i]
            beam = _Beam(parent.gen + [tok], score, parent.logprobs + [cands])
            stops = tok in self.eos or at_max
            if not stops:
                if len(running) < k:
                    running.append(beam)
            elif rank < k and self.improvable:
                self.finished.append((score / new_len ** lp, beam, "stop" if tok in self.eos else "length"))
        self.finished.sort(key=lambda x: -x[0])
        del self.finished[k:]
        self.beams = running
        self.num_generated = new_len
        if self.improvable and len(self.finished) == k and running:
            best_possible = running[0].cum / new_len ** lp
            self.improvable = best_possible > self.finished[-1][0]
        self.done = at_max or not self.improvable or not running

    def output(self, tokenizer: Any = None, lora_request: Any = None) -> BeamSearchOutput:
        """The ``beam_width`` best finished beams, best first, with their text (prompt + output)."""
        seqs = []
        for score, beam, reason in self.finished:
            tokens = self.prompt_ids + beam.gen
            ended_eos = reason == "stop"
            text = None
            if tokenizer is not None:
                shown = tokens if (self.params.include_stop_str_in_output or not ended_eos) else tokens[:-1]
                text = tokenizer.decode(shown)  # as vLLM: special tokens kept, the EOS only when asked
            seqs.append(BeamSearchSequence(
                tokens=tokens, logprobs=beam.logprobs, lora_request=lora_request, cum_logprob=beam.cum, text=text,
                finish_reason=reason, stop_reason=beam.gen[-1] if ended_eos else None, score=score,
                num_prompt_tokens=len(self.prompt_ids)))
        return BeamSearchOutput(sequences=seqs)
