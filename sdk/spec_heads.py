"""Speculators that are heads on the target's hidden states (Medusa, IBM's MLP speculator, ...).

Such a proposer runs in two halves, because the hidden states live on the worker's device and the drafts
are needed by the engine core's scheduler:

- **on the worker**, next to the target: :meth:`HeadSpeculator.load_head` builds the head once (its
  checkpoint, in the layout its authors publish); after every step that samples, the runner calls
  :meth:`DraftHead.propose` with, per sampled request, the target's final hidden state at the position
  that produced the request's last emitted token and that token. The drafts come back to the core in
  ``RunnerOutput.spec_token_ids`` (plain ints, as everything crossing the executor boundary).
- **in the engine core**: :meth:`HeadSpeculator.propose` hands those drafts to the scheduler
  (``SpecRequest.proposed``), cut to what the request can use.

The core verifies drafts exactly as for any proposer, so a head can change speed only, never the output.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from octavo.speculator import SpecRequest, Speculator


class DraftHead(ABC):
    """The worker half: a torch module (or anything) that drafts from hidden states."""

    #: most drafts it can propose per step (e.g. Medusa's number of heads)
    max_drafts: int

    @abstractmethod
    def propose(self, hidden, last_tokens, num_drafts: int):
        """``hidden`` [B, hidden_size] (the target's final, normed hidden state of each request's last
        position), ``last_tokens`` [B] (int64, the token that position produced) -> int64 [B, num_drafts]
        draft tokens, on the device. Deterministic (argmax), so the core can verify them as one-hot drafts."""


class HeadSpeculator(Speculator):
    """Base class of head proposers: subclasses implement :meth:`load_head` (and usually :meth:`check`)."""

    name: ClassVar[str]
    runs_on_worker: ClassVar[bool] = True
    stateful: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def load_head(cls, config, *, hidden_size: int, vocab_size: int, device, dtype, target: Any,
                  max_num_tokens: int = 8192) -> DraftHead:
        """Load ``config.model`` (a head checkpoint) for a target with this hidden size and vocabulary, on
        ``device`` in ``dtype``. ``target`` is the loaded target model (for heads that share its embedding
        or lm_head); ``max_num_tokens`` bounds one step's flat tokens. Raise ``ValueError`` naming the
        mismatch when the head does not fit the target.

        A head whose class sets ``stateful = True`` (EAGLE: its own attention over the sequence) is fed every
        step instead of asked for drafts: ``head.reset(request_ids)`` and ``head.feed(hidden, feeds,
        num_drafts)`` with ``feeds`` = (request id, start position, next-token ids, flat hidden rows, draft?)
        per scheduled request (see ``octavo.plugins.spec_decode.eagle_head``)."""

    def propose(self, requests: list[SpecRequest]) -> list[list[int]]:
        return [list(r.proposed or [])[:r.max_num_drafts] for r in requests]


# ---- checkpoint helpers (shared by the built-in heads) -----------------------------------------------
def checkpoint_dir(model: str) -> str:
    """A local directory, or a Hugging Face repo id fetched through huggingface_hub (json + weights only)."""
    if os.path.isdir(model):
        return model
    if os.path.exists(model):
        raise ValueError(f"speculative_config model {model!r} is a file; give the head's checkpoint directory")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.pt"])
    except Exception as e:  # offline, unknown repo, ...
        raise ValueError(f"speculative_config model {model!r} is not a local directory and could not be "
                         f"fetched from the Hugging Face hub: {e}") from e


def read_config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def read_state_dict(path: str, names: tuple[str, ...] = ()) -> dict:
    """All tensors of the checkpoint: every ``*.safetensors`` file (or the ``names`` given, first found),
    else a ``*.bin``/``*.pt`` torch file loaded with ``weights_only=True``."""
    import torch

    files = sorted(os.listdir(path))
    wanted = [n for n in names if n in files] or [f for f in files if f.endswith(".safetensors")]
    if wanted and wanted[0].endswith(".safetensors"):
        from safetensors.torch import load_file

        state: dict = {}
        for f in wanted:
            state.update(load_file(os.path.join(path, f)))
        return state
    legacy = wanted or [f for f in files if f.endswith((".bin", ".pt"))]
    if not legacy:
        raise ValueError(f"no weights (*.safetensors, *.bin, *.pt) in the head checkpoint {path!r}")
    state = {}
    for f in legacy:
        state.update(torch.load(os.path.join(path, f), map_location="cpu", weights_only=True))
    return state


def check_dense_head(config, head_vocab: int, vocab_size: int, what: str, kind: str) -> None:
    """What every head checkpoint is refused for at start: a vocabulary other than the target's (``what`` names
    the checkpoint), and a ``speculative_config.quantization`` (heads load dense; ``kind`` names them)."""
    if head_vocab != vocab_size:
        raise ValueError(f"{what} has vocab_size={head_vocab} but the target has {vocab_size}")
    if config.quantization:
        raise ValueError(f"speculative_config quantization applies to draft models; {kind} load dense")


def load_exact(module, state: dict, what: str) -> None:
    """Copy ``state`` into ``module``: every parameter must be present with its shape, and no tensor may be
    left over (a layout this loader does not understand fails loudly instead of drafting garbage)."""
    params = dict(module.named_parameters())
    missing = sorted(set(params) - set(state))
    extra = sorted(set(state) - set(params))
    if missing or extra:
        raise ValueError(f"{what} checkpoint does not match its config: missing {missing[:6]}, "
                         f"unexpected {extra[:6]}")
    for name, p in params.items():
        t = state[name]
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{what} checkpoint: {name} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
        p.data.copy_(t.to(p.dtype))
