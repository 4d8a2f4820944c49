"""``SpeculatorContract``: the pytest suite every speculative-decoding proposer must pass.

A proposer can only change speed: whatever it proposes, the engine's output must be exactly what decoding
without speculation gives (greedy), or follow the same distribution (sampled). The suite checks that on a
real model (default: the embedded SmolLM2-135M-Instruct, fp32, CPU), with chunked prefill, prefix caching
and preemption forced, over raw and chat prompts in one batch; and that proposals are well formed.

    from octavo.testing import SpeculatorContract
    from octavo_myspec import MyProposer

    class TestMyProposer(SpeculatorContract):
        speculator_cls = MyProposer
        speculative_config = {"method": "my_method", "num_speculative_tokens": 3}

Use a float checkpoint (``llm_kwargs["model"]``): a quantized model's CPU kernels can give results that
depend on the batch shape enough to flip near-ties, with or without speculation.

The method must be registered (the plugin installed, as it is in its own test run). Two engines load per
test class (with and without speculation); ``llm_kwargs`` sets both.
"""

from __future__ import annotations

import math
import random
from typing import Any, ClassVar

import pytest

from octavo.speculator import SpecContext, SpecRequest, SpeculativeConfig

RAW_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "Paris is the capital of",
]
CHAT_PROMPTS = [
    [{"role": "user", "content": "Repeat this sentence exactly: the cat sat on the mat and looked at the rain."}],
    [{"role": "user", "content": "Fix the spelling: 'I recieved teh package yesterday and it was grate.'"}],
]


_BASELINES: dict[str, Any] = {}  # engines without speculation, by settings


class SpeculatorContract:
    """Subclass and set ``speculator_cls`` and ``speculative_config``."""

    speculator_cls: ClassVar[type]
    speculative_config: ClassVar[dict[str, Any]]
    #: engine settings for both engines: chunked prefill with a small budget, prefix caching, and a KV cache
    #: small enough that the batch below preempts. Greedy admission: the default (projected) admits fewer
    #: requests so as not to preempt (2 preemptions left in the greedy test on SmolLM2 + ngram; greedy: 5).
    llm_kwargs: ClassVar[dict[str, Any]] = dict(dtype="float32", max_model_len=256, block_size=16,
                                                max_num_batched_tokens=64, enable_prefix_caching=True,
                                                num_gpu_blocks_override=10, seed=0, kv_admission="greedy")
    max_tokens: ClassVar[int] = 24
    vocab_size_for_proposals: ClassVar[int] = 49152
    #: sampled check: draws per engine (two-sample chi-square over the second generated token)
    num_samples: ClassVar[int] = 200

    # ---- engines ---------------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    def engines(self):
        from octavo import LLM
        from octavo.registry import resolve

        config = dict(self.speculative_config)
        config.setdefault("disable_by_batch_size", 0)  # keep speculating whatever the batch size
        assert resolve("speculators", config["method"]) is self.speculator_cls, (
            f"method {config['method']!r} does not resolve to {self.speculator_cls.__name__}: install the plugin")
        key = repr(sorted(self.llm_kwargs.items()))
        base = _BASELINES.get(key)
        if base is None:  # one baseline per settings, shared by every contract class of the run
            base = _BASELINES[key] = LLM(**self.llm_kwargs)
        spec = LLM(speculative_config=config, **self.llm_kwargs)
        yield base, spec
        spec.llm_engine.shutdown()

    def make_speculator(self):
        """The proposer built directly (for the well-formedness check); override when it needs more."""
        cfg = SpeculativeConfig.model_validate(self.speculative_config)
        ctx = SpecContext(platform=None, vocab_size=self.vocab_size_for_proposals, max_model_len=256)
        return self.speculator_cls(num_speculative_tokens=cfg.num_speculative_tokens, config=cfg, context=ctx)

    # ---- the suite -------------------------------------------------------------------------------
    def test_proposals_are_well_formed(self):
        spec = self.make_speculator()
        rng = random.Random(0)
        k = spec.num_speculative_tokens
        reqs = []
        for i in range(8):
            prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
            reqs.append(SpecRequest(f"r{i}", prompt * 2, len(prompt), max_num_drafts=1 + i % k))
        proposals = spec.propose(reqs)
        assert isinstance(proposals, list) and len(proposals) == len(reqs)
        for r, drafts in zip(reqs, proposals):
            assert isinstance(drafts, list) and len(drafts) <= r.max_num_drafts
            assert all(isinstance(t, int) and 0 <= t < self.vocab_size_for_proposals for t in drafts)
        spec.release([r.request_id for r in reqs])

    def _prompts(self, llm) -> list:
        engine = llm.llm_engine
        render = getattr(engine, "render_chat", None) or engine.input_processor.apply_chat_template
        chats = [{"prompt_token_ids": render(c, add_generation_prompt=True)[1]} for c in CHAT_PROMPTS]
        return RAW_PROMPTS + chats

    def test_greedy_equals_non_speculative(self, engines):
        from octavo import SamplingParams

        base, spec = engines
        params = SamplingParams(temperature=0, max_tokens=self.max_tokens, ignore_eos=False)
        want = base.generate(self._prompts(base), params, use_tqdm=False)
        with SpecPreemptionProbe(spec) as probe:
            got = spec.generate(self._prompts(spec), params, use_tqdm=False)
        for w, g in zip(want, got):
            assert g.outputs[0].token_ids == w.outputs[0].token_ids, g.prompt
            assert g.outputs[0].finish_reason == w.outputs[0].finish_reason
        probe.check()

    def test_greedy_with_logprobs_stops_and_n(self, engines):
        from octavo import SamplingParams

        base, spec = engines
        prompt = RAW_PROMPTS[0]
        params = SamplingParams(temperature=0, max_tokens=17, logprobs=2, stop=[" lazy"], n=2)
        w, g = (llm.generate([prompt], params, use_tqdm=False)[0] for llm in (base, spec))
        for a, b in zip(w.outputs, g.outputs):
            assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
            assert len(b.logprobs) == len(a.logprobs)
            for la, lb in zip(a.logprobs, b.logprobs):
                assert la.keys() == lb.keys()
                for t in la:
                    assert math.isclose(la[t].logprob, lb[t].logprob, abs_tol=1e-3)

    def test_sampled_matches_the_target_distribution(self, engines):
        """Two-sample chi-square (homogeneity) over the second generated token, with temperature, top-k
        and a penalty, seeded so the test is reproducible: the same distribution with and without drafts."""
        from octavo import SamplingParams

        if self.num_samples <= 0:
            pytest.skip("num_samples=0: the sampled check is off for this class")
        base, spec = engines
        prompt = RAW_PROMPTS[2]
        n = self.num_samples
        counts = []
        for llm in (base, spec):
            params = [SamplingParams(temperature=1.0, top_k=20, presence_penalty=0.3, max_tokens=3, seed=1000 + i)
                      for i in range(n)]
            outs = llm.generate([prompt] * n, params, use_tqdm=False)
            c: dict[int, int] = {}
            for o in outs:
                ids = o.outputs[0].token_ids
                if len(ids) > 1:
                    c[ids[1]] = c.get(ids[1], 0) + 1
            counts.append(c)
        p = chi_square_homogeneity(counts[0], counts[1])
        assert p > 1e-3, f"speculative sampling changed the distribution (p={p:.2e}): {counts}"

    def test_seeded_requests_reproduce(self, engines):
        from octavo import SamplingParams

        _, spec = engines
        params = SamplingParams(temperature=0.8, max_tokens=20, seed=42)
        a = spec.generate([RAW_PROMPTS[1]], params, use_tqdm=False)[0].outputs[0].token_ids
        b = spec.generate([RAW_PROMPTS[1]], params, use_tqdm=False)[0].outputs[0].token_ids
        assert a == b


class SpecPreemptionProbe:
    """Watches an in-process engine's scheduler while a ``generate`` runs, so a test can show that speculation ran
    under preemption: some request was preempted (its KV blocks freed, recomputed later) and, resumed, had drafts
    verified again. The engine's counters alone cannot say that a preempted request speculated afterwards.

        with SpecPreemptionProbe(llm) as probe:
            llm.generate(...)
        probe.check()
    """

    def __init__(self, llm: Any) -> None:
        self.engine = llm.llm_engine
        self.scheduler = self.engine.core.scheduler  # in-process engine core (LLM's default)
        self.preempted: set[str] = set()
        self.resumed_with_drafts: set[str] = set()
        self.draft_steps = 0

    def __enter__(self) -> SpecPreemptionProbe:
        self.stats_before = self.engine.get_stats()
        schedule = self.scheduler.schedule

        def watched():
            out = schedule()
            self.preempted.update(out.preempted_ids)
            for s in out.scheduled:
                if s.spec_token_ids:
                    self.draft_steps += 1
                    if s.req.num_preemptions > 0:
                        self.resumed_with_drafts.add(s.req.request_id)
            return out

        self.own = vars(self.scheduler).get("schedule")  # an instance attribute already there (another wrapper)
        self.scheduler.schedule = watched
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.own is None:
            del self.scheduler.schedule  # the class's method again
        else:
            self.scheduler.schedule = self.own
        self.stats_after = self.engine.get_stats()

    def check(self) -> None:
        """Fail unless a preemption happened and a preempted request was verified with drafts after it."""
        preemptions = self.stats_after.num_preemptions - self.stats_before.num_preemptions
        assert preemptions > 0 and self.preempted, (
            "the KV cache was meant to force preemption; lower num_gpu_blocks_override or use kv_admission='greedy'")
        assert self.draft_steps > 0, "no drafts were verified: speculation did not run"
        assert self.resumed_with_drafts, (
            f"no preempted request ({sorted(self.preempted)}) was verified with drafts after it resumed")


def chi_square_homogeneity(a: dict[int, int], b: dict[int, int], min_expected: float = 5.0) -> float:
    """p-value that two samples of categories come from one distribution (rare categories pooled)."""
    import torch

    keys = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    rows, pooled = [], [0, 0]
    for k in keys:
        ca, cb = a.get(k, 0), b.get(k, 0)
        if (ca + cb) * min(na, nb) / (na + nb) < min_expected:
            pooled[0] += ca
            pooled[1] += cb
        else:
            rows.append((ca, cb))
    if sum(pooled):
        rows.append(tuple(pooled))
    if len(rows) < 2:
        return 1.0
    stat = 0.0
    for ca, cb in rows:
        tot = ca + cb
        for obs, n in ((ca, na), (cb, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    df = len(rows) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
