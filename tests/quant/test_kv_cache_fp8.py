"""FP8 KV cache (``kv_cache_dtype="fp8"`` / ``"fp8_e5m2"``, octavo.nn.kv_quant): the rule, the backends, the engine.

1. the quantize/dequantize round trip stays within the documented per-element bound and saturates;
2. ``torch_sdpa`` with an fp8 cache computes exactly what it computes with an fp32 cache holding the
   round-tripped K/V (so the only error is the storage rounding), and stays close to the fp32-cache output;
3. the real SmolLM2 (fp32 weights) with an fp8 cache agrees with its fp32-cache run on greedy decisions, and the
   same ``kv_cache_memory_bytes`` holds 4x the blocks of fp32 (2x bf16);
4. the Triton kernels (write + paged attention, fp8 loads with in-kernel scales) under TRITON_INTERPRET=1
   against the torch reference backend;
5. checkpoint scales reach the layers through the weight loader; refusals name the backend and the setting.
"""

from __future__ import annotations

import pytest
import torch

from octavo.nn.kv_quant import (
    FP8_MAX,
    REL_ERROR,
    check_kv_cache_dtype,
    dequantize,
    error_bound,
    kv_cache_torch_dtype,
    quantize,
)
from octavo.plugins.attention.torch_sdpa import TorchSDPABackend
from octavo.testing.attention import make_layout
from tests.utils import run_triton_interpreted

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


# ------------------------------------------------------------------------------------------ 1. the rule

@pytest.mark.parametrize("dtype", [E4M3, E5M2])
@pytest.mark.parametrize("scale", [1.0, 0.02, 3.0])
def test_round_trip_within_documented_bound(dtype, scale):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.logspace(-4, 2, 4096)  # subnormal to near-max values
    x = x.clamp(-FP8_MAX[dtype] * scale, FP8_MAX[dtype] * scale)
    stored = quantize(x, scale, dtype)
    assert stored.dtype == dtype
    err = (dequantize(stored, scale, torch.float32) - x).abs()
    assert torch.all(err <= error_bound(x, scale, dtype)), (err / error_bound(x, scale, dtype)).max()
    assert torch.equal(stored.view(torch.uint8), (x / scale).to(dtype).view(torch.uint8))  # round to nearest


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_saturates_instead_of_overflowing(dtype):
    x = torch.tensor([1e9, -1e9, 0.0])
    back = dequantize(quantize(x, 0.5, dtype), 0.5, torch.float32)
    assert back.tolist() == [FP8_MAX[dtype] * 0.5, -FP8_MAX[dtype] * 0.5, 0.0]


def test_dtype_names():
    assert kv_cache_torch_dtype("fp8", torch.bfloat16) is E4M3
    assert kv_cache_torch_dtype("fp8_e4m3", torch.bfloat16) is E4M3
    assert kv_cache_torch_dtype("fp8_e5m2", torch.float32) is E5M2
    assert kv_cache_torch_dtype("auto", torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype='int4' is unknown"):
        kv_cache_torch_dtype("int4", torch.float32)


# --------------------------------------------------------------------------- 2. torch_sdpa, attention level

def _scenario(backend_cls, cache_dtype, k_scale, v_scale, *, device="cpu", block_size=4, heads=(4, 2), d=32,
              kv=None, seed=0):
    """Two steps over a shuffled paged layout: step 1 = a full prefill of A and a first chunk of B, step 2 =
    a decode of A and the rest of B. Returns the outputs of both steps, the q/k/v used and the cache."""
    num_heads, num_kv = heads
    gen = torch.Generator().manual_seed(seed)
    lens = {"A": 11, "B": 14}
    q = {r: torch.randn(n, num_heads, d, generator=gen) for r, n in lens.items()}
    k = {r: torch.randn(n, num_kv, d, generator=gen) for r, n in lens.items()}
    v = {r: torch.randn(n, num_kv, d, generator=gen) for r, n in lens.items()}
    if kv is not None:  # the caller's k/v (e.g. round-tripped through fp8)
        k, v = kv
    tables = {"A": [7, 2, 9, 4], "B": [1, 8, 3, 6]}
    impl = backend_cls(num_heads=num_heads, head_size=d, num_kv_heads=num_kv, scale=d ** -0.5)
    impl.k_scale, impl.v_scale = k_scale, v_scale
    cache = torch.zeros(backend_cls.kv_cache_shape(10, block_size, num_kv, d), dtype=cache_dtype, device=device)
    outs = []
    # (request, cached before, new this step); decodes first
    for step in ([("A", 0, 10), ("B", 0, 6)], [("A", 10, 1), ("B", 6, 8)]):
        layout = make_layout([tables[r] for r, _, _ in step], [c for _, c, _ in step], [n for _, _, n in step],
                             block_size)
        md = backend_cls.build_metadata(layout, torch.device(device))
        cat = [torch.cat([t[r][c:c + n] for r, c, n in step]).to(device) for t in (q, k, v)]
        outs.append(impl.forward(*cat, cache, md).cpu())
    return outs, (q, k, v), cache.cpu()


@pytest.mark.parametrize("dtype,scales", [(E4M3, (1.0, 1.0)), (E4M3, (0.02, 0.015)), (E5M2, (1.0, 1.0))])
def test_torch_sdpa_fp8_cache_vs_fp32_cache(dtype, scales):
    k_scale, v_scale = scales
    fp8, (q, k, v), _ = _scenario(TorchSDPABackend, dtype, k_scale, v_scale)
    # the same backend and fp32 cache, fed the K/V an fp8 cache returns: equal to fp32 rounding
    rk = {r: dequantize(quantize(t, k_scale, dtype), k_scale, torch.float32) for r, t in k.items()}
    rv = {r: dequantize(quantize(t, v_scale, dtype), v_scale, torch.float32) for r, t in v.items()}
    twin, _, _ = _scenario(TorchSDPABackend, torch.float32, 1.0, 1.0, kv=(rk, rv))
    exact, _, _ = _scenario(TorchSDPABackend, torch.float32, 1.0, 1.0)
    for got, want, ref in zip(fp8, twin, exact):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # against the unquantized cache: the relative RMS error stays under one value's relative bound
        rel = ((got - ref).norm() / ref.norm()).item()
        print(f"{dtype} scales {scales}: relative RMS output error vs fp32 cache {rel:.4f}")
        assert rel <= REL_ERROR[dtype]


# ------------------------------------------------------------ 3. the engine: real SmolLM2, fp32 weights

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]
TEXT = ("The sun rose slowly over the quiet hills, and the village began to wake. Bakers opened their shops, "
        "children ran to school, and the old clock in the square struck seven.")
NEW_TOKENS = 32
# SmolLM2-135M: 30 layers x (K, V) x 16 tokens x 3 KV heads x 64 features, one byte each in fp8
FP8_BLOCK_BYTES = 30 * 2 * 16 * 3 * 64
BUDGET = 64 * 4 * FP8_BLOCK_BYTES  # 64 blocks in fp32, 128 in bf16, 256 in fp8


@pytest.fixture(scope="module")
def smollm2():
    """One engine (fp8 cache, fp32 weights dequantized from the GGUF); its model is reused for the references."""
    from octavo import LLM, SamplingParams

    llm = LLM(quantization="none", dtype="float32", kv_cache_dtype="fp8", kv_cache_memory_bytes=BUDGET,
              max_model_len=512, enforce_eager=True)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    worker = llm.llm_engine.core.executor.driver
    return worker, tokenizer, prompts, [list(o.outputs[0].token_ids) for o in outs]


def _teacher_forced_picks(model, prompts, want, kv_dtype):
    """Greedy picks of ``model`` with a ``kv_dtype`` cache under the context ``prompt + want``: one prefill
    step, whose attention reads every position back from the (fp8) cache as a decode would."""
    from octavo.testing.model import PagedRunner

    runner = PagedRunner(model, num_blocks=2 + len(prompts) * (1 + (max(map(len, prompts)) + NEW_TOKENS) // 16),
                         kv_dtype=kv_dtype)
    logits = runner.prompts([p + w for p, w in zip(prompts, want)])
    return [lg[len(p) - 1:-1].argmax(-1).tolist() for lg, p in zip(logits, prompts)]


def _log_likelihood(model, tokens, kv_dtype) -> float:
    from octavo.testing.model import PagedRunner

    logits = PagedRunner(model, num_blocks=4 + len(tokens) // 16, kv_dtype=kv_dtype).prompts([tokens])[0]
    logp = torch.log_softmax(logits.double(), -1)[:-1].gather(1, torch.tensor(tokens[1:])[:, None])
    return logp.mean().item()


def test_smollm2_fp8_cache_blocks_and_engine(smollm2):
    worker, _, _, engine_tokens = smollm2
    assert worker.kv_caches[0].dtype is E4M3 and worker.num_blocks == BUDGET // FP8_BLOCK_BYTES == 256
    assert all(layer.impl.k_scale == layer.impl.v_scale == 1.0 for layer in worker.attn_layers)  # no ckpt scales
    assert all(len(t) == NEW_TOKENS for t in engine_tokens)


def test_smollm2_fp8_cache_agrees_with_fp32_cache(smollm2):
    """Per decision under one context: the fp8-cache engine decodes greedily (decode steps through the fp8 cache);
    under that context the fp32-cache model must pick the same next token (issue bound: >= 90%). The fp8-cache
    model under the same context (one prefill, every position read back from the fp8 cache) must reproduce most of
    the engine's own picks: both paths quantize alike, but a K/V value next to an fp8 rounding boundary lands on
    either side after the fp32 noise of a different batch shape (measured 97.7%; with an fp32 cache 100%)."""
    worker, tokenizer, prompts, engine_tokens = smollm2
    model = worker.model  # the engine is done with it: the runners below rebind its attention layers
    fp32 = _teacher_forced_picks(model, prompts, engine_tokens, torch.float32)
    fp8 = _teacher_forced_picks(model, prompts, engine_tokens, E4M3)
    total = len(prompts) * NEW_TOKENS
    rate = sum(a == b for x, y in zip(fp32, engine_tokens) for a, b in zip(x, y)) / total
    self_rate = sum(a == b for x, y in zip(fp8, engine_tokens) for a, b in zip(x, y)) / total
    tokens = tokenizer.encode(TEXT)
    ll8, ll32 = _log_likelihood(model, tokens, E4M3), _log_likelihood(model, tokens, torch.float32)
    print(f"fp8 vs fp32 KV cache, SmolLM2 fp32 weights, {len(prompts)} prompts x {NEW_TOKENS}: agreement "
          f"{rate:.1%} (fp8 prefill path vs fp8 engine decode: {self_rate:.1%}); per-token log-likelihood "
          f"fp8 {ll8:.4f} vs fp32 {ll32:.4f} ({abs(ll8 - ll32) / abs(ll32):.2%})")
    assert rate >= 0.9
    assert self_rate >= 0.9
    assert abs(ll8 - ll32) <= 0.02 * abs(ll32)


# ---------------------------------------------------------------------------- 4. Triton kernels, interpreted

# Triton's interpreter rounds fp32 -> fp8 wrongly when rounding up crosses a power of two (-0.49 -> -0.25 in
# e4m3; the GPU's cvt instruction is right, and benchmarks/device/kvfp8.sh checks its bytes against torch's), so
# here K/V are pre-rounded to the fp8 grid and the scales are powers of two: x / scale is exact, the cast too.
TRITON_SCRIPT = r"""
import torch
from octavo.nn.kv_quant import dequantize, quantize
from octavo.plugins.attention.torch_sdpa import TorchSDPABackend
from octavo.plugins.attention.triton import TritonAttentionBackend
from tests.quant.test_kv_cache_fp8 import _scenario
cpu = torch.device("cpu")
for dtype, (ks, vs) in ((torch.float8_e4m3fn, (2.0 ** -5, 2.0 ** -6)), (torch.float8_e5m2, (1.0, 2.0))):
    for name in ("fp8", "fp8_e5m2"):
        assert TritonAttentionBackend.supports_kv_cache_dtype(name, cpu)
    _, (q, k, v), _ = _scenario(TorchSDPABackend, torch.float32, 1.0, 1.0, d=16)
    kv = ({r: dequantize(quantize(t, ks, dtype), ks, torch.float32) for r, t in k.items()},
          {r: dequantize(quantize(t, vs, dtype), vs, torch.float32) for r, t in v.items()})
    got, _, got_cache = _scenario(TritonAttentionBackend, dtype, ks, vs, d=16, kv=kv)
    want, _, want_cache = _scenario(TorchSDPABackend, dtype, ks, vs, d=16, kv=kv)
    assert torch.equal(got_cache.view(torch.uint8), want_cache.view(torch.uint8)), dtype
    for g, w in zip(got, want):
        err = (g - w).abs().max().item()
        assert err <= 1e-4, (dtype, err)
# the unquantized path through the same kernels (KV_FP8 off; q and cache fp32, as the scenario makes them)
for dtype in (torch.float32,):
    got, _, got_cache = _scenario(TritonAttentionBackend, dtype, 1.0, 1.0, d=16)
    want, _, want_cache = _scenario(TorchSDPABackend, dtype, 1.0, 1.0, d=16)
    assert torch.equal(got_cache, want_cache), dtype
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() <= 1e-4, dtype
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter check for CPU machines; the GPU run is "
                    "benchmarks/device/kvfp8.sh")
def test_triton_fp8_kernels_interpreted_match_torch_reference():
    pytest.importorskip("triton")
    run_triton_interpreted(TRITON_SCRIPT)


# ------------------------------------------------- checkpoint scales and block counts (tiny Llama, workers)

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama checkpoint whose attention layers carry llm-compressor style ``k_scale``/``v_scale``."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    d = tmp_path_factory.mktemp("tiny-kv-scales")
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(d)
    sd = load_file(d / "model.safetensors")
    sd["model.layers.0.self_attn.k_scale"], sd["model.layers.0.self_attn.v_scale"] = torch.tensor(0.25), torch.tensor(0.5)
    sd["model.layers.1.self_attn.kv_scale"] = torch.tensor([0.125])  # the older single-scale spelling
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    return d


def _worker(model_dir, **kwargs):
    from octavo.config import OctavoSettings
    from octavo.core.worker import create_worker

    return create_worker(OctavoSettings.from_kwargs(model=str(model_dir), dtype="float32", max_model_len=64,
                                                    **kwargs))


def test_blocks_follow_the_element_size_and_checkpoint_scales_reach_the_backend(tiny_dir):
    # per block: 2 layers x (K, V) x 16 tokens x 2 KV heads x 8 features = 1024 elements
    budget = 1024 * 4 * 40
    blocks = {kv: _worker(tiny_dir, kv_cache_dtype=kv, kv_cache_memory_bytes=budget)
              for kv in ("float32", "bfloat16", "fp8", "fp8_e5m2")}
    n = {kv: w.num_blocks for kv, w in blocks.items()}
    assert n["float32"] == 40 and n["bfloat16"] == 80 and n["fp8"] == n["fp8_e5m2"] == 160, n
    fp8 = blocks["fp8"]
    assert fp8.kv_caches[0].dtype is E4M3 and blocks["fp8_e5m2"].kv_caches[0].dtype is E5M2
    assert [(layer.impl.k_scale, layer.impl.v_scale) for layer in fp8.attn_layers] == [(0.25, 0.5), (0.125, 0.125)]
    # the fp8 engine runs a step (prefill + decode) through the scaled cache
    from octavo.testing.model import PagedRunner

    logits = PagedRunner(fp8.model, kv_dtype=E4M3).step([("a", [1, 2, 3, 4, 5])])
    assert torch.isfinite(logits[0]).all()


def test_bad_checkpoint_scales_are_refused(tiny_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    for name, value, match in (("model.layers.7.self_attn.k_scale", torch.tensor(1.0), r"'model\.layers\.7\.self_attn\.k_scale' has no matching parameter"),
                               ("model.layers.0.self_attn.k_scale", torch.ones(2), "per-head scales"),
                               ("model.layers.0.self_attn.v_scale", torch.tensor(0.0), "must be positive")):
        d = tmp_path / name.replace(".", "_")
        shutil.copytree(tiny_dir, d)
        sd = load_file(d / "model.safetensors")
        sd[name] = value
        save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ValueError, match=match):
            _worker(d, kv_cache_dtype="fp8", kv_cache_memory_bytes=1 << 20)


# ------------------------------------------------------------------------------------------ 5. refusals

class _PlainBackend(TorchSDPABackend.__mro__[1]):  # an AttentionBackend (e.g. a third party's) that says nothing
    name = "plain"

    @classmethod
    def supports(cls, **_):
        from octavo.platform import Availability

        return Availability(True)

    def forward(self, query, key, value, kv_cache, metadata):
        raise NotImplementedError


def test_backends_that_cannot_read_fp8_are_refused_by_name():
    from octavo.plugins.attention.flashinfer import FlashInferAttentionBackend

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8': attention backend 'flashinfer'.*triton"):
        check_kv_cache_dtype("fp8", FlashInferAttentionBackend, cpu)
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8_e5m2': attention backend 'plain' cannot read"):
        check_kv_cache_dtype("fp8_e5m2", _PlainBackend, cpu)
    check_kv_cache_dtype("fp8", TorchSDPABackend, cpu)  # passes
    check_kv_cache_dtype("auto", _PlainBackend, cpu)  # nothing to check


def test_unknown_kv_cache_dtype_names_are_refused():
    from octavo.config import OctavoSettings
    from octavo.errors import ConfigError

    assert OctavoSettings.from_kwargs(kv_cache_dtype="fp8").cache.kv_cache_dtype == "fp8"
    for bad in ("fp8_e4m3fnuz", "int8", "fp4"):
        with pytest.raises(ConfigError, match=r"kv_cache_dtype \(got .*'fp8_e5m2'.*--kv-cache-dtype"):
            OctavoSettings.from_kwargs(kv_cache_dtype=bad)


def test_compiled_cpu_decode_refuses_an_fp8_cache(tiny_dir, monkeypatch):
    from octavo.errors import ConfigError

    monkeypatch.setenv("OCTAVO_CPU_COMPILE", "1")
    with pytest.raises(ConfigError, match="fp8 KV cache"):
        _worker(tiny_dir, kv_cache_dtype="fp8", kv_cache_memory_bytes=1 << 20)


def test_serve_flag_takes_the_fp8_names():
    import argparse

    from octavo.cli.flags import add_settings_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        assert settings_from_args(parser.parse_args(["--kv-cache-dtype", name])).cache.kv_cache_dtype == name
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8_e4m3fnuz"])


def test_a_device_that_cannot_hold_fp8_is_refused():
    """The start-up probe stores and reads back an fp8 tensor on the device; torch's ``meta`` device (no data)
    stands in for a platform whose torch build has no fp8 storage."""
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8': the meta device cannot store .*kv_cache_dtype=auto"):
        check_kv_cache_dtype("fp8", TorchSDPABackend, torch.device("meta"))
