"""Speculative decoding on a CUDA GPU (skipped without one; run by benchmarks/device/spec.sh): verify steps are
captured as CUDA graphs and replayed, and greedy output with speculation + graphs equals decoding without
speculation, eagerly, token for token (fp32 tiny Llamas: logit gaps far above fp32 rounding, so the
comparison is exact whatever the kernels' summation order). ngram runs on a random target (few drafts
accepted); the oracle MLP speculator on the shift target (every draft accepted, through replayed graphs)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.spec_decode.head_checkpoints import TINY, make_target, write_mlp_speculator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ENGINE = dict(dtype="float32", skip_tokenizer_init=True, max_model_len=256, block_size=16, seed=0,
              kv_cache_memory_bytes=1 << 28)


def _prompts(n: int) -> list[dict]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        span = [rng.randrange(3, TINY["vocab_size"]) for _ in range(12)]
        out.append({"prompt_token_ids": span + [rng.randrange(3, TINY["vocab_size"]) for _ in range(5)] + span[:4]})
    return out


def _graph_runner(llm):
    return llm.llm_engine.core.executor.driver.runner.graph_runner


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3},
                                  {"method": "mlp_speculator", "num_speculative_tokens": 3}])
def test_verify_steps_replay_graphs_and_match_eager(tmp_path, spec):
    from octavo import LLM, SamplingParams

    oracle = spec["method"] == "mlp_speculator"
    target = make_target(str(tmp_path / "t"), "shift" if oracle else "random")
    if oracle:
        write_mlp_speculator(str(tmp_path / "h"), n_predict=3, target=target)  # drafts the target's own chain
        spec = {**spec, "model": str(tmp_path / "h")}
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = _prompts(4)
    base = LLM(str(tmp_path / "t"), enforce_eager=True, **ENGINE)
    want_batched = [o.outputs[0].token_ids for o in base.generate(prompts, params, use_tqdm=False)]
    want = [[t] for t in want_batched]
    base.llm_engine.shutdown()
    llm = LLM(str(tmp_path / "t"), speculative_config=spec, **ENGINE)
    runner = _graph_runner(llm)
    assert runner is not None and runner.verify_graphs, "no verify graphs were captured"
    got = [[llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids] for p in prompts]  # batch 1
    got_batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want and got_batched == want_batched
    stats = llm.llm_engine.get_stats()
    if oracle:
        assert 0 < stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens
    assert runner.num_verify_replays > 0
    print(f"{spec['method']}: verify replays {runner.num_verify_replays}, decode replays {runner.num_replays}, "
          f"accepted {stats.spec_decode_num_accepted_tokens}/{stats.spec_decode_num_draft_tokens}")
    llm.llm_engine.shutdown()
