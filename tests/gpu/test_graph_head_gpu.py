"""The LM head + sampler graphs (plugins/platforms/cuda_graph_head.py): the same tokens and logprobs with the head
graphs on as with the eager head after the body graph, at TP=1 and TP=2 (the shard argmax), for greedy, seeded and
unseeded temperature sampling, top-k / top-p / min-p (thresholds between two graphs), and the steps that fall back
(logprobs, top-p without top-k: the torch sampler; a batch of 3 rows: a padded graph). Each engine runs
in a subprocess and switches its head graphs between the two runs of a workload (``graph_head_state``); the head
replay counters show which runs took the graphs, so the comparison cannot pass by never using them."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("CUDA graphs need a CUDA GPU", allow_module_level=True)

_ENGINE = """
import faulthandler, json, sys, torch
faulthandler.dump_traceback_later(90, repeat=True)  # a hang (a collective one rank skipped) shows where it waits
from octavo import LLM, SamplingParams
RPC = "octavo.plugins.platforms.cuda_graph_head:graph_head_state"
tp = int(sys.argv[2])
llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8, seed=0,
          dtype=sys.argv[3], tensor_parallel_size=tp)
prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 1000 + 1 for j in range(5 + 9 * i)]} for i in range(4)]
S = SamplingParams
work = {
    "greedy_bs1": (prompts[:1], S(max_tokens=24, temperature=0, ignore_eos=True), None, True),
    "greedy_bs4": (prompts, S(max_tokens=16, temperature=0, ignore_eos=True), None, True),
    "greedy_bs3_padded": (prompts[:3], S(max_tokens=16, temperature=0, ignore_eos=True), None, False),
    "seeded_t08_bs2": (prompts[:2], [S(max_tokens=24, temperature=0.8, seed=11 + i, ignore_eos=True) for i in range(2)],
                       None, True),
    "unseeded_t1_bs1": (prompts[:1], S(max_tokens=24, temperature=1.0, ignore_eos=True), 5, True),
    "greedy_logprobs": (prompts[:2], S(max_tokens=12, temperature=0, logprobs=3, ignore_eos=True), None, False),
    "topk_t08": (prompts[:1], S(max_tokens=12, temperature=0.8, top_k=20, seed=3, ignore_eos=True), None, True),
    "topk_topp_minp_bs2": (prompts[:2], [S(max_tokens=12, temperature=0.9, top_k=50, top_p=0.8, seed=5, ignore_eos=True),
                                         S(max_tokens=12, temperature=0.7, min_p=0.05, seed=6, ignore_eos=True)],
                           None, True),
    "topp_only_unseeded": (prompts[:1], S(max_tokens=12, temperature=0.8, top_p=0.9, ignore_eos=True), 9, False),
}
res = {"state": llm.collective_rpc(RPC), "head_gemv": all(
    r.get("enabled") for r in llm.collective_rpc("octavo.plugins.platforms.cuda_head_gemv:set_head_gemv", args=[True]))}
for name, (ps, params, seed, uses_head) in work.items():
    if seed is not None and tp > 1:
        continue  # unseeded keys come from each worker's own generator
    runs = {}
    for on in (False, True):
        before = llm.collective_rpc(RPC, args=[on])
        if seed is not None:
            torch.manual_seed(seed)
        outs = llm.generate(ps, params, use_tqdm=False)
        after = llm.collective_rpc(RPC)
        replays = [sum(a["replays"].values()) - sum(b["replays"].values()) for a, b in zip(after, before)]
        runs[on] = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                    "logprobs": [repr(o.outputs[0].logprobs) for o in outs], "replays": replays}
    res[name] = {"runs": {str(k): v for k, v in runs.items()}, "uses_head": uses_head}
print("RESULT", json.dumps(res), flush=True)
llm.llm_engine.shutdown()
"""


def _two_gpus() -> bool:
    return torch.cuda.device_count() >= 2


def _run(path: str, tp: int, dtype: str) -> dict:
    # bf16 at TP=1: the head's GEMV too; the one-graph batch-1 step off (it would take the batch-1 greedy steps first)
    env = {**os.environ, "OCTAVO_GRAPH_HEAD": "1", "OCTAVO_HEAD_GEMV": "1", "OCTAVO_GRAPH_STEP": "0"}
    # the engine's (and its workers') stderr streams into a file next to the checkpoint, so a run cut by an outer
    # time cap still leaves its log (head9.sh keeps pytest's base temp under $OUT)
    log = os.path.join(os.path.dirname(path), f"engine_tp{tp}_{dtype}.log")
    with open(log, "w") as err:
        p = subprocess.run([sys.executable, "-c", _ENGINE, path, str(tp), dtype], env=env, stdout=subprocess.PIPE,
                           stderr=err, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, open(log).read()[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _check(res: dict, tp: int, dtype: str) -> None:
    assert all(s["captured"] and s["sizes"] == [1, 2, 4, 8] for s in res["state"]), res["state"]
    if tp == 1 and dtype == "bfloat16":  # one-row heads through the GEMV (cuda_head_gemv.py), eager and captured
        assert res["head_gemv"], res
    if tp > 1:
        assert all(s["shard_argmax"] for s in res["state"]), res["state"]  # greedy reduces vocabulary shards
    checked = 0
    for name, r in res.items():
        if name in ("state", "head_gemv"):
            continue
        off, on = r["runs"]["False"], r["runs"]["True"]
        assert on["tokens"] == off["tokens"], name
        assert on["logprobs"] == off["logprobs"], name
        assert all(x == 0 for x in off["replays"]), (name, off["replays"])  # switched off: never replayed
        if r["uses_head"]:
            assert all(x > 0 for x in on["replays"]), (name, on["replays"])
        else:  # a padded batch, logprobs, top-p alone: the eager head ran (the fallback decisions)
            assert all(x == 0 for x in on["replays"]), (name, on["replays"])
        checked += 1
    assert checked >= (9 if tp == 1 else 7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_head_graph_tokens_equal_eager_head(tmp_path, dtype):
    from tests.gpu.parity import build_checkpoint

    path = build_checkpoint(str(tmp_path), "LlamaForCausalLM")
    _check(_run(path, 1, dtype), 1, dtype)


@pytest.mark.skipif("not _two_gpus()", reason="needs 2 CUDA GPUs")
def test_tp2_shard_argmax_head_graph_tokens_equal(tmp_path):
    from tests.gpu.parity import build_checkpoint

    path = build_checkpoint(str(tmp_path), "LlamaForCausalLM")
    _check(_run(path, 2, "bfloat16"), 2, "bfloat16")
