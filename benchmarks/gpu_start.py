"""Where ``LLM(...)`` start time goes on a GPU: the Llama-3-8B shape, dummy weights, bf16, each variant in a fresh
process, the old and new settings side by side in one call (issue 17 item 4).

    python benchmarks/gpu_start.py old_init_cold new_cold new_warm --out start.json
    python benchmarks/gpu_start.py new_cold new_warm st_warm --st-dir /tmp/llama8b --out start.json

Variants (``cold``: an empty Triton cache directory; ``warm``: the directory the previous ``*_cold`` run filled):
  old_init_cold   random weights drawn on the host, as before the fix (core/loader/weights.py ``_init_dummy``)
  new_cold        random weights drawn on the GPU
  new_warm        the same, Triton kernels from the cache of the previous cold run
  few_graphs_warm new_warm with 9 CUDA-graph sizes (1, 2, 4, ..., 256) instead of the default list
  tfconfig_warm   new_warm with the config read by transformers (OCTAVO_LIGHT_CONFIG=0), as before session 5
  noship_cold     new_cold without the Triton kernels shipped with the install (OCTAVO_SHIPPED_KERNELS=0):
                  everything compiled here, as on a machine whose Triton/GPU has no shipped archive
  st_warm         weights from a bf16 safetensors checkpoint on local disk (``--st-dir``; written first, 4 shards,
                  16 GB: still in the page cache when it is read), Triton cache warm
  st_old_warm     st_warm with safetensors' own reader (``get_tensor`` copies each tensor), as before session 5

Each child times its phases by wrapping the functions that do them (resolve, model build + weights, dummy init,
KV-cache profile run, KV allocation, fused kernels, CUDA-graph capture); ``other`` is the rest of ``LLM(...)``
(engine-core set-up, plugin discovery). ``import_s`` is ``import octavo`` + torch; ``first_token_s`` is one
``generate`` of a 512-token prompt and 1 output token after start; ``spawn_to_first_token_s`` counts the
interpreter's own start as well.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

VARIANTS = ("old_init_cold", "new_cold", "new_warm", "few_graphs_warm", "tfconfig_warm", "st_warm", "st_old_warm",
            "noship_cold")


def _old_init_dummy(model, seed: int, skip: tuple[str, ...] = ()) -> None:
    """The host-side random init as it was (draws every weight on the CPU, then copies it to the device)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, param in model.named_parameters():
        if not param.is_floating_point() or name.startswith(skip):
            continue
        if "norm" in name:
            param.data.fill_(1.0)
            continue
        values = torch.empty(param.shape, dtype=torch.float32).uniform_(-1e-3, 1e-3, generator=gen)
        param.data.copy_(values)


def _old_iter_safetensors(files):
    """The reader before session 5: ``safe_open(...).get_tensor`` (a host copy of every tensor)."""
    from safetensors import safe_open

    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def write_safetensors(cfg: dict, directory: str, num_shards: int = 4) -> float:
    """A bf16 checkpoint of ``cfg``'s Llama shape (small random values, HF names, sharded with an index) in
    ``directory``; returns the seconds it took. One 64 MiB pattern is written over and over: fast, not zeros."""
    import torch

    t0 = time.perf_counter()
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": [v, h]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                       p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv, h],
                       p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, h],
                       p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                       p + "mlp.down_proj.weight": [h, i]})
    shapes.update({"model.norm.weight": [h], "lm_head.weight": [v, h]})
    nbytes = {name: 2 * math.prod(shape) for name, shape in shapes.items()}
    total = sum(nbytes.values())
    pattern = ((torch.rand(32 << 20) - 0.5) * 2e-3).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    os.makedirs(directory, exist_ok=True)
    weight_map, shard_bytes = {}, 0
    groups: list[list[str]] = [[]]
    for name in shapes:
        size = nbytes[name]
        if shard_bytes + size > total / num_shards * 1.02 and groups[-1] and len(groups) < num_shards:
            groups.append([])
            shard_bytes = 0
        groups[-1].append(name)
        shard_bytes += size
    for shard, group in enumerate(groups):
        fname = f"model-{shard + 1:05d}-of-{len(groups):05d}.safetensors"
        header, offset = {}, 0
        for name in group:
            size = nbytes[name]
            header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[name] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(os.path.join(directory, fname), "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            left = offset
            while left > 0:
                n = min(left, len(pattern))
                f.write(pattern[:n])
                left -= n
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f)
    return time.perf_counter() - t0


def _timed(phases: dict, name: str, fn):
    import torch

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
    return wrapper


def child(variant: str, spawn_t: float) -> dict:
    t_imp = time.perf_counter()
    import torch

    import octavo  # noqa: F401
    import octavo.core.loader as loader
    import octavo.core.loader.weights as weights
    import octavo.core.profiling as profiling
    import octavo.core.worker as worker_mod
    import octavo.plugins.platforms.cuda_fusions as fusions
    import octavo.plugins.platforms.cuda_graphs as graphs
    from benchmarks.gpu_e2e import LLAMA3_8B, write_config
    from octavo import LLM, SamplingParams

    import_s = time.perf_counter() - t_imp
    phases: dict = {}
    if variant.startswith("old_init"):
        weights._init_dummy = _old_init_dummy
    if variant.startswith("st_old"):
        import octavo.core.loader.safetensors_mmap as stm

        stm.iter_safetensors = _old_iter_safetensors
    if variant.startswith("few_graphs"):
        graphs.default_capture_sizes = lambda n: [s for s in (1, 2, 4, 8, 16, 32, 64, 128, 256) if s <= n]
    weights._init_dummy = _timed(phases, "dummy_init", weights._init_dummy)
    loader.load_model = _timed(phases, "load_model (build + weights)", loader.load_model)
    loader.resolve_model = _timed(phases, "resolve_model", loader.resolve_model)
    profiling.profile_run = _timed(phases, "kv_profile_run", profiling.profile_run)
    worker_mod.Worker._allocate_kv_cache = _timed(phases, "kv_allocate", worker_mod.Worker._allocate_kv_cache)
    fusions.fuse_model = _timed(phases, "fuse_model", fusions.fuse_model)
    graphs.CUDAGraphRunner.capture = _timed(phases, "cuda_graph_capture", graphs.CUDAGraphRunner.capture)

    if variant.startswith("st_"):
        d, load_format = os.environ["GPU_START_ST_DIR"], "safetensors"
    else:
        d, load_format = write_config(LLAMA3_8B, tempfile.mkdtemp(), "llama3-8b"), "dummy"
    t0 = time.perf_counter()
    llm = LLM(model=d, load_format=load_format, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=4096,
              gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=8192)
    llm_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": list(range(1000, 1512))}], SamplingParams(max_tokens=1),
                       use_tqdm=False)
    first_s = time.perf_counter() - t1
    assert len(out[0].outputs[0].token_ids) == 1
    notes = llm.llm_engine.core.executor.driver.prepared.notes
    inner = sum(v for k, v in phases.items() if k != "dummy_init")  # dummy_init runs inside load_model
    return {"variant": variant, "import_s": import_s, "llm_s": llm_s, "first_token_s": first_s,
            "spawn_to_first_token_s": time.time() - spawn_t, "phases_s": phases, "other_s": llm_s - inner,
            "graph_sizes": len(notes.get("graph_sizes") or []), "fused": notes.get("fused"),
            "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"), "card": torch.cuda.get_device_name()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="*", help=f"some of {', '.join(VARIANTS)} (default: all)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per variant")
    ap.add_argument("--keep-cache", default=None, help="tar.gz the first cold run's Triton cache here (the "
                    "kernels a start compiles: what octavo could ship with the install)")
    ap.add_argument("--st-dir", default=None, help="where st_* variants write and read the 8B safetensors")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, float(os.environ["GPU_START_SPAWN_T"]))), flush=True)
        return
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    cache_root = tempfile.mkdtemp(prefix="triton-caches-")
    results, last_cold, extra = [], None, {}
    for v in args.variants or VARIANTS:
        if v.startswith("st_") and "st_write_s" not in extra:
            from benchmarks.gpu_e2e import LLAMA3_8B

            if not args.st_dir:
                ap.error("st_* variants need --st-dir (a local directory with ~16 GB free)")
            extra["st_write_s"] = write_safetensors(LLAMA3_8B, args.st_dir)
            extra["st_bytes"] = sum(os.path.getsize(os.path.join(args.st_dir, f)) for f in os.listdir(args.st_dir))
            print(json.dumps(extra), flush=True)
        if v.endswith("_cold"):
            cache = last_cold = os.path.join(cache_root, v)
        else:
            cache = last_cold or os.path.join(cache_root, "warm-without-cold")
        env = dict(os.environ, TRITON_CACHE_DIR=cache, GPU_START_SPAWN_T=repr(time.time()),
                   GPU_START_ST_DIR=args.st_dir or "")
        if v.startswith("tfconfig"):
            env["OCTAVO_LIGHT_CONFIG"] = "0"
        if v.startswith("noship"):
            env["OCTAVO_SHIPPED_KERNELS"] = "0"
        try:
            p = subprocess.run([sys.executable, __file__, "--child", v], env=env, capture_output=True, text=True,
                               timeout=args.timeout)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(lines[-1][7:]) if lines else {"variant": v, "error": p.stderr[-3000:]}
        except subprocess.TimeoutExpired:
            res = {"variant": v, "error": f"timed out after {args.timeout} s"}
        print(json.dumps(res, indent=1), flush=True)
        results.append(res)
        if args.keep_cache and v.endswith("_cold") and "kept_cache" not in extra and os.path.isdir(cache):
            import tarfile

            with tarfile.open(args.keep_cache, "w:gz", compresslevel=1) as tar:  # fast: inside the time budget
                tar.add(cache, arcname="triton_cache")
            extra["kept_cache"] = {"path": args.keep_cache, "bytes": os.path.getsize(args.keep_cache),
                                   "entries": len(os.listdir(cache)) if os.path.isdir(cache) else 0}
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), **extra,
                           "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
