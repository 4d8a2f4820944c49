"""The LM head graphs' TP=2 path on the CPU (issue 12; the GPU test is tests/gpu/test_graph_head_gpu.py's TP=2 case):
a TP=2 ``mp`` engine (gloo) whose workers each hold the real ``GraphHead`` behind stand-in body graphs
(tests/distributed/graph_head_eager.py: replays run eagerly). With the head "graphs" on, greedy steps reduce the
vocabulary shards (``shard_argmax``: no full logits, no broadcast of the ids under async scheduling, since every
rank holds the same ids), random and top-k / min-p steps sample the gathered logits, and the tokens and logprobs
equal the same engine's with them off; every rank takes the same mode each step (a rank that skipped a collective
would hang, not pass), and the fallbacks (top-p alone, a padded batch, logprobs) never replay."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.distributed.test_tensor_parallel import full_only

_ENGINE = """
import sys
from octavo import LLM, SamplingParams as S
RPC = "octavo.plugins.platforms.cuda_graph_head:graph_head_state"
llm = LLM(sys.argv[1], dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128, seed=0,
          skip_tokenizer_init=True, tensor_parallel_size=2, async_scheduling=sys.argv[2] == "1")
state = llm.collective_rpc("tests.distributed.graph_head_eager:install_in_worker", args=[[1, 2, 4]])
assert len(state) == 2 and all(s["shard_argmax"] and s["agrees"] for s in state), state
prompts = [{"prompt_token_ids": [5 + i, 9, 30, 7 + 2 * i]} for i in range(4)]
cases = {  # unseeded rows are left out: their keys come from each worker's own generator (GPU test: the same)
    "greedy4": (prompts, S(temperature=0, max_tokens=8, ignore_eos=True), "greedy"),
    "greedy1": (prompts[:1], S(temperature=0, max_tokens=8, ignore_eos=True), "greedy"),
    "seeded2": (prompts[:2], [S(temperature=0.8, seed=3 + i, max_tokens=8, ignore_eos=True) for i in range(2)],
                "random"),
    "mixed4": (prompts, [S(temperature=0), S(temperature=0.9, seed=1), S(temperature=0.7, top_k=20, seed=2),
                         S(temperature=0.6, min_p=0.05, seed=4)], "filtered"),
    "topp_only1": (prompts[:1], S(temperature=0.9, top_p=0.8, max_tokens=8, seed=5, ignore_eos=True), None),
    "greedy3": (prompts[:3], S(temperature=0, max_tokens=8, ignore_eos=True), None),
    "logprobs2": (prompts[:2], S(temperature=0, max_tokens=8, logprobs=2, ignore_eos=True), None),
}
for name, (ps, params, mode) in cases.items():
    if isinstance(params, list):
        for p in params:
            p.max_tokens, p.ignore_eos = 8, True
    got = {}
    for active in (False, True):
        before = llm.collective_rpc(RPC, args=[active])
        outs = llm.generate(ps, params, use_tqdm=False)
        after = llm.collective_rpc(RPC)
        used = [{k: v - b["replays"][k] for k, v in a["replays"].items() if v != b["replays"][k]}
                for a, b in zip(after, before)]
        got[active] = ([list(o.outputs[0].token_ids) for o in outs], [repr(o.outputs[0].logprobs) for o in outs],
                       used)
    assert got[True][:2] == got[False][:2], (name, got)
    assert all(u == {} for u in got[False][2]), (name, got[False][2])
    assert got[True][2][0] == got[True][2][1], (name, got[True][2])  # both ranks replayed the same graphs
    assert (set(got[True][2][0]) == {mode}) if mode else got[True][2][0] == {}, (name, got[True][2])
    print(name, got[True][2][0], flush=True)
llm.llm_engine.shutdown()
print("ok")
"""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.distributed.test_tensor_parallel import make_checkpoint

    return make_checkpoint("llama", tmp_path_factory)


@pytest.mark.parametrize("async_scheduling", ["1", pytest.param("0", marks=full_only)])  # async: the GPU default
def test_tp2_head_graphs_equal_eager_head_on_cpu(llama, async_scheduling):
    from tests.utils import REPO

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _ENGINE, llama, async_scheduling], env=env, capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-4000:]
