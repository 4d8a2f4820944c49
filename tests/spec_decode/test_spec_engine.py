"""Speculative decoding end to end on the real SmolLM2 (fp32, CPU): every built-in proposer, and a
deliberately bad one, pass the SpeculatorContract (greedy equal to non-speculative decoding with chunked
prefill, prefix caching and forced preemption; logprobs, stop strings, n > 1; sampled distribution; seeds).
Plus the start-time refusals and the metrics."""

from __future__ import annotations

import os
import random

import pytest

from octavo import hookimpl
from octavo.plugins.spec_decode.draft_model import DraftModelProposer
from octavo.plugins.spec_decode.ngram import NgramProposer
from octavo.speculator import Speculator
from octavo.testing import SpeculatorContract

pytestmark = pytest.mark.slow
FULL = os.environ.get("OCTAVO_SPEC_DECODE") == "full"  # `make spec-decode`
full_only = pytest.mark.skipif(not FULL, reason="loads two more models; run `make spec-decode`")


def _fp32_dir() -> str:
    """SmolLM2 in float32 safetensors: the embedded GGUF is quantized, and its CPU kernels' results depend on
    the batch shape enough to flip near-ties, with or without speculation."""
    from tests.utils import smollm2_safetensors_dir

    return str(smollm2_safetensors_dir("float32"))


# one torch thread: the shared CI machine is oversubscribed, where OpenMP spinning costs more than it gives
LLM_KWARGS = {**SpeculatorContract.llm_kwargs, "model": _fp32_dir(), "num_threads": 1}


class TestNgram(SpeculatorContract):
    speculator_cls = NgramProposer
    llm_kwargs = LLM_KWARGS
    # the sampled engine check costs minutes on the shared CI machine; the exact distribution tests are
    # test_rejection_sampler.py and test_spec_smollm2_distribution.py
    num_samples = 200 if FULL else 0
    speculative_config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


@full_only
class TestDraftModelSelf(SpeculatorContract):
    """SmolLM2 drafting for itself: every greedy draft is accepted, so any mismatch is a verification bug."""

    speculator_cls = DraftModelProposer
    llm_kwargs = LLM_KWARGS
    speculative_config = {"method": "draft_model", "model": _fp32_dir(), "num_speculative_tokens": 3}
    num_samples = 200

    def make_speculator(self):
        pytest.skip("the draft model needs the engine's loader; its proposals are validated by the engine")

    def test_all_greedy_drafts_are_accepted(self, engines):
        from octavo import SamplingParams

        _, spec = engines
        before = spec.llm_engine.get_stats()
        spec.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
        after = spec.llm_engine.get_stats()
        proposed = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
        accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
        assert proposed > 0 and accepted == proposed


@full_only
class TestDraftModel4bit(SpeculatorContract):
    """The embedded SmolLM2 Q4_1 GGUF (4-bit weights) drafting for SmolLM2 fp32: same tokenizer, its own KV
    cache, drafts mostly but not always accepted."""

    speculator_cls = DraftModelProposer
    llm_kwargs = LLM_KWARGS
    num_samples = 200

    @property
    def speculative_config(self):
        from tests.utils import smollm2_gguf_path

        return {"method": "draft_model", "model": smollm2_gguf_path(), "num_speculative_tokens": 3}

    def make_speculator(self):
        pytest.skip("the draft model needs the engine's loader; its proposals are validated by the engine")


class RandomProposer(Speculator):
    """Proposes garbage: random tokens, random lengths (the engine must still be exact). Seeded by the
    request's tokens, so it is deterministic given what it saw, as the interface asks (seeded requests
    reproduce only with such proposers)."""

    name = "random_test"

    def propose(self, requests):
        vocab = self.context.vocab_size if self.context else 100
        out = []
        for r in requests:
            rng = random.Random(hash(tuple(r.token_ids)))
            out.append([rng.randrange(vocab) for _ in range(rng.randint(0, r.max_num_drafts))])
        return out


class _RandomPlugin:
    @hookimpl
    def octavo_register_speculators(self, register):
        register("random_test", RandomProposer)


@pytest.fixture(scope="module", autouse=True)
def random_proposer_registered():
    """Register RandomProposer for this module only (a plugin object handed to a fresh plugin manager)."""
    from octavo.core import plugin_manager

    saved = plugin_manager._PM
    plugin_manager._PM = plugin_manager.PluginManager(plugins=(("random_test", _RandomPlugin(), "tests"),))
    yield
    plugin_manager._PM = saved


@full_only
class TestRandomProposer(SpeculatorContract):
    speculator_cls = RandomProposer
    llm_kwargs = LLM_KWARGS
    speculative_config = {"method": "random_test", "num_speculative_tokens": 3}
    num_samples = 200


def test_unknown_and_unimplemented_methods_fail_at_start():
    from octavo import LLM

    with pytest.raises(Exception, match="model 'x' is not a local directory"):  # a head checkpoint, checked first
        LLM(speculative_config={"method": "eagle", "model": "x", "num_speculative_tokens": 2},
            num_gpu_blocks_override=16, max_model_len=128)
    with pytest.raises(Exception, match="ngramm.*Did you mean 'ngram'"):
        LLM(speculative_config={"method": "ngramm", "num_speculative_tokens": 2},
            num_gpu_blocks_override=16, max_model_len=128)


def test_draft_with_another_vocabulary_fails_at_start(tmp_path):
    from octavo import LLM
    from tests.utils import smollm2_safetensors_dir

    src = smollm2_safetensors_dir("float32")
    import json
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(src, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (draft / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="vocab_size"):
        LLM(model=str(src), speculative_config={"method": "draft_model", "model": str(draft),
                                                "num_speculative_tokens": 2},
            num_gpu_blocks_override=16, max_model_len=128, load_format="dummy")


def test_metrics_and_batch_size_policy():
    from octavo import LLM, SamplingParams

    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 3},
              model=_fp32_dir(), num_threads=1, dtype="float32", max_model_len=256, num_gpu_blocks_override=64)
    prompt = "a b c d a b c d a b c d a b c"
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    m = {x.name: x for x in llm.get_metrics()}
    drafts = m["octavo:spec_decode_num_draft_tokens"].value
    assert drafts > 0 and m["octavo:spec_decode_num_accepted_tokens"].value > 0
    assert len(m["octavo:spec_decode_num_accepted_tokens_per_pos"].values) == 3
    assert 0 < m["octavo:spec_decode_acceptance_rate"].value <= 1
    # three requests running at once reach disable_by_batch_size=3: no drafts for those steps
    llm.generate([prompt] * 3, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert {x.name: x for x in llm.get_metrics()}["octavo:spec_decode_num_draft_tokens"].value == drafts
    llm.llm_engine.shutdown()
