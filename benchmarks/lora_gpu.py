"""LoRA throughput on one GPU (issue 13's device goal): a batch of 64 greedy requests on a random-weight Llama
shape, the base model alone vs the same batch mixed over 8 rank-16 adapters (all seven projections).

    python benchmarks/lora_gpu.py --shapes 8b --engines base torch triton --out DIR [--layers 16] [--budget-s 55]

Engines run one after the other in one process (each shut down before the next):

- ``base``: ``enable_lora=False``: the base model alone (decode steps replay CUDA graphs).
- ``torch`` / ``triton`` / ``fused``: ``enable_lora=True`` with ``OCTAVO_LORA_KERNEL`` = torch (the dense graph
  op), triton (the fixed-grid SGMV kernels) or fused (dense with the Triton masked expand): decode graphs are captured WITH the LoRA ops (octavo.lora.static), so decode
  steps with any adapter mix replay graphs; prefill steps with adapters run eager. Each times the base requests
  (``base_on_lora``: the same graphs with all-zero masks) and the mixed batch, and counts the graph replays.

``--layers`` keeps the shape's widths with fewer layers (device time); ratios are per engine vs ``base``.
``--shapes tiny`` is a CPU dry run (no graphs there).
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


KNOBS = ("OCTAVO_LORA_SGMV_CONFIG", "OCTAVO_LORA_TRITON_MIN_TOKENS")  # set per engine (docs/lora.md)


def parse_engine(spec: str) -> tuple[str, dict]:
    """``[label=]kernel[@VAR=VALUE...]``: an ``OCTAVO_LORA_KERNEL`` choice (or ``base``) and the knobs of that
    engine (the label only names it in the results)."""
    kernel, *pairs = spec.split("@")
    kernel = kernel.rpartition("=")[2]
    if kernel not in ("base", "auto", "torch", "triton", "fused"):
        raise SystemExit(f"--engines {spec!r}: unknown kernel {kernel!r}")
    env = {}
    for pair in pairs:
        var, eq, val = pair.partition("=")
        if var not in KNOBS or not eq:
            raise SystemExit(f"--engines {spec!r}: {pair!r} is not VAR=VALUE with VAR one of {KNOBS}")
        env[var] = val
    return kernel, env


def run_engine(kind: str, model_dir: str, cfg: dict, loras: list, args, device: str) -> dict:
    """One engine: ``base`` (no LoRA) or a LoRA engine with kernel ``kind``; returns its timings."""
    from octavo import LLM, SamplingParams

    kernel, env = parse_engine(kind)
    for var in KNOBS:
        os.environ.pop(var, None)
    os.environ.update(env)
    os.environ["OCTAVO_LORA_KERNEL"] = "torch" if kernel == "base" else kernel
    t = time.perf_counter()
    dtype = "bfloat16" if device == "cuda" else "float32"
    lora = {} if kernel == "base" else dict(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank)
    llm = LLM(model=model_dir, load_format="dummy", dtype=dtype, skip_tokenizer_init=True,
              max_model_len=args.prompt_len + args.max_tokens + 16, max_num_seqs=args.batch,
              enable_prefix_caching=False, kv_cache_memory_bytes=(2 << 30) if device == "cuda" else 64 << 20, **lora)
    res: dict = {"spec": kind, "load_s": round(time.perf_counter() - t, 2)}
    log(f"{kind}: LLM() {res['load_s']} s")
    vocab = cfg["vocab_size"]
    prompts = [{"prompt_token_ids": [(7919 * i + 104729 * j) % (vocab - 200) + 100 for j in range(args.prompt_len)]}
               for i in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    mixed = [loras[i % len(loras)] for i in range(args.batch)]
    runner = llm.llm_engine.core.executor.driver.runner
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    t = time.perf_counter()
    if kernel != "base":  # loads every adapter into its slot
        llm.generate(prompts[:len(loras)], warm, use_tqdm=False, lora_request=mixed[:len(loras)])
    llm.generate(prompts[:4], warm, use_tqdm=False)
    sync()
    res["warmup_s"] = round(time.perf_counter() - t, 2)
    if runner.lora is not None:
        res["lora_graphs_captured"] = bool(runner.lora.static is not None and runner.lora.static.captured)
    variants = [("base", None)] if kernel == "base" else [("base_on_lora", None), ("mixed", mixed)]
    tps: dict[str, list[float]] = {name: [] for name, _ in variants}
    replays: dict[str, int] = {}
    for r in range(args.repeats):
        for name, choice in variants:
            before = getattr(runner.graph_runner, "num_replays", 0)
            sync()
            t = time.perf_counter()
            try:
                outs = llm.generate(prompts, params, use_tqdm=False, lora_request=choice)
            except Exception as e:  # noqa: BLE001 - one shot on the device: record it, go on with the others
                res.setdefault("errors", []).append(f"{name}: {type(e).__name__}: {e}")
                log(f"{kind}: {name} FAILED: {type(e).__name__}: {e}")
                continue
            sync()
            dt = time.perf_counter() - t
            replays[name] = getattr(runner.graph_runner, "num_replays", 0) - before
            tps[name].append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
            log(f"{kind}: {name} round {r}: {tps[name][-1]:.1f} tok/s ({dt:.2f} s, {replays[name]} graph replays)")
    llm.llm_engine.shutdown()
    del llm, runner
    res["tokens_per_s"], res["graph_replays_last_round"] = tps, replays
    return res


def run_shape(shape: str, args, tmp: str, device: str) -> dict:
    from octavo.lora.request import LoRARequest

    cfg = dict(LLAMA, **SHAPES[shape])
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    model_dir = os.path.join(tmp, f"llama-{shape}")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    t = time.perf_counter()
    loras = []
    for i in range(args.adapters):
        write_adapter(os.path.join(tmp, f"{shape}-a{i}"), cfg, args.rank, seed=i, device=device)
        loras.append(LoRARequest(f"a{i}", i + 1, os.path.join(tmp, f"{shape}-a{i}")))
    res: dict = {"shape": shape, "layers": cfg["num_hidden_layers"], "config": SHAPES[shape],
                 "adapters_written_s": round(time.perf_counter() - t, 2), "engines": {}}
    log(f"{shape}: {args.adapters} adapters written in {res['adapters_written_s']} s, {cfg['num_hidden_layers']} layers")
    for spec in args.engines:
        kind = spec.split("@")[0].partition("=")[0]
        left = args.budget_s - (time.perf_counter() - T0)
        if left < args.engine_s:
            log(f"{shape}: engine {kind} skipped ({left:.0f} s left, needs ~{args.engine_s} s)")
            res["engines"][kind] = {"skipped": f"{left:.0f} s left"}
            continue
        try:
            res["engines"][kind] = run_engine(spec, model_dir, cfg, loras, args, device)
        except Exception as e:  # noqa: BLE001 - recorded, and the next engine still runs
            import traceback

            res["engines"][kind] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            log(f"{shape}: engine {kind} FAILED: {type(e).__name__}: {e}")
        if device == "cuda":  # the finished engine's memory must be gone before the next one sizes its cache
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        if args.out:  # after every engine: a hard timeout still leaves what finished
            with open(os.path.join(args.out, f"lora_{shape}.json"), "w") as f:
                json.dump(res, f, indent=1)
    base = max(res["engines"].get("base", {}).get("tokens_per_s", {}).get("base", []), default=None)
    for kind, e in res["engines"].items():
        for name, vals in e.get("tokens_per_s", {}).items():
            if base and vals and kind != "base":
                res[f"ratio_{kind}_{name}"] = round(max(vals) / base, 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["8b"], choices=list(SHAPES))
    ap.add_argument("--engines", nargs="+", default=["base", "auto"],
                    help="base | auto | torch | triton | fused, each optionally @VAR=VALUE@... with VAR one of "
                    "OCTAVO_LORA_SGMV_CONFIG, OCTAVO_LORA_TRITON_MIN_TOKENS (set for that engine only)")
    ap.add_argument("--layers", type=int, default=0, help="override the shape's layer count (0: keep it)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip an engine when less than --engine-s is left")
    ap.add_argument("--engine-s", type=float, default=12, help="seconds one engine needs (start-up dominates)")
    ap.add_argument("--parity", nargs="*", default=[],
                    help="after the throughput: a tiny fp32 Llama, 5 adapters mixed with the base model, graph engine "
                    "vs enforce_eager engine tokens, per kernel choice (CUDA only; specs as --engines)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    for spec in args.engines + args.parity:
        parse_engine(spec)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args)}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="lora_gpu")
    for shape in args.shapes:
        try:
            res = dict(meta, **run_shape(shape, args, tmp, device))
        except Exception as e:  # noqa: BLE001 - recorded, and the next shape still runs
            import traceback

            res = dict(meta, shape=shape, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])
            log(f"{shape}: FAILED: {res['error']}")
        print(json.dumps({k: v for k, v in res.items() if k != "engines"}), flush=True)
        if args.out:
            with open(os.path.join(args.out, f"lora_{shape}.json"), "w") as f:
                json.dump(res, f, indent=1)
    if args.parity:
        res = dict(meta, parity=parity(args.parity, tmp, device, args.budget_s))
        print(json.dumps(res["parity"]), flush=True)
        if args.out:
            with open(os.path.join(args.out, "parity.json"), "w") as f:
                json.dump(res, f, indent=1)
    sys.stdout.flush()
    os._exit(0)  # an H100 run lingered 37 s after the last engine at interpreter exit: device time


def parity(kernels: list[str], tmp: str, device: str, budget_s: float) -> dict:
    """Graph-replayed LoRA vs eager, end to end: tests/lora/test_lora_gpu.py's engine check, in this process."""
    if device != "cuda":
        return {"skipped": "no CUDA"}
    from octavo.lora.request import LoRARequest
    from tests.lora.conftest import ADAPTERS, make_base
    from tests.lora.test_lora_gpu import _engine, _mixed, write_adapter

    base = os.path.join(tmp, "tiny-base")
    make_base(base)
    loras = []
    for i, (rank, alpha, rslora, targets) in enumerate(ADAPTERS):
        path = os.path.join(tmp, f"tiny-a{i}")
        write_adapter(base, path, rank, alpha * (rank ** 0.5 if rslora else 1), targets, seed=100 + i)
        loras.append(LoRARequest(f"a{i}", i + 1, path))
    out: dict = {}
    for kernel in kernels:
        label, (kind, env) = kernel.split("@")[0].partition("=")[0], parse_engine(kernel)
        if time.perf_counter() - T0 > budget_s - 6:
            out[label] = "skipped (time)"
            continue
        for var in KNOBS:
            os.environ.pop(var, None)
        os.environ.update(env, OCTAVO_LORA_KERNEL=kind)
        try:
            llm = _engine(base)
            runner = llm.llm_engine.core.executor.driver.runner
            captured = bool(runner.graph_runner is not None and runner.lora.static.captured)
            before = runner.graph_runner.num_replays if runner.graph_runner is not None else 0
            choices, got = _mixed(llm, loras)
            replays = (runner.graph_runner.num_replays if runner.graph_runner is not None else 0) - before
            llm.llm_engine.shutdown()
            eager = _engine(base, enforce_eager=True)
            _, want = _mixed(eager, loras)
            eager.llm_engine.shutdown()
            same = [g == w for g, w in zip(got, want)]
            out[label] = {"spec": kernel, "graphs_captured_with_lora": captured, "graph_replays": replays,
                           "requests_equal_eager": f"{sum(same)}/{len(same)}", "passed": all(same) and replays > 0,
                           "distinct_outputs": len({tuple(t) for t in got})}
        except Exception as e:  # noqa: BLE001 - recorded; the next kernel still runs
            out[label] = f"FAILED: {type(e).__name__}: {e}"
        log(f"parity {label}: {out[label]}")
    return out


if __name__ == "__main__":
    main()
