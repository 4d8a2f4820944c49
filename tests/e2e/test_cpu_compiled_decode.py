"""The compiled CPU decode step (``OCTAVO_CPU_COMPILE=1``, plugins/platforms/cpu_compiled.py) against the eager engine.

A tiny random-weight Llama in float32 (compiling SmolLM2 takes minutes; the graph is the same code per layer):
greedy tokens identical and chosen-token logprobs within 1e-4 of the eager engine, for one request alone (the
batch-1 graph, with a context that grows past a block-rounding boundary: the dynamic context dimension) and
for three requests of different lengths in one batch (eager under the attention wrapper: batches > 1 are not
compiled by default). The runner must really
have run the decode steps (its counter), and the settings it cannot honour are refused at start.

Compiling takes ~1 minute on a quiet 2-core machine (5 on a loaded one), so ``make test`` runs the refusals
only; ``make cpu-compile`` (``OCTAVO_CPU_COMPILE_TESTS=full``) runs the comparison.
"""

from __future__ import annotations

import os

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.errors import ConfigError

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
PROMPTS = [list(range(3, 8)), [(7 * i) % 250 + 3 for i in range(37)], [(11 * i) % 250 + 3 for i in range(120)]]
FULL = os.environ.get("OCTAVO_CPU_COMPILE_TESTS") == "full"
needs_full = pytest.mark.skipif(not FULL, reason="compiles (minutes); run with `make cpu-compile`")
NEW = 24  # 120 + 24 crosses 128 tokens: the gathered context grows from 8 to 16 blocks


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import transformers as T

    from octavo.testing.model import randomize_

    path = str(tmp_path_factory.mktemp("tiny_llama"))
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY)).float()
    randomize_(model)
    model.save_pretrained(path)
    return path


def _llm(path: str, compiled: str | None, **kw) -> LLM:
    old = os.environ.pop("OCTAVO_CPU_COMPILE", None)
    if compiled is not None:
        os.environ["OCTAVO_CPU_COMPILE"] = compiled
    try:
        return LLM(path, dtype="float32", skip_tokenizer_init=True, enable_prefix_caching=False, max_num_seqs=4,
                   num_threads=1, **kw)
    finally:
        os.environ.pop("OCTAVO_CPU_COMPILE", None)
        if old is not None:
            os.environ["OCTAVO_CPU_COMPILE"] = old


def _greedy(llm: LLM, prompts) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    res = []
    for o in outs:
        c = o.outputs[0]
        res.append((list(c.token_ids), [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]))
    return res


def _runner(llm: LLM):
    return llm.llm_engine.core.executor.driver.runner.graph_runner


@pytest.fixture(scope="module")
def engines(checkpoint):
    eager = _llm(checkpoint, None)
    compiled = _llm(checkpoint, "1")
    return eager, compiled


@needs_full
def test_compiled_decode_matches_eager(engines):
    eager, compiled = engines
    assert _runner(eager) is None
    runner = _runner(compiled)
    assert runner is not None and set(runner.compile_seconds) == {"batch1"}  # compiled at start
    for prompts in ([PROMPTS[2]], PROMPTS):  # batch 1 alone, then a batch of three different lengths
        before = runner.num_runs
        want, got = _greedy(eager, prompts), _greedy(compiled, prompts)
        # batch 1: every decode step ran compiled (the first token comes from the prefill); batch 3: none
        # (MAX_COMPILED_BATCH = 1), the eager backend under the wrapper
        assert runner.num_runs - before == (NEW - 1 if len(prompts) == 1 else 0)
        for (wt, wl), (gt, gl) in zip(want, got):
            assert gt == wt
            assert max(abs(a - b) for a, b in zip(wl, gl)) < 1e-4


@needs_full
def test_prefill_and_mixed_steps_stay_eager(engines):
    """A step with a prefill chunk is not decode-only: the runner declines it and the eager path runs."""
    _, compiled = engines
    runner = _runner(compiled)
    before = runner.num_runs
    compiled.generate([{"prompt_token_ids": PROMPTS[1]}], SamplingParams(temperature=0, max_tokens=1),
                      use_tqdm=False)
    assert runner.num_runs == before


@pytest.mark.parametrize("value, kw, match", [("yes", {}, "use 1"), ("1", {"enforce_eager": True}, "enforce_eager")])
def test_refused_settings(checkpoint, value, kw, match):
    with pytest.raises(ConfigError, match=match):
        _llm(checkpoint, value, **kw)
