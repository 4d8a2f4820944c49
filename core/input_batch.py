"""The runner's per-request state, and one step's flat model inputs, attention layout and sampling batch.

The runner never sees the scheduler's ``Request``: it keeps a :class:`CachedRequestState` per request (built
from ``NewRequestData``, updated from each step's ``ScheduledRequestData``, dropped on ``finished_ids``), as
vLLM's V1 runner keeps ``CachedRequestState``. Its token list is the runner's own copy of the sequence.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from octavo.attention import AttentionLayout
from octavo.core.sampler import SamplingBatch
from octavo.step import NewRequestData, ScheduledRequestData, StepBatch

# One pinned host-to-device copy per step for the step inputs, the layout rows the graph runner copies and the
# sampler's columns (core/step_staging.py) instead of one pageable copy each. Accelerator devices only (on the CPU
# nothing is copied: unchanged; measured on CUDA only). OCTAVO_STEP_STAGING=1/0; None: read it on first use. Opt-in until an H100 A/B decides it.
STAGING: bool | None = None
_STAGERS: dict = {}  # device -> PinnedStaging
# Session 16 (batch-1 decode outside the graph): a decode-only step's query starts are 0..n, its logits rows 0..n-1
# when every request samples its one token, and an all-greedy batch without filters has the same four sampler
# columns every step. These then come from device tensors kept per device (read only) instead of one host-to-device
# copy each (6 of a batch-1 greedy step's ~12 copies, each a few us on the GPU's timeline between two graphs), and
# the runner skips the identity gather of the hidden rows. The same values. Accelerators only (the CPU copies
# nothing). OCTAVO_DECODE_CONST_INPUTS=1/0; None: read it on first use. Opt-in until an H100 A/B decides it.
CONST_INPUTS: bool | None = None
_CONST: dict = {}  # (device, what, ...) -> device tensor(s)


def const_inputs(device: torch.device) -> bool:
    """Whether :data:`CONST_INPUTS` applies on ``device`` (an accelerator with the switch on)."""
    global CONST_INPUTS
    if device.type == "cpu":
        return False
    if CONST_INPUTS is None:
        from octavo.env_flags import env_switch

        CONST_INPUTS = env_switch("OCTAVO_DECODE_CONST_INPUTS", False)
    return CONST_INPUTS


def _arange(device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.arange(n, dtype=dtype)`` on ``device``: a view of one kept tensor (grown, never written after)."""
    t = _CONST.get((device, "arange", dtype))
    if t is None or t.numel() < n:
        t = _CONST[(device, "arange", dtype)] = torch.arange(max(n, 1024), dtype=dtype, device=device)
    return t[:n]


def _greedy_columns(device: torch.device, rows: int, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """temperature 0, top_p 1, top_k = vocab, min_p 0 for ``rows`` rows on ``device`` (kept; read only)."""
    key = (device, "greedy", rows, vocab_size)
    cols = _CONST.get(key)
    if cols is None:
        if len(_CONST) > 1024:  # batch sizes come and go in serving: bound the cache (views in use stay alive)
            _CONST.clear()
        f32 = {"dtype": torch.float32, "device": device}
        cols = _CONST[key] = (torch.zeros(rows, **f32), torch.ones(rows, **f32),
                              torch.full((rows,), vocab_size, dtype=torch.int64, device=device), torch.zeros(rows, **f32))
    return cols


def step_staging(device: torch.device):
    """The device's :class:`~octavo.core.step_staging.PinnedStaging` when staging is on and ``device`` is an
    accelerator (not the CPU)."""
    global STAGING
    if device.type == "cpu":
        return None
    if STAGING is None:
        from octavo.env_flags import env_switch

        STAGING = env_switch("OCTAVO_STEP_STAGING", False)
    if not STAGING:
        return None
    st = _STAGERS.get(device)
    if st is None:
        from octavo.core.step_staging import PinnedStaging

        st = _STAGERS[device] = PinnedStaging(device)
    return st


class CachedRequestState:
    """What the runner knows about one request between steps."""

    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "eos_token_id", "pooling", "all_token_ids",
                 "lora_request", "mm_inputs", "bt_ids", "bt_row")

    def __init__(self, new: NewRequestData) -> None:
        self.request_id = new.request_id
        self.prompt_token_ids = new.prompt_token_ids
        self.sampling_params = new.sampling_params
        self.eos_token_id = new.eos_token_id
        self.pooling = new.pooling
        self.lora_request = new.lora_request
        self.mm_inputs = new.mm_inputs  # images whose embeddings replace their placeholder tokens
        self.all_token_ids: list[int] = list(new.prompt_token_ids)
        # a copy of the block table last converted, and its int32 row: build_step_inputs converts a request's list
        # again only when it differs (a decoding request gains a block once in block_size steps)
        self.bt_ids: list[int] | None = None
        self.bt_row: np.ndarray | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    def write(self, s: ScheduledRequestData) -> None:
        """Put this step's tokens at their positions. A step that samples ends the known sequence, so
        anything past it (tokens the scheduler did not keep) is dropped."""
        start, end = s.num_computed_tokens, s.num_computed_tokens + len(s.token_ids)
        tokens = self.all_token_ids
        if start > len(tokens):
            raise RuntimeError(f"request {self.request_id}: step starts at position {start} but the runner "
                               f"knows only {len(tokens)} tokens (a lost step?)")
        if start == len(tokens):
            tokens.extend(s.token_ids)  # the decode fast path
        else:
            tokens[start:end] = s.token_ids
        if s.samples and len(tokens) > end:
            del tokens[end:]


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] on the device
    positions: torch.Tensor  # [num_tokens] on the device
    layout: AttentionLayout  # host tensors
    query_start_loc: torch.Tensor  # [num_reqs + 1] on the device
    logits_indices: torch.Tensor  # [num_sample_rows] flat-token rows whose logits are sampled
    sample_req_ids: list[str]  # request of each sampled row
    # prompt logprobs: request id -> (flat rows, target token ids, first target position)
    prompt_lp_rows: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = field(default_factory=dict)
    pooling_req_ids: list[str] = field(default_factory=list)
    spec_token_ids: list[list[int]] = field(default_factory=list)  # drafts per sampled request (k+1 rows each)
    # the layout's tensors on the device, from the step's one staged copy (core/step_staging.py), else None; the graph
    # runner copies its static rows from these instead of from the host tensors
    device_layout: AttentionLayout | None = None
    # the logits rows are every flat row in order (CONST_INPUTS): the runner takes the hidden states as they are
    logits_all_rows: bool = False


def _int64_tensor(values: list[int]) -> torch.Tensor:
    """A host int64 tensor of a list of Python ints (what ``torch.tensor(values, dtype=torch.int64)`` gives)."""
    return torch.from_numpy(np.fromiter(values, np.int64, len(values)))


def build_step_inputs(batch: StepBatch, states: dict[str, CachedRequestState], block_size: int,
                      device: torch.device, copies: bool = True) -> StepInputs:
    """Flatten one step. Host work is numpy over whole rows (no per-token Python for prefills), since at
    high batch sizes on a GPU this function sits on the critical path of every step. ``copies=False``: every tensor
    stays on the host (the platform's one-graph batch-1 step stages what it needs itself, core/step_head.py)."""
    num_reqs = len(batch.scheduled)
    input_ids: list[int] = []
    query_lens = np.empty(num_reqs, dtype=np.int64)
    starts = np.empty(num_reqs, dtype=np.int64)
    logits_rows, sample_ids, pooling_ids, spec_ids = [], [], [], []
    prompt_lp_rows = {}
    bt_rows, bt_lens = [], []
    row0 = 0
    for i, s in enumerate(batch.scheduled):
        req, start, n = states[s.request_id], s.num_computed_tokens, len(s.token_ids) + len(s.spec_token_ids)
        end = start + n
        input_ids.extend(s.token_ids)
        input_ids.extend(s.spec_token_ids)
        ids = s.block_ids
        # Converting every row's block ids again was ~70 % of a 256-row decode step's host work here; a row equal to
        # the one converted last is reused. The snapshot is a copy: ``ids`` may be the KV manager's live list (the
        # synchronous in-process path), which it edits in place (sliding window, rejected drafts, preemption)
        if ids != req.bt_ids:
            req.bt_row, req.bt_ids = np.array(ids, dtype=np.int32), list(ids)
        bt_rows.append(req.bt_row)
        bt_lens.append(len(ids))
        query_lens[i], starts[i] = n, start
        if req.pooling:
            if s.samples:
                pooling_ids.append(req.request_id)
        else:
            k = req.sampling_params.prompt_logprobs
            if k is not None and start < req.num_prompt_tokens - 1:
                # logits at position j predict prompt token j + 1
                last = min(end, req.num_prompt_tokens - 1)
                rows = torch.arange(row0, row0 + (last - start))
                targets = torch.tensor(req.prompt_token_ids[start + 1:last + 1])
                prompt_lp_rows[req.request_id] = (rows, targets, start + 1)
            if s.samples:
                nd = len(s.spec_token_ids)  # drafts: one logits row per draft position plus the bonus row
                logits_rows.extend(range(row0 + n - 1 - nd, row0 + n))
                sample_ids.append(req.request_id)
                spec_ids.append(s.spec_token_ids)
        row0 += n

    # each row's block ids, zero-padded (a row-major boolean mask fills the rows in order)
    lens = np.array(bt_lens, dtype=np.int64)
    max_blocks = int(lens.max())
    block_tables = np.zeros((num_reqs, max_blocks), dtype=np.int32)
    block_tables[np.arange(max_blocks) < lens[:, None]] = np.concatenate(bt_rows)

    # positions and slots of every token: request index per token, then offsets within each request
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(query_lens, out=query_start_loc[1:])
    req_of_token = np.repeat(np.arange(num_reqs), query_lens)
    positions = starts[req_of_token] + (np.arange(row0) - query_start_loc[:-1][req_of_token])
    block_of_token = block_tables[req_of_token, positions // block_size].astype(np.int64)
    slot_mapping = block_of_token * block_size + positions % block_size
    seq_lens = (starts + query_lens).astype(np.int32)

    layout = AttentionLayout(
        query_start_loc=torch.from_numpy(query_start_loc),
        seq_lens=torch.from_numpy(seq_lens),
        num_computed_tokens=torch.from_numpy(starts.astype(np.int32)),
        block_tables=torch.from_numpy(block_tables),
        slot_mapping=torch.from_numpy(slot_mapping),
        block_size=block_size,
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        num_decode_reqs=batch.num_decode_reqs,
    )
    staging = step_staging(device) if copies else None
    device_layout, all_rows = None, False
    if not copies:
        ids_d, pos_d = _int64_tensor(input_ids), torch.from_numpy(positions)
        qsl_d, rows_d = layout.query_start_loc, _int64_tensor(logits_rows)
    elif staging is not None:  # one pinned copy for all of them: the same values on the device
        ids_d, pos_d, qsl_d, rows_d, seq_d, nc_d, bt_d, slot_d = staging.stage([
            np.fromiter(input_ids, np.int64, len(input_ids)), positions, query_start_loc,
            np.fromiter(logits_rows, np.int64, len(logits_rows)), seq_lens, layout.num_computed_tokens.numpy(),
            block_tables, slot_mapping])
        device_layout = dataclasses.replace(layout, query_start_loc=qsl_d, seq_lens=seq_d, num_computed_tokens=nc_d,
                                            block_tables=bt_d, slot_mapping=slot_d)
    else:
        # numpy reads a list of Python ints ~4x faster than torch.tensor (an 8k-token prefill step: ~0.4 vs 1.7 ms
        # on the step thread, which paces the GPU in nano-vllm's eager prefill steps); the same int64 values
        ids_d = _int64_tensor(input_ids).to(device, non_blocking=True)
        pos_d = torch.from_numpy(positions).to(device, non_blocking=True)
        const = const_inputs(device)
        if const and layout.max_query_len == 1 and row0 == num_reqs:  # one token a request: starts 0..n
            qsl_d = _arange(device, num_reqs + 1, torch.int32)
        else:
            qsl_d = layout.query_start_loc.to(device, non_blocking=True)
        # rows are appended in increasing order, each in [0, row0): row0 of them are exactly 0..row0-1
        all_rows = const and len(logits_rows) == row0 > 0
        rows_d = _arange(device, row0, torch.int64) if all_rows else \
            _int64_tensor(logits_rows).to(device, non_blocking=True)
    return StepInputs(
        input_ids=ids_d,
        positions=pos_d,
        layout=layout,
        query_start_loc=qsl_d,
        logits_indices=rows_d,
        sample_req_ids=sample_ids,
        prompt_lp_rows=prompt_lp_rows,
        pooling_req_ids=pooling_ids,
        spec_token_ids=spec_ids if any(spec_ids) else [],
        device_layout=device_layout,
        logits_all_rows=all_rows,
    )


def build_sampling_batch(reqs: list, vocab_size: int, device: torch.device,
                         generators: dict[str, torch.Generator]) -> SamplingBatch:
    """Per-row tensors for the requests that sample this step (``reqs`` in row order)."""
    ps = [r.sampling_params for r in reqs]
    R = len(reqs)

    def col(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    staging = step_staging(device)
    if staging is None and const_inputs(device) and all(
            p.temperature == 0 and p.top_p == 1.0 and p.top_k <= 0 and p.min_p == 0 for p in ps):
        temperature, top_p, top_k, min_p = _greedy_columns(device, R, vocab_size)  # what col() would copy
    elif staging is not None:  # the four columns in one pinned copy (torch.tensor's float32 rounding: the same values)
        temperature, top_p, top_k, min_p = staging.stage([
            np.array([p.temperature for p in ps], np.float32), np.array([p.top_p for p in ps], np.float32),
            np.array([p.top_k if p.top_k > 0 else vocab_size for p in ps], np.int64),
            np.array([p.min_p for p in ps], np.float32)])
    else:
        temperature, top_p = col([p.temperature for p in ps]), col([p.top_p for p in ps])
        top_k = col([p.top_k if p.top_k > 0 else vocab_size for p in ps], torch.int64)
        min_p = col([p.min_p for p in ps])
    b = SamplingBatch(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        all_greedy=all(p.temperature == 0 for p in ps),
        no_top_p=all(p.top_p >= 1.0 for p in ps),
        no_top_k=all(p.top_k <= 0 for p in ps),
        no_min_p=all(p.min_p <= 0 for p in ps),
    )
    if any(p.frequency_penalty or p.presence_penalty for p in ps):
        counts = torch.zeros(R, vocab_size, dtype=torch.int32)
        for i, r in enumerate(reqs):
            out = [t for t in r.output_token_ids if t >= 0]  # async placeholders: counted on the device
            if out:
                counts[i].index_add_(0, torch.tensor(out), torch.ones(len(out), dtype=torch.int32))
        b.output_counts = counts.to(device, non_blocking=True)
        b.frequency_penalty = col([p.frequency_penalty for p in ps])
        b.presence_penalty = col([p.presence_penalty for p in ps])
    if any(p.repetition_penalty != 1.0 for p in ps):
        seen = torch.zeros(R, vocab_size, dtype=torch.bool)
        for i, r in enumerate(reqs):
            seen[i, torch.tensor([t for t in r.all_token_ids if t >= 0])] = True  # async placeholders: on the device
        b.seen_mask = seen.to(device, non_blocking=True)
        b.repetition_penalty = col([p.repetition_penalty for p in ps])
    if any(p.logit_bias for p in ps):
        bias = torch.zeros(R, vocab_size)
        for i, p in enumerate(ps):
            for tok, val in (p.logit_bias or {}).items():
                bias[i, tok] = val
        b.logit_bias = bias.to(device, non_blocking=True)
    if any(p.allowed_token_ids for p in ps):
        allowed = torch.ones(R, vocab_size, dtype=torch.bool)
        for i, p in enumerate(ps):
            if p.allowed_token_ids:
                allowed[i] = False
                allowed[i, torch.tensor(p.allowed_token_ids)] = True
        b.allowed_mask = allowed.to(device, non_blocking=True)
    for i, r in enumerate(reqs):
        p = r.sampling_params
        if r.num_output_tokens < p.min_tokens:
            banned = list(p.stop_token_ids)
            if r.eos_token_id is not None and not p.ignore_eos:
                banned.append(r.eos_token_id)
            if banned:
                b.banned.append((i, banned))
        if p.seed is not None and p.temperature > 0:
            gen = generators.get(r.request_id)
            if gen is None:
                gen = generators[r.request_id] = torch.Generator(device=device).manual_seed(p.seed)
            b.generators[i] = gen
    b.max_num_logprobs = max((p.logprobs for p in ps if p.logprobs is not None), default=-1)
    if all(p.top_k > 0 or p.top_p >= 1.0 for p in ps):  # the fused sampler's top-k bound (core/sampler.py)
        b.top_k_bound = min(max((p.top_k for p in ps if p.top_k > 0), default=0), vocab_size)
    return b
