"""The rejection sampler alone: greedy exactness, the target distribution preserved (chi-square against a
float64 computation of what sampling without speculation draws), seeds, and the sampler's parameters."""

from __future__ import annotations

import torch

from octavo.core.input_batch import build_sampling_batch
from octavo.core.messages import EngineCoreRequest
from octavo.core.rejection_sampler import split_emitted, verify
from octavo.core.request import Request
from octavo.core.sampler import Sampler
from octavo.core.spec_decode import expand_for_verification
from octavo.sampling_params import SamplingParams

CPU = torch.device("cpu")


def make_req(rid: str, params: SamplingParams, outputs=(), prompt=(1, 2, 3)) -> Request:
    r = Request(EngineCoreRequest(rid, list(prompt), params, 0.0, 0, eos_token_id=0), 100)
    for t in outputs:
        r.append_output_token(t)
    return r


def run_verify(logits, reqs, drafts, vocab, generators=None, draft_probs=None):
    rows = expand_for_verification(reqs, drafts)
    b = build_sampling_batch(rows, vocab, CPU, {} if generators is None else generators)
    out = verify(logits, b, [len(d) for d in drafts], drafts, draft_probs)
    return split_emitted(out.row_tokens.tolist(), out.accepted.tolist(), [len(d) for d in drafts])


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs`` (float64)."""
    n = counts.sum().double()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability 0 was drawn"
    expected = probs[keep].double() * n
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def test_greedy_emits_the_argmax_chain():
    torch.manual_seed(0)
    V = 40
    reqs = [make_req(f"r{i}", SamplingParams(temperature=0)) for i in range(3)]
    logits = torch.randn(5 + 1 + 3, V, dtype=torch.float64)
    target = logits.argmax(-1).tolist()  # float64 reference
    drafts = [[target[0], target[1], (target[2] + 1) % V, target[3]], [], [(target[6] + 1) % V, 5]]
    got = run_verify(logits.float(), reqs, drafts, V)
    assert got[0] == (0, target[0:3])  # two accepted, then the correction at the first mismatch
    assert got[1] == (5, [target[5]])  # no drafts: one ordinary token
    assert got[2] == (6, [target[6]])  # first draft rejected
    all_ok = [[target[0], target[1], target[2], target[3]], [], [target[6], target[7]]]
    got = run_verify(logits.float(), reqs, all_ok, V)
    assert got[0][1] == target[0:5] and got[2][1] == target[6:9]  # all accepted + the bonus token


def test_no_drafts_matches_the_plain_sampler_with_seeds():
    torch.manual_seed(1)
    V = 50
    params = [SamplingParams(temperature=0.8, top_k=10, seed=7), SamplingParams(temperature=0),
              SamplingParams(temperature=1.2, top_p=0.9, min_p=0.05, seed=3, presence_penalty=0.5)]
    reqs = [make_req(f"r{i}", p, outputs=[4, 4, 9]) for i, p in enumerate(params)]
    logits = torch.randn(3, V)
    b = build_sampling_batch(reqs, V, CPU, {})
    plain = Sampler()(logits.clone(), b).sampled.tolist()
    got = run_verify(logits, reqs, [[], [], []], V)
    assert [t for _, ts in got for t in ts] == plain


def test_penalties_see_the_accepted_drafts():
    """Position j's row counts drafts 0..j-1 as output (frequency penalty), as plain decoding would."""
    V = 10
    logits = torch.zeros(3, V)
    logits[:, 3] = 1.0  # token 3 wins unless penalized
    logits[:, 5] = 0.9
    req = make_req("r", SamplingParams(temperature=0, frequency_penalty=0.5))
    got = run_verify(logits, [req], [[3, 3]], V)
    # row 0: 3 wins (accept draft 3); row 1: 3 has count 1 -> 0.5 < 0.9 -> 5 wins: draft 3 rejected.
    assert got == [(0, [3, 5])]
    req = make_req("r", SamplingParams(temperature=0, min_tokens=2))
    logits[:, 0] = 5.0  # EOS (id 0) is most likely but banned below min_tokens
    assert run_verify(logits, [req], [[3, 3]], V) == [(0, [3, 3, 0])]


def _trials(p_logits: torch.Tensor, drafts: list[int], params: SamplingParams, n: int, draft_probs=None,
            draft_sampler=None):
    """Run ``n`` independent requests with the same logits rows; returns (first tokens, second tokens
    where the first draft was accepted)."""
    V = p_logits.shape[1]
    k = len(drafts)
    reqs = [make_req(f"r{i}", params) for i in range(n)]
    all_drafts = [draft_sampler() if draft_sampler else list(drafts) for _ in range(n)]
    logits = p_logits.repeat(n, 1)
    dp = None
    if draft_probs is not None:
        dp = draft_probs.repeat(n, 1)
    got = run_verify(logits, reqs, all_drafts, V, draft_probs=dp)
    first = torch.tensor([ts[0] for _, ts in got])
    second = torch.tensor([ts[1] for (_, ts), ds in zip(got, all_drafts) if len(ts) > 1 and k > 1 and ts[0] == ds[0]])
    return first, second, all_drafts


def test_rejection_sampling_preserves_the_target_distribution():
    """Fixed seeds, 40k draws of a 12-token vocabulary: a 2% shift of one token's probability at ~0.3
    gives chi-square p < 1e-6, far below the threshold used here."""
    torch.manual_seed(1234)
    V, n = 12, 40_000
    p_logits = torch.randn(3, V) * 1.5
    params = SamplingParams(temperature=0.9, top_k=8)
    # the target distribution in float64, as plain sampling defines it (temperature, then top-k)
    scaled = p_logits.double() / 0.9
    kth = scaled.topk(8, dim=-1).values[:, -1:]
    target = torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), -1)
    likely = int(target[0].argmax())
    for drafts in ([likely, 1], [int(target[0].argmin()), 2]):  # a good and a hopeless proposal
        first, second, _ = _trials(p_logits, drafts, params, n)
        assert chi_square_p(torch.bincount(first, minlength=V), target[0]) > 1e-3
        if drafts[0] == likely:
            assert len(second) > 1000
            assert chi_square_p(torch.bincount(second, minlength=V), target[1]) > 1e-3
        # the acceptance rate of the first draft is p(d) (float64), within 4 sigma
        acc = (first == drafts[0]).double().mean()
        pd = target[0, drafts[0]]
        assert abs(acc - pd) < 4 * (pd * (1 - pd) / n).sqrt() + 1e-9


def test_rejection_sampling_with_draft_distributions():
    """A proposer that samples its drafts from its own q (draft model): still exactly p."""
    torch.manual_seed(99)
    V, n = 10, 40_000
    p_logits = torch.randn(2, V)
    q = torch.softmax(torch.randn(1, V), -1)
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=1.0)

    def draw():
        return [int(torch.multinomial(q[0], 1, generator=gen))]

    first, _, drafts = _trials(p_logits, [], params, n, draft_probs=q, draft_sampler=draw)
    target = torch.softmax(p_logits.double(), -1)
    assert chi_square_p(torch.bincount(first, minlength=V), target[0]) > 1e-3
    # the acceptance rate is sum(min(p, q)) (float64)
    d = torch.tensor([ds[0] for ds in drafts])
    expected = torch.minimum(target[0], q[0].double()).sum()
    acc = (first == d).double().mean()
    assert abs(acc - expected) < 4 * (expected * (1 - expected) / n).sqrt()


def test_a_two_percent_shift_is_detected():
    """The test above has the power it claims: draws from a distribution shifted by 2% fail it."""
    torch.manual_seed(7)
    V, n = 12, 40_000
    target = torch.softmax(torch.randn(V, dtype=torch.float64) * 1.5, -1)
    shifted = target.clone()
    top = int(target.argmax())
    shifted[top] += 0.02
    shifted /= shifted.sum()
    draws = torch.multinomial(shifted.float(), n, replacement=True)
    assert chi_square_p(torch.bincount(draws, minlength=V), target) < 1e-3


def test_seeded_requests_reproduce():
    torch.manual_seed(3)
    V = 30
    logits = torch.randn(4, V)
    outs = []
    for _ in range(2):
        req = make_req("r", SamplingParams(temperature=1.0, seed=11))
        gens: dict = {}
        outs.append(run_verify(logits, [req], [[1, 2, 3]], V, generators=gens))
    assert outs[0] == outs[1]
