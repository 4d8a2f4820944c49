"""Token sampling over a batch of logits rows, one row per request that yields a token this step.

Small pure functions, applied in vLLM's order: logprobs of the raw distribution are taken first; then
logit bias, allowed tokens, min_tokens masking and penalties change the logits; then temperature, min_p,
top_k and top_p filter them; finally greedy rows take the argmax and the others sample with exponential
noise (``argmax(p / q)``, q ~ Exp(1) — the same as sampling from p), where a seeded request draws its
noise from its own generator so its tokens never depend on the rest of the batch. Where the platform has a
fused sampler (``Platform.make_fused_sampler``; CUDA: one Triton pass, plugins/platforms/cuda_sampler.py), batches
with a random row take it instead (see :class:`Sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.env_flags import env_switch


@dataclass
class SamplingBatch:
    """Per-row sampling parameters as device tensors (built by the model runner)."""

    temperature: torch.Tensor  # [R] float; 0 marks a greedy row
    top_p: torch.Tensor  # [R] float
    top_k: torch.Tensor  # [R] int64; vocab size where disabled
    min_p: torch.Tensor  # [R] float
    all_greedy: bool
    no_top_p: bool
    no_top_k: bool
    no_min_p: bool
    presence_penalty: torch.Tensor | None = None  # [R]
    frequency_penalty: torch.Tensor | None = None  # [R]
    repetition_penalty: torch.Tensor | None = None  # [R]
    output_counts: torch.Tensor | None = None  # [R, V] occurrences of each token in the output so far
    seen_mask: torch.Tensor | None = None  # [R, V] token appears in prompt or output (repetition penalty)
    logit_bias: torch.Tensor | None = None  # [R, V] added to logits
    allowed_mask: torch.Tensor | None = None  # [R, V] True where a token may be sampled
    banned: list[tuple[int, list[int]]] = field(default_factory=list)  # (row, token ids) masked by min_tokens
    generators: dict[int, torch.Generator] = field(default_factory=dict)  # row -> per-request generator
    max_num_logprobs: int = -1  # -1: no row wants logprobs
    # the largest top_k of any row when every top-p row also has a top-k (0: no row has one); -1: some row
    # filters by top-p alone (the fused path then needs the whole sorted row: it falls back to torch)
    top_k_bound: int = -1


@dataclass
class SamplerOutput:
    sampled: torch.Tensor  # [R] int64
    # present when some row asked for logprobs: [R, 1 + k] ids/logprobs (sampled first), ranks [R]
    logprob_token_ids: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None
    sampled_ranks: torch.Tensor | None = None


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the raw model distribution (before any sampling parameter)."""
    return torch.log_softmax(logits.float(), dim=-1)


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, k: int):
    """The chosen token's logprob and rank (1 = most likely) followed by the top ``k`` entries."""
    chosen = logprobs.gather(-1, token_ids.unsqueeze(-1))  # [R, 1]
    ranks = (logprobs > chosen).sum(-1) + 1  # [R]
    if k > 0:
        top_lp, top_ids = logprobs.topk(k, dim=-1)
        ids = torch.cat([token_ids.unsqueeze(-1), top_ids], dim=-1)
        lps = torch.cat([chosen, top_lp], dim=-1)
    else:
        ids, lps = token_ids.unsqueeze(-1), chosen
    return ids, lps, ranks


def apply_penalties(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Repetition (HF: divide positive, multiply negative logits of seen tokens), then frequency and
    presence penalties over the output tokens (OpenAI's definition)."""
    if b.repetition_penalty is not None and b.seen_mask is not None:
        rep = b.repetition_penalty.unsqueeze(1).expand_as(logits)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(b.seen_mask, penalized, logits)
    if b.output_counts is not None:
        counts = b.output_counts.to(logits.dtype)
        if b.frequency_penalty is not None:
            logits = logits - b.frequency_penalty.unsqueeze(1) * counts
        if b.presence_penalty is not None:
            logits = logits - b.presence_penalty.unsqueeze(1) * (counts > 0).to(logits.dtype)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the most likely token's."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Keep the ``top_k`` most likely tokens, then the smallest set whose probability reaches ``top_p``."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        # ascending sort: the k largest are the last k; mask everything below the k-th largest.
        kth = sorted_logits.gather(-1, (vocab - top_k.clamp(1, vocab)).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        drop = cum <= (1 - top_p.unsqueeze(1))
        drop[:, -1] = False  # always keep the most likely token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Sample one token per row: ``argmax(p / q)`` with q ~ Exp(1) is a draw from p."""
    q = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    return probs.div(q).argmax(dim=-1)


def apply_logit_processors(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """Logit bias, allowed tokens, min_tokens bans and penalties (float logits; may write in place)."""
    if b.logit_bias is not None:
        logits = logits + b.logit_bias
    if b.allowed_mask is not None:
        logits = logits.masked_fill(~b.allowed_mask, float("-inf"))
    for row, token_ids in b.banned:
        logits[row, token_ids] = float("-inf")
    return apply_penalties(logits, b)


def has_logit_processors(b: SamplingBatch) -> bool:
    return (b.logit_bias is not None or b.allowed_mask is not None or bool(b.banned)
            or b.output_counts is not None or b.seen_mask is not None)


def process_logits(logits: torch.Tensor, b: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every sampling parameter applied to float logits: the greedy choice of each row, and the
    distribution random rows sample from (None when all rows are greedy). Shared with the rejection
    sampler (speculative decoding), so verification sees exactly the distribution sampling would."""
    logits = apply_logit_processors(logits, b)
    greedy = logits.argmax(dim=-1)
    if b.all_greedy:
        return greedy, None
    temp = torch.where(b.temperature > 0, b.temperature, torch.ones_like(b.temperature))
    scaled = logits / temp.unsqueeze(1)
    if not b.no_min_p:
        scaled = apply_min_p(scaled, b.min_p)
    if not (b.no_top_k and b.no_top_p):
        scaled = apply_top_k_top_p(scaled, None if b.no_top_k else b.top_k, None if b.no_top_p else b.top_p)
    return greedy, scaled.softmax(dim=-1)


MAX_FUSED_TOP_K = 1024  # top-k / top-p rows take the fused path when every top-p row has a top_k up to this


def filter_thresholds(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    """min_p, top_k and top_p of each row as one logit threshold ([R] fp32): a token survives the torch path's
    ``apply_min_p`` and ``apply_top_k_top_p`` iff its logit is >= the threshold. Thresholds are logits of the
    row itself (or ``max + T log min_p``), so the kernel compares raw logits, never a re-divided value. Needs
    ``b.top_k_bound`` > 0 when a row has top-k or top-p (top-p runs over the ``top_k`` candidates)."""
    temp = torch.where(b.temperature > 0, b.temperature, torch.ones_like(b.temperature))
    lf = logits.float()
    thr = torch.full_like(temp, float("-inf"))
    if not b.no_min_p:  # p_i >= min_p * p_max  <=>  x_i >= x_max + T log(min_p)
        row_max = lf.amax(dim=-1)
        thr = torch.where(b.min_p > 0, row_max + temp * torch.log(b.min_p), thr)
    if b.no_top_k and b.no_top_p:
        return thr
    k = b.top_k_bound
    vals = lf.topk(k, dim=-1).values  # [R, k] descending
    vals = vals.masked_fill(vals < thr.unsqueeze(1), float("-inf"))  # min_p first, as the torch path
    top_k = b.top_k.clamp(1, k)
    if not b.no_top_k:  # keep the top_k largest (ties with the k-th included); rows without top-k: -inf
        kth = vals.gather(1, (top_k - 1).unsqueeze(1)).squeeze(1)
        kth = torch.where(b.top_k < logits.shape[-1], kth, torch.full_like(kth, float("-inf")))
        thr = torch.maximum(thr, kth)
        vals = vals.masked_fill(vals < kth.unsqueeze(1), float("-inf"))
    if not b.no_top_p:  # the torch path's rule over the top-k candidates in ascending order
        asc = (vals / temp.unsqueeze(1)).flip(-1)
        cum = asc.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - b.top_p.unsqueeze(1))
        drop[:, -1] = False
        first_kept = drop.sum(dim=-1, keepdim=True)  # drop is a prefix (cum increases)
        cut = vals.flip(-1).gather(1, first_kept).squeeze(1)
        thr = torch.where(b.top_p < 1.0, torch.maximum(thr, cut), thr)
    return thr


class Sampler:
    """The sampling step of the model runner.

    Batches with a random row take ``kernel``, the platform's fused sampler (``Platform.make_fused_sampler``;
    on CUDA one Triton pass, plugins/platforms/cuda_sampler.py: Gumbel-max over ``logits / T``, greedy rows exact
    argmax, per-request seeds reproducible) unless a row filters by top-p without a top-k (or a top-k above
    ``MAX_FUSED_TOP_K``); min-p / top-k / top-p become one logit threshold per row (:func:`filter_thresholds`).
    The logit processors still run first, in torch. ``OCTAVO_FUSED_SAMPLER=0`` keeps the torch path everywhere;
    ``force_fused=True`` takes the kernel whatever that variable says (tests under ``TRITON_INTERPRET``).
    """

    def __init__(self, kernel=None, force_fused: bool = False) -> None:
        self.kernel = kernel  # sample(logits, temperature, generators, thresholds) -> [R] int64, or None
        self.fused = env_switch("OCTAVO_FUSED_SAMPLER")
        self.force_fused = force_fused
        self.greedy_argmax = None  # argmax(logits) -> [R] int64, the platform's (Platform.make_greedy_argmax)

    def uses_fused(self, logits: torch.Tensor, b: SamplingBatch) -> bool:
        if self.kernel is None or b.all_greedy:
            return False
        if not (b.no_top_k and b.no_top_p) and not 0 < b.top_k_bound <= MAX_FUSED_TOP_K:
            return False
        return self.force_fused or self.fused

    def sample_fused(self, logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
        if has_logit_processors(b):
            logits = apply_logit_processors(logits.float(), b)
        thresholds = None if b.no_top_k and b.no_top_p and b.no_min_p else filter_thresholds(logits, b)
        return self.kernel(logits, b.temperature, b.generators, thresholds)

    def __call__(self, logits: torch.Tensor, b: SamplingBatch) -> SamplerOutput:
        raw_logprobs = compute_logprobs(logits) if b.max_num_logprobs >= 0 else None
        if self.uses_fused(logits, b):
            sampled = self.sample_fused(logits, b)
        elif b.all_greedy and self.greedy_argmax is not None and not has_logit_processors(b):
            sampled = self.greedy_argmax(logits.float())
        else:
            greedy, probs = process_logits(logits.float(), b)
            if probs is None:
                sampled = greedy
            else:
                sampled = random_sample(probs, b.generators)
                sampled = torch.where(b.temperature > 0, sampled, greedy)

        out = SamplerOutput(sampled=sampled)
        if raw_logprobs is not None:
            out.logprob_token_ids, out.logprobs, out.sampled_ranks = gather_logprobs(
                raw_logprobs, sampled, b.max_num_logprobs)
        return out

