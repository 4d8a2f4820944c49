"""Multimodal throughput (issue 14): a LLaVA-1.5-7B shape with dummy weights, N requests with one 336x336
image each and a fixed number of output tokens, octavo vs transformers ``generate`` on the same card.

Why two processes: each engine sizes the GPU for itself (octavo takes ``gpu_memory_utilization`` of it), so
octavo runs first in a child process, then transformers in another. Every image is distinct (random pixels),
so octavo's encoder cache never serves one request from another; the prompt is token ids only (no
tokenizer is needed with ``skip_tokenizer_init``). ``--tiny`` runs the same code on a tiny config on CPU
(the dry run). transformers may run fewer requests (``--tf-requests``); the JSON says how many it ran.

    python benchmarks/device/mm_bench.py --out /tmp/mm.json [--tiny] [--requests 256] [--tf-requests 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

IMAGE_TOKEN = 32000
LLAVA_7B = dict(
    architectures=["LlavaForConditionalGeneration"], model_type="llava", image_token_index=IMAGE_TOKEN,
    projector_hidden_act="gelu", vision_feature_layer=-2, vision_feature_select_strategy="default",
    torch_dtype="bfloat16", tie_word_embeddings=False,
    vision_config=dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096,
                       num_hidden_layers=24, num_attention_heads=16, image_size=336, patch_size=14,
                       projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5),
    text_config=dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=32064, rms_norm_eps=1e-5,
                     max_position_embeddings=4096, rope_theta=10000.0, hidden_act="silu",
                     bos_token_id=1, eos_token_id=2, pad_token_id=0),
)
TINY = dict(LLAVA_7B, torch_dtype="float32",
            vision_config=dict(LLAVA_7B["vision_config"], hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=4, image_size=336, patch_size=14),
            text_config=dict(LLAVA_7B["text_config"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=4))


def write_checkpoint(root: str, tiny: bool) -> str:
    path = os.path.join(root, "llava-1.5-7b-shape")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY if tiny else LLAVA_7B, f)
    with open(os.path.join(path, "preprocessor_config.json"), "w") as f:  # llava-hf/llava-1.5-7b-hf's
        json.dump({"image_processor_type": "CLIPImageProcessor", "crop_size": {"height": 336, "width": 336},
                   "do_center_crop": True, "do_normalize": True, "do_resize": True, "do_rescale": True,
                   "do_convert_rgb": True, "resample": 3, "rescale_factor": 1 / 255,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711], "size": {"shortest_edge": 336}}, f)
    return path


def workload(n: int):
    """n distinct 336x336 images and LLaVA-1.5 style prompts as token ids (~24 text tokens + 1 image token)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(n):
        img = Image.fromarray(rng.integers(0, 256, (336, 336, 3), dtype=np.uint8))
        words = rng.integers(100, 31000, 20).tolist()
        ids = [1, 3148, 1001, 29901, IMAGE_TOKEN, 13] + words + [319, 1799, 9047, 13566, 29901]
        prompts.append((ids, img))
    return prompts


def run_octavo(args) -> dict:
    from octavo import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=args.path, load_format="dummy", dtype="float32" if args.tiny else "bfloat16",
              skip_tokenizer_init=True, max_model_len=2048, max_num_seqs=256)
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True, detokenize=False)
    work = workload(args.requests + 4)
    warm = [{"prompt_token_ids": ids, "multi_modal_data": {"image": img}} for ids, img in work[args.requests:]]
    llm.generate(warm, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False),
                 use_tqdm=False)
    prompts = [{"prompt_token_ids": ids, "multi_modal_data": {"image": img}} for ids, img in work[:args.requests]]
    cache = llm.llm_engine.core.executor.driver.runner.encoder_cache
    encoded0, hits0 = cache.encoded, cache.hits
    print(f"octavo: started in {start_s:.1f} s; running {len(prompts)} requests", flush=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
    res = {"engine": "octavo", "requests": len(outs), "wall_s": round(wall, 3), "start_s": round(start_s, 1),
           "output_tokens": out_tokens, "prompt_tokens": prompt_tokens,
           "output_tok_per_s": round(out_tokens / wall, 1), "requests_per_s": round(len(outs) / wall, 3),
           "total_tok_per_s": round((out_tokens + prompt_tokens) / wall, 1),
           "images_encoded": cache.encoded - encoded0, "encoder_cache_hits": cache.hits - hits0}
    print("RESULT " + json.dumps(res), flush=True)  # kept if the diagnostics below run out of time
    # Diagnostics: (1) the front end's image preprocessing alone (CLIP resize/crop/normalize + hash), serial;
    # (2) the same token counts as text only (the image placeholders as plain token ids), same engine: what
    # the images themselves cost (vision tower, eager steps, preprocessing)
    proc = llm.llm_engine.frontend._mm.processor
    t0 = time.perf_counter()
    for ids, img in work[:32]:
        proc.process(ids, {"image": [img]})
    res["preprocess_ms_per_image"] = round((time.perf_counter() - t0) / 32 * 1e3, 2)
    from concurrent.futures import ThreadPoolExecutor  # would a thread pool in the front end help here?

    with ThreadPoolExecutor(8) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda w: proc.preprocess(w[1]), work[:32]))
        res["preprocess_ms_per_image_8_threads"] = round((time.perf_counter() - t0) / 32 * 1e3, 2)
    text = [{"prompt_token_ids": [t if t != IMAGE_TOKEN else 100 + (j * 7919 + k * 104729) % 30000  # distinct:
                                  for j, t in enumerate(o.prompt_token_ids)]}  # no prefix-cache sharing
            for k, o in enumerate(outs)]
    t0 = time.perf_counter()
    touts = llm.generate(text, params, use_tqdm=False)
    twall = time.perf_counter() - t0
    res["text_only_same_lengths"] = {"wall_s": round(twall, 3), "output_tok_per_s": round(
        sum(len(o.outputs[0].token_ids) for o in touts) / twall, 1)}
    res["image_run_over_text_only_wall"] = round(wall / twall, 3)
    return res


def run_transformers(args) -> dict:
    import torch
    from transformers import AutoConfig, CLIPImageProcessor, LlavaForConditionalGeneration

    dev = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    cfg = AutoConfig.from_pretrained(args.path)
    t0 = time.perf_counter()
    with torch.device(dev):
        model = LlavaForConditionalGeneration._from_config(cfg, dtype=dtype).eval()
    start_s = time.perf_counter() - t0
    proc = CLIPImageProcessor.from_pretrained(args.path)
    per_image = (cfg.vision_config.image_size // cfg.vision_config.patch_size) ** 2
    work = workload(args.tf_requests)
    print(f"transformers: model built in {start_s:.1f} s; {len(work)} requests in batches of {args.tf_batch}",
          flush=True)
    done, out_tokens, wall = 0, 0, 0.0
    stop_at = time.monotonic() + args.time_left - 5 if args.time_left else None
    for b in range(0, len(work), args.tf_batch):
        if done and stop_at is not None and time.monotonic() + wall / (done / args.tf_batch) > stop_at:
            print("transformers: stopping early (time bound); the rate covers the batches that ran", flush=True)
            break
        chunk = work[b:b + args.tf_batch]
        ids = []
        for toks, _ in chunk:  # the processor's expansion: one image token -> 576 placeholders
            k = toks.index(IMAGE_TOKEN)
            ids.append(toks[:k] + [IMAGE_TOKEN] * per_image + toks[k + 1:])
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[0] * (width - len(x)) + x for x in ids], device=dev)  # left padding
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=dev)
        pixels = proc(images=[img for _, img in chunk], return_tensors="pt")["pixel_values"].to(dev, dtype)
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=mask, pixel_values=pixels, do_sample=False,
                                 max_new_tokens=args.output_len, min_new_tokens=args.output_len, eos_token_id=None,
                                 pad_token_id=0)
        if dev == "cuda":
            torch.cuda.synchronize()
        wall += time.perf_counter() - t0
        done += len(chunk)
        out_tokens += (out.shape[1] - width) * len(chunk)
        print(f"transformers: {done}/{len(work)} requests, {wall:.1f} s", flush=True)
    return {"engine": "transformers", "requests": done, "batch_size": args.tf_batch, "wall_s": round(wall, 3),
            "build_s": round(start_s, 1), "output_tokens": out_tokens,
            "output_tok_per_s": round(out_tokens / wall, 1), "requests_per_s": round(done / wall, 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true", help="tiny config on CPU (dry run)")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--tf-requests", type=int, default=64)
    p.add_argument("--tf-batch", type=int, default=32)
    p.add_argument("--engine", choices=["octavo", "transformers"], help="(internal) run one side and print JSON")
    p.add_argument("--path")
    p.add_argument("--budget-s", type=float, default=0, help="whole run bound: children are cut to fit it")
    p.add_argument("--time-left", type=float, default=0, help="(internal) seconds this child may take")
    args = p.parse_args()
    if args.engine:
        res = run_octavo(args) if args.engine == "octavo" else run_transformers(args)
        print("RESULT " + json.dumps(res), flush=True)
        return
    record = {"workload": {"model": "LLaVA-1.5-7B shape" + (" (TINY dry run)" if args.tiny else ""),
                           "load_format": "dummy", "requests": args.requests, "image": "336x336, one per request",
                           "output_len": args.output_len, "dtype": "float32" if args.tiny else "bfloat16"}}
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        args.path = write_checkpoint(root, args.tiny)
        for engine in ("octavo", "transformers"):
            left = args.budget_s - (time.monotonic() - t_start) if args.budget_s else None
            if engine == "octavo" and left:
                left *= 0.6  # transformers keeps the rest
            cmd = [sys.executable, __file__, "--out", args.out, "--engine", engine, "--path", args.path,
                   "--requests", str(args.requests), "--output-len", str(args.output_len),
                   "--tf-requests", str(args.tf_requests), "--tf-batch", str(args.tf_batch),
                   "--time-left", str(left or 0)] + (["--tiny"] if args.tiny else [])
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
                out, err, rc = proc.stdout, proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as e:
                out, err, rc = _text(e.stdout), _text(e.stderr), f"timed out after {left:.0f} s"
            sys.stdout.write(out[-4000:])
            sys.stderr.write(err[-4000:])
            lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
            record[engine] = json.loads(lines[-1][7:]) if lines else {"error": f"rc={rc}", "stdout_tail": out[-1500:],
                                                                       "stderr_tail": err[-2000:]}
            with open(args.out, "w") as f:  # partial results survive an outer timeout
                json.dump(record, f, indent=2)
    o, t = record["octavo"], record["transformers"]
    if "output_tok_per_s" in o and "output_tok_per_s" in t:
        record["octavo_over_transformers_output_tok_per_s"] = round(o["output_tok_per_s"] / t["output_tok_per_s"], 2)
        if t["requests"] < o["requests"]:
            record["note"] = (f"transformers ran {t['requests']} of the {o['requests']} requests (batches of "
                              f"{t['batch_size']}) to stay within the time bound; the ratio compares rates")
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)
    print(json.dumps(record, indent=2))


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


if __name__ == "__main__":
    main()
