"""Incremental detokenization and stop-string matching for one completion.

Each new token is decoded together with a few tokens before it (``prefix_offset .. read_offset``), and
only the text past the already-emitted prefix is new. This is what keeps word-piece spacing right
(SentencePiece's leading "▁" and byte-level BPE's "Ġ" depend on the neighbour), and a trailing U+FFFD
means a multi-byte character is still incomplete, so nothing is emitted until its last byte arrives.
"""

from __future__ import annotations

INITIAL_CONTEXT = 5  # prompt tokens decoded alongside the first output tokens, for spacing


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True, stop: list[str] | None = None,
                 include_stop_str_in_output: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.ids: list[int] = list(prompt_token_ids[-INITIAL_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.output_text = ""
        self.stop = stop or []
        self.include_stop = include_stop_str_in_output
        # In streaming, hold back text that might be the start of a stop string.
        self.hold_back = 0 if self.include_stop or not self.stop else max(len(s) for s in self.stop) - 1
        self.num_emitted_chars = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     spaces_between_special_tokens=self.spaces_between_special_tokens)

    def add_token(self, token_id: int) -> str | None:
        """Append one token; returns the matched stop string if the text now contains one (the text is
        then truncated at it), else None."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None  # an incomplete character or a token that renders as nothing (yet)
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        old_len = len(self.output_text)
        self.output_text += delta
        return self._check_stop(old_len, len(delta))

    def _check_stop(self, old_len: int, delta_len: int) -> str | None:
        if not self.stop:
            return None
        for s in self.stop:
            # a stop string can only end inside the new text, so search from just before it
            start = max(0, old_len - len(s) + 1)
            idx = self.output_text.find(s, start)
            if idx != -1:
                self.output_text = self.output_text[: idx + len(s) if self.include_stop else idx]
                return s
        return None

    def get_new_text(self, finished: bool) -> str:
        """Text not yet handed out; while running, keep back what could still grow into a stop string."""
        end = len(self.output_text) if finished else max(self.num_emitted_chars,
                                                         len(self.output_text) - self.hold_back)
        text = self.output_text[self.num_emitted_chars:end]
        self.num_emitted_chars = end
        return text

    def visible_text(self, finished: bool) -> str:
        return self.output_text if finished else self.output_text[: max(0, len(self.output_text) - self.hold_back)]
