"""FP8 KV cache on one GPU (issue 9 item 4), bounded: every phase checks the time left and the JSON is rewritten
after each, so a timeout still leaves what was measured.

1. kernels: the Triton KV-write kernel's fp8 bytes vs torch's cast of ``x / scale`` (the hardware conversion the
   CPU interpreter cannot check), and the paged-attention kernel on an fp8 cache vs ``torch_sdpa`` on the same cache;
2. model: a tiny random Llama (bf16 weights, normal 0.08), ``triton`` backend, bf16 cache vs fp8 (e4m3, e5m2)
   cache, teacher-forced greedy agreement over 8 prompts x 32 tokens and the worst relative logit error;
3. engine: the same checkpoint plus ``k_scale``/``v_scale`` tensors (loaded through the weight loader), ``LLM`` with
   CUDA graphs, ``kv_cache_dtype`` auto vs fp8 at the same ``gpu_memory_utilization``: KV blocks (about 2x) and the
   free-running greedy tokens of both engines;
4. throughput (only when enough time is left): Llama-3-8B shape with KVFP8_LAYERS layers (default 8, not 32: the
   60 s bound), dummy weights, offline 256 x 512/128, bf16 vs ``quantization="fp8", kv_cache_dtype="fp8"``.

    python benchmarks/kvfp8_gpu.py --out $OUT/kvfp8/kvfp8_gpu.json --budget 52
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T0 = time.perf_counter()
RESULT: dict = {}
# dry run on a CPU machine: TRITON_INTERPRET=1 python benchmarks/kvfp8_gpu.py --out /tmp/k.json (tiny sizes)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DRY = DEV == "cpu"
N_PROMPTS, N_TOKENS = (2, 4) if DRY else (8, 32)


def left(budget: float) -> float:
    return budget - (time.perf_counter() - T0)


def save(path: str) -> None:
    with open(path, "w") as f:
        json.dump(RESULT, f, indent=1)


def kernels() -> dict:
    from octavo.nn.kv_quant import quantize
    from octavo.plugins.attention.torch_sdpa import TorchSDPABackend
    from octavo.plugins.attention.triton import TritonAttentionBackend
    from tests.quant.test_kv_cache_fp8 import _scenario

    out = {}
    gen = torch.Generator().manual_seed(0)
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        impl = TritonAttentionBackend(num_heads=32, head_size=128, num_kv_heads=8, scale=128 ** -0.5)
        impl.k_scale, impl.v_scale = 0.037, 0.011
        k = (torch.randn(300, 8, 128, generator=gen) * 3).bfloat16().to(DEV)
        v = torch.randn(300, 8, 128, generator=gen).bfloat16().to(DEV)
        cache = torch.zeros(2, 40, 16, 8, 128, dtype=dtype, device=DEV)
        slots = torch.randperm(640, generator=gen)[:300].to(DEV)
        impl.write_kv(k, v, cache, slots)
        flat = cache.view(torch.uint8).view(2, -1, 8, 128)  # compare bytes (fp8 indexing is not on every device)
        want_k = quantize(k, 0.037, dtype).view(torch.uint8)
        want_v = quantize(v, 0.011, dtype).view(torch.uint8)
        diff = int((flat[0][slots] != want_k).sum() + (flat[1][slots] != want_v).sum())
        res = {"write_bytes_differing": diff, "write_bytes": 2 * k.numel()}  # (the CPU interpreter rounds wrongly)
        # fp32 q/k/v (the model phase covers bf16); same fp8 cache rule on both sides
        got, _, _ = _scenario(TritonAttentionBackend, dtype, 0.02, 0.015, device=DEV, d=64, heads=(8, 2))
        ref, _, _ = _scenario(TorchSDPABackend, dtype, 0.02, 0.015, device=DEV, d=64, heads=(8, 2))
        res["attention_max_abs_diff_vs_torch_sdpa"] = max(float((g - r).abs().max()) for g, r in zip(got, ref))
        out[name] = res
    return out


def tiny_checkpoint(tmp: str, scales: bool) -> str:
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         architectures=["LlamaForCausalLM"], tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(torch.ones_like(p) if "norm" in name else torch.randn_like(p) * 0.08)
    d = os.path.join(tmp, "tiny-scales" if scales else "tiny")
    hf.to(torch.bfloat16).save_pretrained(d)
    if scales:  # llm-compressor / vLLM naming: <attn>.k_scale, <attn>.v_scale (fp32 scalars)
        path = os.path.join(d, "model.safetensors")
        sd = load_file(path)
        for i in range(config.num_hidden_layers):
            sd[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(2.0 ** -4)
            sd[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(2.0 ** -5)
        save_file(sd, path, metadata={"format": "pt"})
    return d


def model_parity(tmp: str) -> dict:
    from octavo.config import OctavoSettings
    from octavo.core.loader import load_model, resolve_model
    from octavo.core.plugin_manager import get_plugin_manager
    from octavo.plugins.attention.triton import TritonAttentionBackend
    from octavo.testing.model import PagedRunner

    resolved = resolve_model(OctavoSettings.from_kwargs(model=tiny_checkpoint(tmp, False)).model)
    model = load_model(resolved, model_cls=get_plugin_manager().resolve("models", resolved.architecture),
                       dtype=torch.bfloat16, device=DEV)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 512) for _ in range(rng.randrange(4, 40))] for _ in range(N_PROMPTS)]
    ref = PagedRunner(model, TritonAttentionBackend, num_blocks=128, device=DEV)
    want = []
    for p in prompts:  # bf16-cache greedy decode (decode steps)
        logits = ref.step([("r", p)])
        toks = []
        for _ in range(N_TOKENS):
            toks.append(int(logits[0][-1].argmax()))
            logits = ref.step([("r", [toks[-1]])])
        ref.free("r")
        want.append(toks)
    full = [p + w for p, w in zip(prompts, want)]
    base = PagedRunner(model, TritonAttentionBackend, num_blocks=128, device=DEV).prompts(full)
    out = {}
    for name, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        got = PagedRunner(model, TritonAttentionBackend, num_blocks=128, device=DEV, kv_dtype=dtype).prompts(full)
        agree = total = 0
        worst = 0.0
        for p, b, g in zip(prompts, base, got):
            b, g = b[len(p) - 1:-1], g[len(p) - 1:-1]
            agree += int((b.argmax(-1) == g.argmax(-1)).sum())
            total += b.shape[0]
            worst = max(worst, float(((b - g).abs().amax(-1) / b.abs().amax(-1)).max()))
        out[name] = {"agreement_vs_bf16_cache": agree / total, "worst_logit_diff_rel": worst,
                     "positions": total}
    return out


def engines(tmp: str) -> dict:
    from octavo import LLM, SamplingParams

    d = tiny_checkpoint(tmp, True)
    rng = random.Random(1)
    prompts = [{"prompt_token_ids": [rng.randrange(1, 512) for _ in range(24)]} for _ in range(N_PROMPTS)]
    out, tokens = {}, {}
    for kv in ("auto", "fp8"):
        t = time.perf_counter()
        mem = {"kv_cache_memory_bytes": 64 << 20} if DRY else {"gpu_memory_utilization": 0.3}
        llm = LLM(model=d, dtype="bfloat16", skip_tokenizer_init=True, kv_cache_dtype=kv, max_model_len=512, **mem)
        worker = llm.llm_engine.core.executor.driver
        res = {"start_s": time.perf_counter() - t, "num_blocks": worker.num_blocks,
               "cache_dtype": str(worker.kv_caches[0].dtype), "backend": worker.attn_backend_cls.name,
               "k_scale_layer0": worker.attn_layers[0].impl.k_scale,
               "v_scale_layer0": worker.attn_layers[0].impl.v_scale}
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=N_TOKENS, ignore_eos=True),
                            use_tqdm=False)
        tokens[kv] = [list(o.outputs[0].token_ids) for o in outs]
        out[kv] = res
        del llm, worker
        gc.collect()
        if not DRY:
            torch.cuda.empty_cache()
    out["block_ratio_fp8_over_bf16"] = out["fp8"]["num_blocks"] / out["auto"]["num_blocks"]
    same = sum(a == b for x, y in zip(tokens["auto"], tokens["fp8"]) for a, b in zip(x, y))
    out["free_running_same_tokens"] = same / sum(len(x) for x in tokens["auto"])
    out["free_running_identical_prompts"] = sum(x == y for x, y in zip(tokens["auto"], tokens["fp8"]))
    return out


LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def throughput(tmp: str, budget: float, layers: int) -> dict:
    from octavo import LLM, SamplingParams

    d = os.path.join(tmp, "llama3-8b-shape")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(LLAMA3_8B, num_hidden_layers=layers), f)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(1000, 120000) for _ in range(512)]} for _ in range(256)]
    out = {"layers": layers, "workload": "256 x 512/128"}
    for name, kw in (("bf16", {}), ("fp8_w_fp8_kv", {"quantization": "fp8", "kv_cache_dtype": "fp8"})):
        if left(budget) < 12:
            out[name] = {"skipped": f"{left(budget):.0f} s left"}
            continue
        t = time.perf_counter()
        llm = LLM(model=d, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True, max_model_len=1024,
                  gpu_memory_utilization=0.9, **kw)
        res = {"start_s": time.perf_counter() - t,
               "num_blocks": llm.llm_engine.core.executor.driver.num_blocks}
        llm.generate(prompts[:4], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(max_tokens=128, ignore_eos=True), use_tqdm=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        res.update({"offline_s": dt, "output_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / dt})
        out[name] = res
        print(name, json.dumps(res), flush=True)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    if "output_tok_s" in out.get("bf16", {}) and "output_tok_s" in out.get("fp8_w_fp8_kv", {}):
        out["fp8_over_bf16_throughput"] = out["fp8_w_fp8_kv"]["output_tok_s"] / out["bf16"]["output_tok_s"]
        out["fp8_over_bf16_blocks"] = out["fp8_w_fp8_kv"]["num_blocks"] / out["bf16"]["num_blocks"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=52.0, help="seconds; phases start only if time is left")
    ap.add_argument("--layers", type=int, default=int(os.environ.get("KVFP8_LAYERS", "8")))
    ap.add_argument("--phases", default="kernels,model_parity,engines,throughput_8b_shape",
                    help="comma-separated subset (a rerun can take the phases the first run had no time for)")
    args = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    RESULT.update({"card": torch.cuda.get_device_name(0) if not DRY else "cpu (dry run)", "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)})
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, need in (("kernels", kernels, 5), ("model_parity", lambda: model_parity(tmp), 8),
                               ("engines", lambda: engines(tmp), 15),
                               ("throughput_8b_shape", lambda: throughput(tmp, args.budget, args.layers),
                                1e9 if DRY else 25)):
            if name not in args.phases.split(","):
                continue
            if left(args.budget) < need:
                RESULT[name] = {"skipped": f"{left(args.budget):.0f} s left of the {args.budget:.0f} s budget"}
            else:
                t = time.perf_counter()
                try:
                    RESULT[name] = fn()
                except Exception as e:  # noqa: BLE001 - reported in the JSON
                    RESULT[name] = {"error": f"{type(e).__name__}: {e}"}
                RESULT[name + "_s"] = round(time.perf_counter() - t, 2)
            print(name, json.dumps(RESULT[name]), flush=True)
            save(args.out)


if __name__ == "__main__":
    main()
