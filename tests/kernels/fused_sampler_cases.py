"""Cases for the fused Triton sampler (``plugins/platforms/cuda_sampler.py``, the CUDA platform's
``make_fused_sampler``) and its use by ``Sampler``.

Not collected directly (no ``test_`` prefix). On CPU, ``test_fused_sampler_cpu.py`` runs this file in a child
pytest with ``TRITON_INTERPRET=1`` (set before any ``@triton.jit``) at small sizes; on a CUDA machine run it
directly (``pytest tests/kernels/fused_sampler_cases.py``: `NANO_PART=s5a bash benchmarks/device/nano7.sh` does) at the real
vocabulary and with many more draws.

How correctness is established: (1) the kernel's pick equals ``argmax(logits / T + g)`` for the noise ``g``
that :func:`gumbel_noise` exports for the same keys, and the plain argmax for greedy rows (ties included);
(2) that noise is Gumbel (Kolmogorov-Smirnov) and independent across columns, and Gumbel-max over it follows
``softmax(x / T)`` (chi-square); (3) end to end, the kernel's draws follow the softmax (chi-square);
(4) seeds, logit processors and routing through ``Sampler``.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (run through test_fused_sampler_cpu.py)", allow_module_level=True)

from octavo.core.input_batch import build_sampling_batch  # noqa: E402
from octavo.core.messages import EngineCoreRequest  # noqa: E402
from octavo.core.request import Request  # noqa: E402
from octavo.core.sampler import Sampler, apply_logit_processors  # noqa: E402
from octavo.plugins.platforms.cuda import CudaPlatform  # noqa: E402
from octavo.plugins.platforms.cuda_sampler import fused_sample, gumbel_noise, row_keys, sample_rows  # noqa: E402
from octavo.sampling_params import SamplingParams  # noqa: E402

DEV = torch.device("cpu" if INTERPRET else "cuda")
V = 9000 if INTERPRET else 151936  # > 2 blocks of 4096 columns either way
KERNEL = CudaPlatform().make_fused_sampler()  # what the worker hands the runner's Sampler on CUDA


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of observed ``counts`` against ``probs`` (survival function via gammaincc)."""
    n = counts.sum().double()
    expected = probs.double() * n
    stat = ((counts.double() - expected) ** 2 / expected).sum()
    df = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def ks_uniform(u: torch.Tensor) -> tuple[float, float]:
    """Kolmogorov-Smirnov distance of ``u`` from U(0, 1) and the 0.001-level critical value."""
    us, _ = u.flatten().double().sort()
    n = us.numel()
    ecdf = torch.arange(1, n + 1, dtype=torch.float64, device=us.device) / n
    d = max((ecdf - us).max().item(), (us - (ecdf - 1 / n)).max().item())
    return d, 1.95 / math.sqrt(n)


def test_noise_is_gumbel_and_independent():
    n_cols = 60_000 if INTERPRET else 4_000_000
    keys = row_keys(2**40 + 12345, 2, {1: 99}).to(DEV)
    g = gumbel_noise(keys, n_cols).double()
    assert torch.isfinite(g).all()
    u = torch.exp(-torch.exp(-g))  # the Gumbel CDF maps its draws to U(0, 1)
    for row in range(2):
        d, crit = ks_uniform(u[row])
        assert d < crit, (row, d, crit)
    assert abs(g.mean().item() - 0.5772156649) < 0.02
    assert abs(g.var().item() - math.pi ** 2 / 6) < 0.05
    # no correlation between neighbouring columns, the four Philox lanes, or the two rows
    for a, b in [(u[0, :-1], u[0, 1:]), (u[0, :-1024], u[0, 1024:]), (u[0], u[1])]:
        c = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
        assert abs(c) < 4 / math.sqrt(a.numel()), c


def test_gumbel_max_over_the_noise_follows_the_softmax():
    """Groups of 8 consecutive columns of one row are independent draws: Gumbel-max over them vs softmax."""
    k, groups = 8, (6_000 if INTERPRET else 500_000)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0], dtype=torch.float64, device=DEV)
    temp = 0.6
    g = gumbel_noise(row_keys(2**41 + 7, 1, {}).to(DEV), k * groups)[0].double().view(groups, k)
    draws = (logits / temp + g).argmax(-1)
    counts = torch.bincount(draws, minlength=k)
    p = chi2_pvalue(counts.cpu(), torch.softmax(logits / temp, -1).cpu())
    assert p > 1e-3, (counts, p)


@pytest.mark.parametrize("dtype", [torch.bfloat16] if INTERPRET else [torch.float32, torch.bfloat16])
def test_kernel_is_gumbel_max_over_its_noise_and_exact_argmax_when_greedy(dtype):
    gen = torch.Generator().manual_seed(3)
    R = 7
    x = torch.randn(R, V, generator=gen).to(dtype)
    x[2, 5000] = x[2, 4097] = x[2, 4096] = 50.0  # ties across a block boundary: the first column wins
    x[3, V - 1] = 50.0  # the last column
    x[4, :] = 1.0  # all equal: column 0
    x = x.to(DEV)
    temp = torch.tensor([0.7, 0.0, 0.0, 0.0, 0.0, 1.3, 0.05], device=DEV)
    keys = row_keys(2**42 + 1, R, {5: 123}).to(DEV)
    got = fused_sample(x, temp, keys)
    g = gumbel_noise(keys, V)
    xf = x.float()
    greedy = xf.argmax(-1)
    assert got[1:5].tolist() == greedy[1:5].tolist() == [greedy[1].item(), 4096, V - 1, 0]
    for row in (0, 5, 6):
        score = xf[row] / temp[row] + g[row]
        assert score[got[row]] >= score.max() - 1e-4 * score.max().abs(), row
    # without explicit keys the same rows are keyed by base + row * K
    again = fused_sample(x, temp, None, base=2**42 + 1)
    assert again[[0, 6]].tolist() == got[[0, 6]].tolist()


def test_kernel_draws_follow_the_softmax():
    n, vocab = (32, 4200) if INTERPRET else (40_000, V)
    support = [0, 1, 4095, 4096, 8191, V - 1] if not INTERPRET else [0, 4095, 4096, vocab - 1]
    row = torch.full((vocab,), float("-inf"))
    vals = torch.linspace(0.3, -0.3, len(support)) if INTERPRET else torch.linspace(1.0, -1.0, len(support))
    row[support] = vals
    temp = 0.6
    x = row.to(DEV).expand(n, vocab)  # row stride 0: every row reads the same logits with its own key
    got = fused_sample(x, torch.full((n,), temp, device=DEV), None, base=2**43 + 5).cpu()
    assert set(got.tolist()) <= set(support)
    counts = torch.tensor([(got == s).sum().item() for s in support])
    p = chi2_pvalue(counts, torch.softmax(vals / temp, -1))
    assert p > 1e-3, (counts, p)


# ------------------------------------------------------------------------------------------------ Sampler
def _reqs(*params, outputs=None):
    out = []
    for i, p in enumerate(params):
        r = Request(EngineCoreRequest(f"r{i}", [1, 2, 3], p, 0.0, 0, eos_token_id=0), 100)
        for t in (outputs or {}).get(i, []):
            r.append_output_token(t)
        out.append(r)
    return out


def _batch(reqs, gens, vocab=V):
    return build_sampling_batch(reqs, vocab, DEV, gens)


def test_seeded_rows_reproducible_batch_independent_and_advancing():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, V, generator=gen).to(DEV) * 0.1  # flat: many plausible tokens
    seeded = SamplingParams(temperature=1.0, seed=1234)
    s = Sampler(KERNEL, force_fused=True)
    gens = {}
    alone = [s(x[3:4].clone(), _batch(_reqs(seeded), gens)).sampled.item() for _ in range(3)]
    others = [SamplingParams(temperature=0.8)] * 3 + [seeded] + [SamplingParams(temperature=0.5, seed=9),
                                                                  SamplingParams(temperature=0)]
    s2 = Sampler(KERNEL, force_fused=True)
    gens2 = {}
    in_batch = [s2(x.clone(), _batch(_reqs(*others), gens2)).sampled[3].item() for _ in range(3)]
    assert alone == in_batch
    assert len(set(alone)) > 1  # the key advances with each draw
    s3, gens3 = Sampler(KERNEL, force_fused=True), {}  # a new engine: the same sequence again
    assert alone == [s3(x[3:4].clone(), _batch(_reqs(seeded), gens3)).sampled.item() for _ in range(3)]


def test_logit_processors_apply_before_fused_sampling():
    x = torch.zeros(4, V, device=DEV)
    x[:, 0] = 30.0  # EOS dominates unless a processor removes it
    reqs = _reqs(SamplingParams(temperature=0.7, logit_bias={11: 100.0}),
                 SamplingParams(temperature=0.7, allowed_token_ids=[3, 4]),
                 SamplingParams(temperature=0.7, min_tokens=2, stop_token_ids=[1]),
                 SamplingParams(temperature=0.7, repetition_penalty=1e6, frequency_penalty=2.0),
                 outputs={3: [0]})
    x[2, 1] = 29.0
    s = Sampler(KERNEL, force_fused=True)
    for _ in range(1 if INTERPRET else 5):
        b = _batch(reqs, {})
        assert s.uses_fused(x, b)
        got = s(x.clone(), b).sampled.tolist()
        assert got[0] == 11 and got[1] in (3, 4) and got[2] not in (0, 1) and got[3] != 0, got
    # the same keys over the processed logits give the same tokens
    b = _batch(reqs, {})
    torch.manual_seed(5)
    via_sampler = s(x.clone(), b).sampled
    torch.manual_seed(5)
    base = int(torch.randint(1 << 32, 1 << 62, (1,)).item())
    direct = fused_sample(apply_logit_processors(x.clone(), b), b.temperature, None, base)
    assert via_sampler.tolist() == direct.tolist()


def test_the_cuda_platform_hands_out_the_fused_sampler():
    assert KERNEL is sample_rows
    x = torch.randn(2, V, device=DEV)
    b = _batch(_reqs(SamplingParams(temperature=0.7), SamplingParams(temperature=0.7)), {})
    assert not Sampler(None, force_fused=True).uses_fused(x, b)  # no platform kernel: the torch path


def test_routing_top_p_alone_and_all_greedy_keep_the_torch_path():
    x = torch.randn(2, V, device=DEV)
    s = Sampler(KERNEL, force_fused=True)
    assert s.uses_fused(x, _batch(_reqs(SamplingParams(temperature=0.7, top_k=5),
                                        SamplingParams(temperature=0.7)), {}))
    assert not s.uses_fused(x, _batch(_reqs(SamplingParams(temperature=0.7, top_p=0.9)), {}))
    assert s.uses_fused(x, _batch(_reqs(SamplingParams(temperature=0.7, min_p=0.1)), {}))
    assert not s.uses_fused(x, _batch(_reqs(SamplingParams(temperature=0)), {}))
    b = _batch(_reqs(SamplingParams(temperature=0.7, top_k=3)), {})
    got = s(x[:1].clone(), b).sampled.item()
    assert got in x[0].topk(3).indices.tolist()


def test_logprobs_are_raw_with_fused_sampling():
    x = torch.randn(2, V, device=DEV)
    b = _batch(_reqs(*[SamplingParams(temperature=0.9, logprobs=2)] * 2), {})
    out = Sampler(KERNEL, force_fused=True)(x.clone(), b)
    raw = torch.log_softmax(x.float(), -1)
    torch.testing.assert_close(out.logprobs[:, 0], raw.gather(1, out.sampled[:, None])[:, 0])
    torch.testing.assert_close(out.logprobs[:, 1:], raw.topk(2, dim=-1).values)


# ------------------------------------------------------------------------------------------------ min-p / top-k / top-p
FILTERS = [dict(top_k=5), dict(top_k=40, top_p=0.8), dict(min_p=0.05), dict(min_p=0.2, top_k=50, top_p=0.9),
           dict(top_k=1), dict(top_k=3, top_p=0.01), dict()]


def test_filter_thresholds_keep_exactly_the_torch_paths_tokens():
    from octavo.core.sampler import filter_thresholds, process_logits

    gen = torch.Generator().manual_seed(11)
    params = [SamplingParams(temperature=t, **f) for f in FILTERS for t in (0.5, 1.3)]
    x = (torch.randn(len(params), V, generator=gen) * 2).to(DEV)
    x[0, 100:110] = x[0].max() + 1  # a tie group at the top
    b = _batch(_reqs(*params), {})
    assert b.top_k_bound == 50 and Sampler(KERNEL, force_fused=True).uses_fused(x, b)
    thr = filter_thresholds(x, b)
    _, probs = process_logits(x.clone(), b)
    for row in range(len(params)):
        want = (probs[row] > 0).nonzero().flatten().tolist()
        got = (x[row] >= thr[row]).nonzero().flatten().tolist()
        assert got == want, (params[row], len(got), len(want))


def test_filtered_fused_draws_stay_in_the_kept_set_and_are_gumbel_max_over_it():
    from octavo.core.sampler import filter_thresholds

    gen = torch.Generator().manual_seed(12)
    params = [SamplingParams(temperature=0.8, **f) for f in FILTERS] + [SamplingParams(temperature=0, top_k=5)]
    R = len(params)
    x = (torch.randn(R, V, generator=gen) * 2).to(DEV)
    b = _batch(_reqs(*params), {})
    thr = filter_thresholds(x, b)
    keys = row_keys(2**44 + 3, R, {}).to(DEV)
    got = fused_sample(x, b.temperature, keys, thresholds=thr)
    g = gumbel_noise(keys, V)
    for row in range(R - 1):
        score = torch.where(x[row] >= thr[row], x[row] / b.temperature[row] + g[row], float("-inf"))
        assert x[row, got[row]] >= thr[row]
        assert score[got[row]] >= score.max() - 1e-4 * score.max().abs(), row
    assert got[R - 1] == x[R - 1].argmax()  # greedy rows ignore the filters, as the torch path


def test_top_p_without_top_k_keeps_the_torch_path():
    x = torch.randn(2, V, device=DEV)
    s = Sampler(KERNEL, force_fused=True)
    b = _batch(_reqs(SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.7, top_k=5)), {})
    assert b.top_k_bound == -1 and not s.uses_fused(x, b)
    b = _batch(_reqs(SamplingParams(temperature=0.7, top_k=2000, top_p=0.9)), {})
    assert b.top_k_bound == 2000 and not s.uses_fused(x, b)  # above MAX_FUSED_TOP_K


def test_filtered_draws_follow_the_torch_paths_distribution():
    from octavo.core.sampler import process_logits

    n = 24 if INTERPRET else 20_000
    gen = torch.Generator().manual_seed(13)
    row = torch.randn(V, generator=gen) * 1.5
    p = SamplingParams(temperature=0.9, top_k=6, top_p=0.85, min_p=0.02)
    b = _batch(_reqs(*[p] * n), {})
    x = row.to(DEV).expand(n, V)
    _, probs = process_logits(x[:1].clone().float(), _batch(_reqs(p), {}))
    support = (probs[0] > 0).nonzero().flatten()
    got = Sampler(KERNEL, force_fused=True)(x, b).sampled.cpu()
    assert set(got.tolist()) <= set(support.cpu().tolist())
    counts = torch.tensor([(got == s).sum().item() for s in support.cpu()])
    pv = chi2_pvalue(counts, probs[0, support].cpu())
    assert pv > 1e-3, (counts, pv)
