"""Admission pacing (``kv_admission_pacing``, core/kv_pacing.py) through the engine: a queue of known-length
requests that outgrows the KV cache. A fixed rate must engage (the gate really holds starts back), start no request
that is then preempted, and produce exactly the tokens of ``off`` (the waves): pacing only changes *when* a request
starts, and a request's greedy tokens do not depend on its batch (the CPU kernels are batch-invariant). Which rate
``auto`` picks is the model's business (tests/unit/test_kv_pacing.py): on shapes this small it often picks none."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from octavo.core import kv_pacing
from tests.utils import tiny_llama

CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=512)
PROMPTS = [[(7 * i + j) % 250 + 1 for j in range(120)] for i in range(16)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("pacing")
    tiny_llama(path, CFG)
    return str(path)


def _run(path: str, mode: str):
    # 64 blocks of 16 = 1,024 tokens: ~4 of the 16 requests (120 + 96 tokens each) fit at once. A step's token
    # budget holds two prompts, so a rate's credit starts small (as 8B's 1000-token prompts in 8192 do)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", block_size=16, num_gpu_blocks_override=64,
              max_num_seqs=64, max_num_batched_tokens=256, kv_admission_pacing=mode)
    params = SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    sched = llm.llm_engine.core.scheduler
    adm = sched.admission
    result = ([list(o.outputs[0].token_ids) for o in outs], adm.num_steps, sched.stats.num_preemptions,
              list(adm.pacer.episodes) if adm.pacer is not None else [])
    del llm
    return result


def test_paced_starts_keep_every_token(checkpoint, monkeypatch):
    tokens_off, steps_off, preempted_off, episodes_off = _run(checkpoint, "off")
    held = []  # the gate's refusals: the rate really held starts back (the engine runs in this process)
    gate = kv_pacing.Pacer.gate

    def counting_gate(self, adm, req):
        ok = gate(self, adm, req)
        if not ok:
            held.append(req.request_id)
        return ok

    monkeypatch.setattr(kv_pacing.Pacer, "gate", counting_gate)
    tokens_auto, steps_auto, preempted_auto, episodes_auto = _run(checkpoint, "1.2")
    assert all(len(t) == 96 for t in tokens_auto)
    assert tokens_auto == tokens_off
    assert episodes_off == [] and episodes_auto and all(rate == 1.2 for rate in episodes_auto), episodes_auto
    assert preempted_auto == 0, preempted_auto
    assert held, "the paced run never held a start back"
    print(f"steps: waves {steps_off}, paced {steps_auto}; preemptions {preempted_off} / {preempted_auto}; "
          f"rates {episodes_auto}; starts held back {len(held)} times")
