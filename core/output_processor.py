"""Front-end side of outputs: turns the core's token ids into ``RequestOutput`` objects.

Per completion it detokenizes incrementally, applies stop strings (asking the core to abort the
sequence), formats logprobs as ``{token_id: Logprob}``, and merges the ``n`` sequences of a request
into one ``RequestOutput`` (cumulative, delta or final-only, as the request's ``output_kind`` says).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from octavo.core.detokenizer import IncrementalDetokenizer
from octavo.core.messages import EngineCoreOutput, FinishReason, TokenLogprobs
from octavo.outputs import CompletionOutput, EmbeddingOutput, EmbeddingRequestOutput, Logprob, RequestOutput
from octavo.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class SequenceState:
    index: int
    params: SamplingParams
    detok: IncrementalDetokenizer | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_sent_tokens: int = 0
    num_sent_logprobs: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class ParentState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    output_kind: RequestOutputKind
    seqs: dict[str, SequenceState]
    arrival_time: float
    prompt_logprobs: list | None = None
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_generation_tokens: int = 0
    queue: object = None  # AsyncLLM puts this request's outputs here

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.seqs.values())


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.parents: dict[str, ParentState] = {}
        self.seq_to_parent: dict[str, str] = {}
        self._token_text: dict[int, str] = {}
        self.errors: dict[str, str] = {}  # request id -> why the core failed it (the caller pops it)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, seq_ids: list[str], queue=None) -> None:
        seqs = {}
        for i, sid in enumerate(seq_ids):
            detok = None
            if params.detokenize and self.tokenizer is not None:
                detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens,
                                               params.spaces_between_special_tokens, params.stop,
                                               params.include_stop_str_in_output)
            seqs[sid] = SequenceState(i, params, detok, logprobs=[] if params.logprobs is not None else None,
                                      cumulative_logprob=0.0 if params.logprobs is not None else None)
            self.seq_to_parent[sid] = request_id
        self.parents[request_id] = ParentState(request_id, prompt, list(prompt_token_ids), params.output_kind,
                                               seqs, time.monotonic(), queue=queue)

    def has_unfinished(self) -> bool:
        return bool(self.parents)

    def seq_ids(self, request_id: str) -> list[str]:
        parent = self.parents.get(request_id)
        return list(parent.seqs) if parent else []

    def abort_request(self, request_id: str) -> None:
        parent = self.parents.pop(request_id, None)
        if parent:
            for sid in parent.seqs:
                self.seq_to_parent.pop(sid, None)

    def decode_token(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else ""
            self._token_text[token_id] = text
        return text

    def _format_logprobs(self, tl: TokenLogprobs) -> dict[int, Logprob]:
        out: dict[int, Logprob] = {}
        for tid, lp, rank in zip(tl.token_ids, tl.logprobs, tl.ranks):
            if tid not in out:
                out[tid] = Logprob(lp, rank, self.decode_token(tid))
        return out

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's core outputs. Returns the RequestOutputs to hand out and the sequence ids the
        core must abort (they hit a stop string)."""
        ready: dict[str, RequestOutput] = {}
        to_abort: list[str] = []
        now = time.monotonic()
        for out in outputs:
            pid = self.seq_to_parent.get(out.request_id)
            if pid is None:
                continue  # aborted by the caller meanwhile
            parent = self.parents[pid]
            seq = parent.seqs[out.request_id]
            if seq.finished:
                continue
            if out.pooled is not None:
                ready[pid] = EmbeddingRequestOutput(pid, parent.prompt_token_ids, EmbeddingOutput(out.pooled))
                self.abort_request(pid)
                continue
            if out.error:
                # The core refused or failed this sequence: the whole request finishes with that error (its
                # other sequences are aborted), so no caller waits forever. The reason is in ``errors``.
                self.errors[pid] = out.error
                for sid, s in parent.seqs.items():
                    if not s.finished:
                        s.finish_reason = "error"
                        if sid != out.request_id:
                            to_abort.append(sid)
                ready[pid] = self._make_output(parent, seq)
                self.abort_request(pid)
                continue
            if out.prompt_logprobs is not None and parent.prompt_logprobs is None:
                parent.prompt_logprobs = [None if e is None else self._format_logprobs(e) for e in out.prompt_logprobs]
            parent.num_cached_tokens = max(parent.num_cached_tokens, out.num_cached_tokens)
            if out.new_token_ids:
                parent.first_token_time = parent.first_token_time or now
                parent.last_token_time = now
                parent.num_generation_tokens += len(out.new_token_ids)
            for j, tok in enumerate(out.new_token_ids):
                seq.token_ids.append(tok)
                if seq.logprobs is not None and out.new_logprobs:
                    tl = out.new_logprobs[j]
                    seq.logprobs.append(self._format_logprobs(tl))
                    seq.cumulative_logprob += tl.logprobs[0]
                stop_str = seq.detok.add_token(tok) if seq.detok is not None else None
                if stop_str is not None:
                    seq.finish_reason, seq.stop_reason = "stop", stop_str
                    to_abort.append(out.request_id)
                    break
            if out.finish_reason is not None and not seq.finished:
                seq.finish_reason = str(out.finish_reason)
                seq.stop_reason = out.stop_reason
                if out.error:
                    seq.finish_reason = "error"
            ro = self._make_output(parent, seq)
            if ro is not None:
                ready[pid] = ro if pid not in ready or parent.output_kind != RequestOutputKind.DELTA \
                    else _merge_delta(ready[pid], ro)
            if parent.finished:
                self.abort_request(pid)
        return list(ready.values()), to_abort

    def _make_output(self, parent: ParentState, changed: SequenceState) -> RequestOutput | None:
        kind = parent.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not parent.finished:
            return None
        if kind == RequestOutputKind.DELTA:
            completions = [self._completion(changed, delta=True)]
        else:
            completions = [self._completion(s, delta=False) for s in parent.seqs.values()]
        metrics = {"arrival_time": parent.arrival_time, "first_token_time": parent.first_token_time,
                   "last_token_time": parent.last_token_time, "num_generation_tokens": parent.num_generation_tokens}
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, parent.prompt_logprobs,
                             completions, parent.finished, metrics, parent.num_cached_tokens)

    def _completion(self, s: SequenceState, delta: bool) -> CompletionOutput:
        if delta:
            text = s.detok.get_new_text(s.finished) if s.detok else ""
            token_ids = s.token_ids[s.num_sent_tokens:]
            logprobs = s.logprobs[s.num_sent_logprobs:] if s.logprobs is not None else None
            s.num_sent_tokens = len(s.token_ids)
            s.num_sent_logprobs = len(s.logprobs) if s.logprobs is not None else 0
        else:
            text = s.detok.visible_text(s.finished) if s.detok else ""
            token_ids = list(s.token_ids)
            logprobs = list(s.logprobs) if s.logprobs is not None else None
        return CompletionOutput(s.index, text, token_ids, s.cumulative_logprob, logprobs, s.finish_reason,
                                s.stop_reason)


def _merge_delta(a: RequestOutput, b: RequestOutput) -> RequestOutput:
    """Two deltas of one request in one step (different sequences): hand out both."""
    a.outputs.extend(b.outputs)
    a.finished = b.finished
    a.prompt_logprobs = a.prompt_logprobs or b.prompt_logprobs
    return a


__all__ = ["OutputProcessor", "FinishReason"]
