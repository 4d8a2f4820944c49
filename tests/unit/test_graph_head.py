"""The LM head + sampler graphs' CPU-testable parts (issue 17 item 2): the TP shard argmax equals ``torch.argmax``
on the full row (ties, NaN, -inf, uneven shards; 2 gloo processes), which steps may take the head graphs
(``core/step_head.py``), and the runner's hook end to end on a CPU engine with a stand-in head (the GPU replays
are tested in tests/gpu/test_graph_head_gpu.py)."""

from __future__ import annotations

import json
import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octavo.core.step_head import head_mode
from octavo.plugins.platforms.cuda_graph_head import shard_argmax
from octavo.sampling_params import SamplingParams


def _rows(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(vocab, generator=g) for _ in range(4)]
    r = torch.randint(-3, 3, (vocab,), generator=g).float()  # many exact ties
    rows += [r, torch.zeros(vocab), torch.full((vocab,), float("-inf"))]
    t = torch.randn(vocab, generator=g)
    t[vocab // 2 - 1] = t[vocab // 2] = t[vocab - 1] = 9.0  # equal maxima on both sides of the shard boundary
    rows.append(t)
    m = torch.randn(vocab, generator=g)
    m[2] = m[vocab - 2] = float("inf")
    rows.append(m)
    for cols in ([vocab - 1], [1, vocab - 1], [vocab // 2 + 1, 3]):  # NaN: torch.argmax returns the first NaN
        x = torch.randn(vocab, generator=g)
        x[cols] = float("nan")
        rows.append(x)
    return torch.stack(rows).to(torch.bfloat16)


def _worker(rank: int, port: int, vocab: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from octavo.nn.parallel import tp_all_gather

    logits = _rows(vocab)
    shard = -(-vocab // 2)  # the vocabulary split of octavo.nn.embedding: padded to a multiple of the ranks
    lo, hi = rank * shard, min((rank + 1) * shard, vocab)
    got = shard_argmax(logits[:, lo:hi].float(), lo, lambda x: tp_all_gather(x, dim=-1))
    # the head graphs' greedy function itself on a vocabulary-parallel LM head (no graph on the CPU): rows 1 and
    # vocab-2 of the weight equal rows on the other rank, so exact ties cross the shard boundary
    from octavo.nn.embedding import ParallelLMHead
    from octavo.plugins.platforms.cuda_graph_head import GraphHead

    g = torch.Generator().manual_seed(1)
    weight = torch.randn(vocab, 8, generator=g)
    weight[vocab - 2] = weight[1]
    weight[vocab // 2 + 1] = weight[0]
    head = ParallelLMHead(vocab, 8)
    head.weight_loader(head.weight, weight)
    model = SimpleNamespace(lm_head=head, compute_logits=head.compute_logits)
    gh = GraphHead(model, torch.device("cpu"), 4)
    gh.setup()  # collective: both ranks check compute_logits == the head's logits and agree
    h = torch.randn(4, 8, generator=g)
    h[3] = 0  # every logit 0: the lowest index wins
    head_got, head_want = gh._greedy(h), head.compute_logits(h).argmax(dim=-1)
    if rank == 0:
        want = logits.float().argmax(dim=-1)
        with open(out, "w") as f:
            json.dump({"got": got.tolist(), "want": want.tolist(), "shard": gh.shard is not None,
                       "head_got": head_got.tolist(), "head_want": head_want.tolist()}, f)
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("vocab", [16, 11])  # 11: the last rank's shard is one column short (padding cut)
def test_shard_argmax_equals_torch_argmax_on_two_gloo_ranks(tmp_path, vocab):
    out = str(tmp_path / "r.json")
    mp.spawn(_worker, args=(_port(), vocab, out), nprocs=2, join=True)
    r = json.load(open(out))
    assert r["got"] == r["want"]
    assert r["shard"] and r["head_got"] == r["head_want"]


def test_shard_argmax_one_rank_is_argmax():
    x = _rows(10).float()
    assert torch.equal(shard_argmax(x, 0, lambda p: p), x.argmax(dim=-1))


def _state(out_tokens=3, **kw):
    return SimpleNamespace(sampling_params=SamplingParams(**kw), num_output_tokens=out_tokens, lora_request=None)


def test_head_mode_decisions():
    g = _state(temperature=0)
    assert head_mode([g, g], False) == "greedy"  # (SamplingParams drops a greedy row's filters)
    assert head_mode([g, _state(temperature=0.7)], True) == "random"
    assert head_mode([g, _state(temperature=0.7, seed=3)], True) == "random"  # the keys follow the seed
    assert head_mode([g, _state(temperature=0.7)], False) is None  # eager takes the torch sampler: other draws
    for kw in ({"top_k": 5}, {"top_p": 0.9}, {"min_p": 0.1}):  # random rows with filters: thresholds between graphs
        assert head_mode([_state(temperature=0.7, **kw)], True) == "filtered"
        assert head_mode([_state(temperature=0), _state(temperature=0.7, **kw)], True) == "filtered"
        assert head_mode([_state(temperature=0.7, **kw)], False) is None
    for kw in ({"logprobs": 0}, {"prompt_logprobs": 1}, {"presence_penalty": 0.5}, {"frequency_penalty": 0.1},
               {"repetition_penalty": 1.1}, {"logit_bias": {3: 1.0}}, {"allowed_token_ids": [1, 2]}):
        assert head_mode([g, _state(temperature=0, **kw)], True) is None, kw
    assert head_mode([_state(out_tokens=1, temperature=0, min_tokens=2)], True) is None  # EOS still banned
    assert head_mode([_state(out_tokens=2, temperature=0, min_tokens=2)], True) == "greedy"
    lora = _state(temperature=0)
    lora.lora_request = object()
    assert head_mode([lora], True) is None


class _StandInHead:
    """The GraphHead interface the core calls, computing eagerly on the CPU: greedy rows' argmax of the model's
    logits (what the captured greedy graph computes). Sizes 1, 2 and 4 "captured"."""

    modes = ["greedy"]
    agrees = False

    def __init__(self, model):
        self.model, self.active, self.hidden, self.replays = model, True, None, 0

    def ready(self, hidden):
        self.hidden = hidden
        return self.active and hidden.shape[0] in (1, 2, 4)

    def sample(self, mode, size, sampling=None):
        assert mode == "greedy" and size == self.hidden.shape[0]
        self.replays += 1
        return self.model.compute_logits(self.hidden).argmax(dim=-1)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    import transformers as T

    from octavo.testing.model import randomize_
    from tests.plugins.test_model_contracts import TINY

    torch.manual_seed(0)
    ref = T.AutoModelForCausalLM.from_config(T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY),
                                             dtype=torch.float32)
    randomize_(ref)
    path = tmp_path_factory.mktemp("llama")
    ref.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_runner_hook_with_a_stand_in_head(tiny_llama, async_scheduling):
    from octavo import LLM

    llm = LLM(tiny_llama, dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128, seed=0,
              skip_tokenizer_init=True, async_scheduling=async_scheduling)
    try:
        runner = llm.llm_engine.core.executor.driver.runner
        head = _StandInHead(runner.model)
        runner.graph_runner = SimpleNamespace(head=head, maybe_run=lambda inputs: None)
        prompts = [{"prompt_token_ids": [5 + i, 9, 30, 7 + 2 * i]} for i in range(4)]
        cases = {"greedy4": (prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), True),
                 "greedy3": (prompts[:3], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), False),
                 "logprobs": (prompts[:2], SamplingParams(temperature=0, max_tokens=6, logprobs=2, ignore_eos=True),
                              False),
                 "seeded": (prompts[:1], SamplingParams(temperature=0.8, seed=4, max_tokens=6, ignore_eos=True),
                            False)}  # the CPU has no fused sampler: random rows stay eager
        for name, (ps, params, uses) in cases.items():
            got = {}
            for active in (False, True):
                head.active, before = active, head.replays
                outs = llm.generate(ps, params, use_tqdm=False)
                got[active] = ([list(o.outputs[0].token_ids) for o in outs],
                               [repr(o.outputs[0].logprobs) for o in outs], head.replays - before)
            assert got[True][:2] == got[False][:2], name
            assert got[False][2] == 0
            assert (got[True][2] > 0) == uses, (name, got[True][2])
    finally:
        llm.llm_engine.shutdown()


_KEYS = """
import torch
from types import SimpleNamespace
from octavo.plugins.platforms.cuda_graph_head import GraphHead, KEY_BASE
from octavo.plugins.platforms.cuda_sampler import fused_sample, sample_rows

g = torch.Generator().manual_seed(0)
logits = torch.randn(3, 5000, generator=g)
temp = torch.tensor([0.8, 0.0, 1.3])
thr = torch.tensor([0.5, float("-inf"), -1.0])
head = GraphHead(SimpleNamespace(compute_logits=None), torch.device("cpu"), 4)
for seeded_rows in ({}, {2: 7}, {0: 3, 2: 7}):
    for t in (None, thr):
        torch.manual_seed(11)
        gens = {r: torch.Generator().manual_seed(s) for r, s in seeded_rows.items()}
        want = [sample_rows(logits, temp, gens, t) for _ in range(3)]  # three steps: the draw counts advance
        torch.manual_seed(11)
        gens = {r: torch.Generator().manual_seed(s) for r, s in seeded_rows.items()}
        got = []
        for _ in range(3):
            head.set_keys(3, SimpleNamespace(generators=gens, temperature=temp))
            thr_arg = None if t is None else head.thresholds[:3].copy_(t)
            got.append(fused_sample(logits, head.temperature[:3], head.keys[:3], KEY_BASE, thr_arg))
        assert all(torch.equal(a, b) for a, b in zip(want, got)), (seeded_rows, want, got)
print("ok")
"""


def test_random_graph_keys_give_the_eager_fused_samplers_tokens():
    """The head's host-side keys (``GraphHead.set_keys``) + the fused kernel reading them == ``sample_rows`` (the
    eager fused sampler: in-kernel unseeded keys, seeded keys from each generator), step after step, with and
    without thresholds; the Triton kernels run through Triton's interpreter on the CPU."""
    from tests.utils import run_triton_interpreted

    run_triton_interpreted(_KEYS)


_ENGINE = """
import sys, torch
from octavo import LLM, SamplingParams as S
from tests.distributed.graph_head_eager import install  # stand-in body graphs, a GraphHead replaying eagerly

llm = LLM(sys.argv[1], dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=128, seed=0,
          skip_tokenizer_init=True, async_scheduling=sys.argv[2] == "1")
runner = llm.llm_engine.core.executor.driver.runner
head = install(runner, torch.device("cpu"), (1, 2, 4))  # the fused sampler too, as on CUDA
prompts = [{"prompt_token_ids": [5 + i, 9, 30, 7 + 2 * i]} for i in range(4)]
cases = {
    "greedy4": (prompts, S(temperature=0, max_tokens=8, ignore_eos=True), None, "greedy"),
    "seeded2": (prompts[:2], [S(temperature=0.8, seed=3 + i, max_tokens=8, ignore_eos=True) for i in range(2)],
                None, "random"),
    "unseeded1": (prompts[:1], S(temperature=1.0, max_tokens=8, ignore_eos=True), 7, "random"),
    "mixed4": (prompts, [S(temperature=0), S(temperature=0.9, seed=1), S(temperature=0.7, top_k=20, seed=2),
                         S(temperature=0.6, min_p=0.05, seed=4)], None, "filtered"),
    "topk_topp1": (prompts[:1], S(temperature=0.9, top_k=30, top_p=0.8, max_tokens=8, seed=5, ignore_eos=True),
                   None, "filtered"),
    "topp_only1": (prompts[:1], S(temperature=0.9, top_p=0.8, max_tokens=8, seed=5, ignore_eos=True), None, None),
    "greedy3": (prompts[:3], S(temperature=0, max_tokens=8, ignore_eos=True), None, None),
    "logprobs2": (prompts[:2], S(temperature=0, max_tokens=8, logprobs=2, ignore_eos=True), None, None),
}
for name, (ps, params, seed, mode) in cases.items():
    if isinstance(params, list):  # the mixed batch's rows: same length and stop rule as the others
        for p in params:
            p.max_tokens, p.ignore_eos = 8, True
    got = {}
    for active in (False, True):
        head.active, before = active, dict(head.num_replays)
        if seed is not None:
            torch.manual_seed(seed)
        outs = llm.generate(ps, params, use_tqdm=False)
        used = {k: v - before[k] for k, v in head.num_replays.items() if v != before[k]}
        got[active] = ([list(o.outputs[0].token_ids) for o in outs], [repr(o.outputs[0].logprobs) for o in outs],
                       used)
    assert got[True][:2] == got[False][:2], (name, got)
    assert got[False][2] == {}, (name, got[False][2])
    assert (set(got[True][2]) == {mode}) if mode else got[True][2] == {}, (name, got[True][2])
llm.llm_engine.shutdown()
print("ok")
"""


@pytest.mark.parametrize("async_scheduling", ["1", "0"])
def test_graph_head_modes_on_a_cpu_engine(tiny_llama, async_scheduling):
    """The real GraphHead (captures replaced by eager replays into the captured outputs) behind a CPU engine with the
    fused sampler (Triton's interpreter): greedy, seeded / unseeded random and top-k / min-p / top-p rows give the
    eager path's tokens and logprobs, each step taking the mode the decisions name, and the fallbacks (top-p
    alone, a padded batch, logprobs) never replaying a head graph."""
    import subprocess
    import sys

    from tests.utils import REPO

    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", _ENGINE, tiny_llama, async_scheduling], env=env, capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-4000:]
