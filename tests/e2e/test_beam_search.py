"""``LLM.beam_search`` against transformers' ``generate(num_beams=K)`` on the same weights (issue 16).

A tiny random-weight Llama whose EOS ids ([50, 255]) are tokens its beams really produce, so beams end early
and the length penalty decides the ranking: every returned beam (tokens, order) equals transformers' and
each score is within 1e-4 of its ``sequences_scores``. Also: ``ignore_eos`` (beams run to max_tokens),
batching several prompts with ``concurrency_limit``, the text of a beam, and the refusals.
"""

from __future__ import annotations

import pytest
import torch

from octavo import LLM
from octavo.beam_search import BeamSearchOutput, BeamSearchParams
from tests.utils import tiny_llama

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
            eos_token_id=[50, 255])
PROMPTS = [[5, 17, 33, 9, 100, 7], [1, 44, 90, 12, 3, 250, 61, 61, 8, 200]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("beam") / "tiny"
    model = tiny_llama(path, TINY)
    return model.eval(), LLM(str(path), skip_tokenizer_init=True, dtype="float32", block_size=4)


def _hf(model, prompt, k, max_new, lp, eos):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), num_beams=k, num_return_sequences=k, max_new_tokens=max_new,
                             do_sample=False, length_penalty=lp, early_stopping=False, eos_token_id=eos,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    seqs = []
    for s in out.sequences.tolist():
        gen = s[len(prompt):]
        for j, t in enumerate(gen):  # transformers pads a beam that ended early with pad (0) after its EOS
            if eos and t in eos:
                gen = gen[:j + 1]
                break
        seqs.append(gen)
    return seqs, out.sequences_scores.tolist()


@pytest.mark.parametrize("k,max_new,lp", [(4, 10, 1.0), (3, 10, 0.5), (3, 10, 2.0)])
def test_equals_transformers(tiny, k, max_new, lp):
    model, llm = tiny
    outs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS],
                           BeamSearchParams(beam_width=k, max_tokens=max_new, length_penalty=lp))
    ended_early = 0
    for prompt, out in zip(PROMPTS, outs):
        ref, ref_scores = _hf(model, prompt, k, max_new, lp, [50, 255])
        assert isinstance(out, BeamSearchOutput) and len(out.sequences) == k
        assert [s.tokens[len(prompt):] for s in out.sequences] == ref
        assert [s.score for s in out.sequences] == pytest.approx(ref_scores, abs=1e-4)
        for s in out.sequences:
            gen = s.tokens[len(prompt):]
            assert s.tokens[:len(prompt)] == prompt and len(s.logprobs) == len(gen)
            assert s.cum_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(s.logprobs, gen)), abs=1e-5)
            assert s.score == pytest.approx(s.cum_logprob / len(gen) ** lp, abs=1e-6)
            assert s.finish_reason == ("stop" if gen[-1] in (50, 255) else "length")
            ended_early += len(gen) < max_new
    assert ended_early  # the EOS path (and so the length penalty) really decided something


def test_ignore_eos_and_concurrency_limit(tiny):
    model, llm = tiny
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params, concurrency_limit=1)
    for prompt, out in zip(PROMPTS, outs):
        ref, ref_scores = _hf(model, prompt, 3, 6, 1.0, None)
        assert [s.tokens[len(prompt):] for s in out.sequences] == ref
        assert all(len(s.tokens) == len(prompt) + 6 and s.finish_reason == "length" for s in out.sequences)


def test_refusals(tiny):
    _, llm = tiny
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.beam_search([{"prompt_token_ids": [1, 2, 3]}], BeamSearchParams(beam_width=2, max_tokens=10_000))
    with pytest.raises(TypeError, match="BeamSearchParams"):
        from octavo import SamplingParams

        llm.beam_search([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(n=2))


def test_vllm_import_paths():
    from octavo.beam_search import BeamSearchSequence  # noqa: F401  (vllm.beam_search)
    from octavo.sampling_params import BeamSearchParams as B  # vllm.sampling_params.BeamSearchParams

    assert B is BeamSearchParams
