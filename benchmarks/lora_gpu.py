"""LoRA throughput on one GPU (issue 13's device goal): a batch of 64 greedy requests on a random-weight Llama
shape, base model alone vs the same batch mixed over 8 rank-16 adapters (all seven projections), one engine,
runs alternating in one process. Also checks the Triton kernels against the torch op first.

    python benchmarks/lora_gpu.py --shapes 1b 8b --out DIR [--budget-s 55]

Shapes run in the order given, each in its own engine; a shape starts only if the time left looks enough
(``--budget-s``), and each shape's JSON is written as soon as it is done, so a hard timeout around the
script still leaves the shapes that finished. ``--shapes tiny`` is a CPU dry run.

One engine serves both sides: ``enable_lora`` is on, and the base runs are requests without an adapter, for
which the LoRA hooks return at once and decode steps replay CUDA graphs; steps that carry adapters run
eager (the LoRA slot layout is per step and not captured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root: tests.lora

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, max_position_embeddings=8192,
             rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
             hidden_act="silu", torch_dtype="bfloat16")
SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[lora_gpu {time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def write_adapter(path: str, cfg: dict, rank: int, seed: int, device: str) -> None:
    """A PEFT LoRA adapter with random A and B on all seven projections (drawn on ``device``, saved bf16)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    dims = {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, inter),
            "up_proj": (h, inter), "down_proj": (inter, h)}
    tensors = {}
    for layer in range(layers):
        for name, (d_in, d_out) in dims.items():
            part = "self_attn" if name[0] in "qkvo" else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{name}"
            for suffix, shape in (("lora_A", (rank, d_in)), ("lora_B", (d_out, rank))):
                t = torch.empty(shape, device=device).normal_(0, 0.02, generator=gen)
                tensors[f"{key}.{suffix}.weight"] = t.bfloat16().cpu()
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(dims)}, f)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_shape(shape: str, args, tmp: str, device: str) -> dict:
    from octavo import LLM, SamplingParams
    from octavo.lora.request import LoRARequest

    cfg = dict(LLAMA, **SHAPES[shape])
    model_dir = os.path.join(tmp, f"llama-{shape}")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    t = time.perf_counter()
    loras = []
    for i in range(args.adapters):
        write_adapter(os.path.join(tmp, f"{shape}-a{i}"), cfg, args.rank, seed=i, device=device)
        loras.append(LoRARequest(f"a{i}", i + 1, os.path.join(tmp, f"{shape}-a{i}")))
    res: dict = {"shape": shape, "config": SHAPES[shape], "adapters_written_s": round(time.perf_counter() - t, 2)}
    log(f"{shape}: {args.adapters} adapters written in {res['adapters_written_s']} s")
    t = time.perf_counter()
    dtype = "bfloat16" if device == "cuda" else "float32"
    memory = {"gpu_memory_utilization": 0.85} if device == "cuda" else {"kv_cache_memory_bytes": 64 << 20}
    llm = LLM(model=model_dir, load_format="dummy", dtype=dtype, skip_tokenizer_init=True,
              max_model_len=args.prompt_len + args.max_tokens + 16, max_num_seqs=args.batch, enable_lora=True,
              max_loras=args.adapters, max_lora_rank=args.rank, enable_prefix_caching=False, **memory)
    res["load_s"] = round(time.perf_counter() - t, 2)
    log(f"{shape}: LLM() {res['load_s']} s")
    vocab = cfg["vocab_size"]
    prompts = [{"prompt_token_ids": [(7919 * i + 104729 * j) % (vocab - 200) + 100 for j in range(args.prompt_len)]}
               for i in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    mixed = [loras[i % len(loras)] for i in range(args.batch)]
    t = time.perf_counter()
    llm.generate(prompts[:len(loras)], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False,
                 lora_request=mixed[:len(loras)])  # loads every adapter into its slot, compiles the kernels
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    sync()
    res["warmup_s"] = round(time.perf_counter() - t, 2)
    lora = llm.llm_engine.core.executor.driver.runner.lora
    res["lora_kernel"] = "triton" if lora.use_triton else "torch"  # the engine's default (OCTAVO_LORA_KERNEL)
    variants = [("base", None, lora.use_triton), ("mixed", mixed, lora.use_triton)]
    if device == "cuda" and args.torch_too:  # the same mixed batch through the other op
        variants.append(("mixed_triton_op" if not lora.use_triton else "mixed_torch_op", mixed, not lora.use_triton))
    tps: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for r in range(args.repeats):
        for name, choice, use_triton in variants:
            lora.use_triton = use_triton
            sync()
            t = time.perf_counter()
            try:
                outs = llm.generate(prompts, params, use_tqdm=False, lora_request=choice)
            except Exception as e:  # noqa: BLE001 - one shot on the device: record it, go on with the others
                res.setdefault("errors", []).append(f"{name}: {type(e).__name__}: {e}")
                log(f"{shape}: {name} FAILED: {type(e).__name__}: {e}")
                continue
            sync()
            dt = time.perf_counter() - t
            tps[name].append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
            log(f"{shape}: {name} round {r}: {tps[name][-1]:.1f} tok/s ({dt:.2f} s)")
    llm.llm_engine.shutdown()
    del llm
    res["tokens_per_s"] = tps
    if tps["mixed"] and tps["base"]:
        res.update({"ratio_best": max(tps["mixed"]) / max(tps["base"]),
                    "ratio_per_round": [m / b for m, b in zip(tps["mixed"], tps["base"])]})
    for other in ("mixed_torch_op", "mixed_triton_op"):
        if tps.get(other) and tps["base"]:
            res[f"ratio_best_{other.removeprefix('mixed_')}"] = max(tps[other]) / max(tps["base"])
    return res


def kernel_check(device: str) -> str:
    """The Triton kernels vs the float64 oracle and the torch op (tests/lora/test_lora_ops.py)."""
    if device != "cuda":
        return "skipped (no CUDA)"
    from tests.lora.test_lora_ops import test_triton_kernels_on_cuda

    try:
        test_triton_kernels_on_cuda()
    except AssertionError as e:
        return f"FAILED: {e}"
    return "passed"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["1b", "8b"], choices=list(SHAPES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip a shape when less than its estimate is left")
    ap.add_argument("--skip-kernel-check", action="store_true")
    ap.add_argument("--torch-too", action="store_true", help="also time the mixed batch with the other op "
                    "(Triton when the engine runs torch, and the reverse)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args)}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    if not args.skip_kernel_check:
        meta["kernel_check"] = kernel_check(device)
        log(f"kernel check: {meta['kernel_check']}")
        if args.out:
            with open(os.path.join(args.out, "kernel_check.json"), "w") as f:
                json.dump(meta, f, indent=1)
    estimate = {"tiny": 5, "1b": 22, "8b": 40}  # seconds a shape needs on an H100 (start-up dominates)
    tmp = tempfile.mkdtemp(prefix="lora_gpu")
    for shape in args.shapes:
        left = args.budget_s - (time.perf_counter() - T0)
        if left < estimate[shape]:
            log(f"{shape}: skipped ({left:.0f} s left, needs ~{estimate[shape]} s)")
            continue
        try:
            res = dict(meta, **run_shape(shape, args, tmp, device))
        except Exception as e:  # noqa: BLE001 - recorded, and the next shape still runs
            import traceback

            res = dict(meta, shape=shape, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{shape}: FAILED: {res['error']}")
        print(json.dumps(res), flush=True)
        if args.out:
            with open(os.path.join(args.out, f"lora_{shape}.json"), "w") as f:
                json.dump(res, f, indent=1)
        if device == "cuda":  # the finished engine's weights must be gone before the next shape sizes its cache
            import gc

            gc.collect()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
