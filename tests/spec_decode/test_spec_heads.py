"""Head speculators (``medusa``, ``mlp_speculator``) through the engine, on tiny random-weight Llama targets with
head checkpoints written in the published layouts (tests/spec_decode/head_checkpoints.py):

- loading: vLLM's and FasterDecoding's Medusa layouts, MLP speculator tied/untied/scale_input; a checkpoint
  that does not fit (missing tensor, wrong hidden size, k > heads, vocabulary) fails at start naming it;
- the shift target (next token = perm[token]) with oracle heads: every draft is accepted (the hidden-state
  row, the last token and the drafts' order are wired right, not a stub), also after a preemption (checked);
- a random target with bigram-oracle heads (some drafts accepted, some not) and with random heads: greedy
  output equal to decoding without speculation token for token, batched, with chunked prefill, prefix
  caching and preemption forced (checked: ``SpecPreemptionProbe``, a preempted request verified drafts again
  after it resumed); the sampled distribution unchanged (two-sample chi-square).
The real SmolLM2 runs the SpeculatorContract with random heads in test_spec_heads_smollm2.py.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.testing.speculator import SpecPreemptionProbe, chi_square_homogeneity
from tests.spec_decode.head_checkpoints import (
    TINY,
    make_target,
    write_eagle,
    write_medusa,
    write_mlp_speculator,
)

ENGINE = dict(dtype="float32", skip_tokenizer_init=True, max_model_len=256, block_size=16, seed=0, num_threads=1)
STRESS = dict(max_num_batched_tokens=48, enable_prefix_caching=True, num_gpu_blocks_override=14,
              kv_admission="greedy")  # greedy admission: the small cache forces preemption


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    out = {}
    for kind in ("random", "shift"):
        target = make_target(str(root / kind), kind)
        out[kind] = str(root / kind)
        write_medusa(str(root / f"medusa_{kind}"), num_heads=3, target=target)
        write_mlp_speculator(str(root / f"mlp_{kind}"), n_predict=3, target=target)
    write_eagle(str(root / "eagle_shift"), 1, target=target)  # the last target built: shift
    write_eagle(str(root / "eagle3_shift"), 3, target=target)
    write_eagle(str(root / "eagle_rand"), 1, seed=6)
    write_eagle(str(root / "eagle3_rand"), 3, seed=7, draft_vocab=TINY["vocab_size"] // 2)
    write_medusa(str(root / "medusa_rand"), num_heads=3, num_layers=2)
    write_medusa(str(root / "medusa_orig"), num_heads=2, layout="faster_decoding", seed=3)
    write_mlp_speculator(str(root / "mlp_rand"), n_predict=3, seed=4, scale_input=True)
    write_mlp_speculator(str(root / "mlp_tied"), n_predict=3, tie_weights=True, seed=5)
    out["root"] = root
    return out


def _prompts(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, TINY["vocab_size"]) for _ in range(20)]  # a common prefix: prefix-cache hits
    return [{"prompt_token_ids": (shared if i % 2 else []) + [rng.randrange(3, TINY["vocab_size"])
                                                         for _ in range(rng.randrange(4, 40))]} for i in range(n)]


def _spec(method: str, path: str, k: int = 3) -> dict:
    return {"method": method, "model": path, "num_speculative_tokens": k, "disable_by_batch_size": 0}


def _counts(llm) -> tuple[int, int]:
    s = llm.llm_engine.get_stats()
    return s.spec_decode_num_draft_tokens, s.spec_decode_num_accepted_tokens


@pytest.mark.parametrize("method,head,k", [("medusa", "medusa_shift", 3), ("mlp_speculator", "mlp_shift", 3),
                                          ("eagle", "eagle_shift", 3), ("eagle3", "eagle3_shift", 1)])
def test_oracle_head_on_shift_target_is_always_accepted(ckpts, method, head, k):
    llm = LLM(ckpts["shift"], speculative_config=_spec(method, str(ckpts["root"] / head), k), **ENGINE, **STRESS)
    prompts = _prompts(6)  # 6 x 32 tokens: STRESS's cache preempts (4 x 20 did not)
    with SpecPreemptionProbe(llm) as probe:  # resumed requests' drafts are accepted too
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), use_tqdm=False)
    probe.check()
    perm = torch.randperm(TINY["vocab_size"], generator=torch.Generator().manual_seed(1)).tolist()
    for p, o in zip(prompts, outs):
        chain, t = [], p["prompt_token_ids"][-1]
        for _ in range(32):
            t = perm[t]
            chain.append(t)
        assert o.outputs[0].token_ids == chain
    proposed, accepted = _counts(llm)
    assert proposed > 0 and accepted == proposed, (proposed, accepted)
    llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def random_engines(ckpts):
    base = LLM(ckpts["random"], **ENGINE, **STRESS)
    yield base
    base.llm_engine.shutdown()


FULL = os.environ.get("OCTAVO_SPEC_DECODE") == "full"  # `make spec-decode`: every layout through the engine
CASES = [("medusa_random", "medusa", True), ("mlp_random", "mlp_speculator", True), ("medusa_orig", "medusa", False),
         ("mlp_tied", "mlp_speculator", False), ("eagle_rand", "eagle", False), ("eagle3_rand", "eagle3", False)] + ([("medusa_rand", "medusa", False), ("mlp_rand", "mlp_speculator", False)]
                                                   if FULL else [])


@pytest.mark.parametrize("head,method,partial", CASES)
def test_greedy_equals_non_speculative_under_stress(ckpts, random_engines, head, method, partial):
    k = 2 if head == "medusa_orig" else 3
    spec = LLM(ckpts["random"], speculative_config=_spec(method, str(ckpts["root"] / head), k), **ENGINE, **STRESS)
    prompts = _prompts(10, seed=1)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    want = random_engines.generate(prompts, params, use_tqdm=False)
    with SpecPreemptionProbe(spec) as probe:
        got = spec.generate(prompts, params, use_tqdm=False)
    for w, g in zip(want, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
    probe.check()  # preempted, and verified with drafts again after resuming
    assert probe.stats_after.prefix_cache_hits > probe.stats_before.prefix_cache_hits
    proposed, accepted = _counts(spec)
    assert proposed > 0
    if partial:  # bigram-oracle heads: some drafts right, some wrong (both verification paths run)
        assert 0 < accepted < proposed, (proposed, accepted)
    spec.llm_engine.shutdown()


def test_sampled_distribution_unchanged(ckpts, random_engines):
    """Two-sample chi-square over the 2nd and 3rd tokens: temperature, top-k and a penalty, seeded. NOTE: no
    preemption here (one prompt whose blocks every request shares, 3 tokens each: measured 0-1 preemptions and
    no resumed request with drafts even at prompt lengths 45-50); the greedy tests above check that one."""
    spec = LLM(ckpts["random"], speculative_config=_spec("mlp_speculator", str(ckpts["root"] / "mlp_random")),
               **ENGINE, **STRESS)
    prompt = _prompts(1, seed=7)[0]
    n = 3000 if FULL else 1000
    counts = []
    for llm in (random_engines, spec):
        params = [SamplingParams(temperature=0.9, top_k=40, presence_penalty=0.2, max_tokens=3, seed=i,
                                 ignore_eos=True) for i in range(n)]
        outs = llm.generate([prompt] * n, params, use_tqdm=False)
        counts.append([{}, {}])
        for o in outs:
            for j in (1, 2):
                t = o.outputs[0].token_ids[j]
                counts[-1][j - 1][t] = counts[-1][j - 1].get(t, 0) + 1
    proposed, accepted = _counts(spec)
    assert accepted > 0
    for j in (0, 1):
        p = chi_square_homogeneity(counts[0][j], counts[1][j])
        assert p > 1e-3, (j, p)
    spec.llm_engine.shutdown()


def test_head_checkpoints_that_do_not_fit_fail_at_start(ckpts, tmp_path):
    root = ckpts["root"]
    with pytest.raises(Exception, match="num_speculative_tokens=4.*(3 heads|at most 3)"):
        LLM(ckpts["random"], speculative_config=_spec("medusa", str(root / "medusa_rand"), 4), **ENGINE)
    with pytest.raises(Exception, match="n_predict=3"):
        LLM(ckpts["random"], speculative_config=_spec("mlp_speculator", str(root / "mlp_rand"), 5), **ENGINE)
    write_mlp_speculator(str(tmp_path / "wide"), n_predict=2, emb_dim=64)
    with pytest.raises(Exception, match="emb_dim=64"):
        LLM(ckpts["random"], speculative_config=_spec("mlp_speculator", str(tmp_path / "wide"), 2), **ENGINE)
    write_mlp_speculator(str(tmp_path / "vocab"), n_predict=2, vocab_size=50)
    with pytest.raises(Exception, match="vocab_size=50"):
        LLM(ckpts["random"], speculative_config=_spec("mlp_speculator", str(tmp_path / "vocab"), 2), **ENGINE)
    for method, head, kind in (("medusa", "medusa_rand", "Medusa heads"), ("mlp_speculator", "mlp_rand",
                               "MLP speculators"), ("eagle", "eagle_rand", "EAGLE heads")):
        with pytest.raises(Exception, match=f"quantization applies to draft models; {kind} load dense"):
            LLM(ckpts["random"], speculative_config={**_spec(method, str(root / head), 1), "quantization": "fp8"},
                **ENGINE)
    from safetensors.torch import load_file, save_file

    write_medusa(str(tmp_path / "broken"), num_heads=2)
    f = str(tmp_path / "broken" / "model.safetensors")
    state = load_file(f)
    state.pop("medusa_heads.lm_heads.1.weight")
    save_file(state, f)
    with pytest.raises(Exception, match="missing.*lm_heads.1.weight"):
        LLM(ckpts["random"], speculative_config=_spec("medusa", str(tmp_path / "broken"), 2), **ENGINE)
    import json

    write_eagle(str(tmp_path / "deep"), 1)
    cfg = json.loads((tmp_path / "deep" / "config.json").read_text())
    (tmp_path / "deep" / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 2}))
    with pytest.raises(Exception, match="num_hidden_layers=2.*single-layer"):
        LLM(ckpts["random"], speculative_config=_spec("eagle", str(tmp_path / "deep")), **ENGINE)


def test_heads_are_off_at_large_batches(ckpts):
    """The batch-size policy: with 8 requests running together and disable_by_batch_size=4 the head is never
    asked (no drafts), with 0 it always is; the output is the same either way."""
    head = str(ckpts["root"] / "mlp_shift")
    prompts = _prompts(8, seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = []
    for off_at in (4, 0):
        cfg = {**_spec("mlp_speculator", head), "disable_by_batch_size": off_at}
        llm = LLM(ckpts["shift"], speculative_config=cfg, **ENGINE)
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        proposed, _ = _counts(llm)
        assert (proposed == 0) == (off_at == 4), (off_at, proposed)
        llm.llm_engine.shutdown()
    assert outs[0] == outs[1]


def test_eagle_layer_matches_transformers_and_its_own_cache(tmp_path):
    """The EAGLE-1 layer over a whole sequence equals transformers' LlamaDecoderLayer (input norm removed, as
    EAGLE does) on the same weights, and feeding it one position at a time through its K/V cache gives the
    same outputs: attention, rotary, GQA and the cache are right, not only the oracle's pass-through."""
    import json
    from types import SimpleNamespace

    import transformers as T
    from safetensors.torch import load_file

    from octavo.plugins.spec_decode.eagle import EagleSpeculator
    from octavo.speculator import SpeculativeConfig

    write_eagle(str(tmp_path / "e"), 1, seed=21)
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    V, H = TINY["vocab_size"], TINY["hidden_size"]
    gen = torch.Generator().manual_seed(0)
    embed = torch.nn.Embedding(V, H)
    embed.weight.data = torch.randn(V, H, generator=gen)
    target = SimpleNamespace(model=SimpleNamespace(embed_tokens=embed, layers=[]), compute_logits=lambda h: h)
    spec = SpeculativeConfig(method="eagle", model=str(tmp_path / "e"), num_speculative_tokens=2)
    head = EagleSpeculator.load_head(spec, hidden_size=H, vocab_size=V, device="cpu", dtype=torch.float32,
                                     target=target)
    n = 11
    tokens = torch.randint(0, V, (n,), generator=gen)
    feat = torch.randn(n, H, generator=gen)
    with torch.no_grad():
        full = head.run("a", tokens, feat, torch.arange(n))
        step = torch.cat([head.run("b", tokens[i:i + 1], feat[i:i + 1], torch.tensor([i])) for i in range(n)])
        assert torch.allclose(step, full, atol=1e-5)

        hf_cfg = T.LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
        hf_cfg._attn_implementation = "eager"
        layer = T.models.llama.modeling_llama.LlamaDecoderLayer(hf_cfg, layer_idx=0).float()
        state = {k.removeprefix("layers.0."): v for k, v in load_file(str(tmp_path / "e" / "model.safetensors")).items()
                 if k.startswith("layers.0.")}
        layer.load_state_dict(state, strict=False)
        layer.input_layernorm = torch.nn.Identity()
        x = head.fc(torch.cat([embed(tokens), feat], -1)).unsqueeze(0)
        pos = torch.arange(n).unsqueeze(0)
        pe = T.models.llama.modeling_llama.LlamaRotaryEmbedding(config=hf_cfg)(x, pos)
        mask = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        out = out[0] if isinstance(out, tuple) else out
        assert torch.allclose(out[0], full, atol=1e-5), (out[0] - full).abs().max()


def test_medusa_truncated_vocabulary_maps_through_token_map(tmp_path):
    """vLLM's truncated Medusa vocabulary: lm heads over ``truncated_vocab_size`` rows, ``token_map`` gives each
    row's token id in the target's vocabulary."""
    import json

    from safetensors.torch import save_file

    from octavo.plugins.spec_decode.medusa import MedusaSpeculator
    from octavo.speculator import SpeculativeConfig

    V, H, T_ = TINY["vocab_size"], TINY["hidden_size"], 10
    token_map = torch.randperm(V)[:T_]
    rows = torch.randn(T_, H)
    state = {"blocks.0.layers.0.weight": torch.zeros(H, H), "lm_heads.0.weight": rows, "token_map": token_map}
    (tmp_path / "m").mkdir()
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_heads": 1, "num_hidden_layers": 1, "hidden_size": H,
                                                             "vocab_size": V, "truncated_vocab_size": T_}))
    cfg = SpeculativeConfig(method="medusa", model=str(tmp_path / "m"), num_speculative_tokens=1)
    head = MedusaSpeculator.load_head(cfg, hidden_size=H, vocab_size=V, device="cpu", dtype=torch.float32)
    hidden = rows[[3, 7]] * 10  # each hidden state points at one row of the truncated lm head
    assert head.propose(hidden, torch.tensor([0, 0]), 1)[:, 0].tolist() == token_map[[3, 7]].tolist()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_heads": 1, "hidden_size": H, "vocab_size": V}))
    with pytest.raises(ValueError, match="token_map"):
        MedusaSpeculator.load_head(cfg, hidden_size=H, vocab_size=V, device="cpu", dtype=torch.float32)
