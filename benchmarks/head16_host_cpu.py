"""The engine's host cost per decode step against the position, on the CPU (session 17, engineer head17).

Why: gpu_e2e.py's second batch-1 window (tokens 258..513) read 0.09-0.13 ms/token over its first on the H100; host
work that grows with the generation (O(n) per step, O(n^2) per generation) would show here first. A tiny random Llama
with the e2e engine's settings (async scheduling forced on, ``max_num_seqs``, prefix caching as default, no
tokenizer), a 512-token prompt, greedy, ``ignore_eos``; per step the CPU time (``time.thread_time``: GIL waits do not
count) of the core thread's ``LLMEngine.step`` and of the step thread's ``execute`` minus the model's forward, as
medians per window of steps. A flat row is the answer; the CPU's own load moves every window alike.

    python benchmarks/head16_host_cpu.py --tokens 3000 --window 400 --runs 2 [--max-num-seqs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
            max_position_embeddings=4096, torch_dtype="float32")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=3000)
    ap.add_argument("--window", type=int, default=400)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    args = ap.parse_args()
    from gpu_e2e_common import write_config

    from octavo import LLM, SamplingParams

    d = write_config(TINY, tempfile.mkdtemp(), "tiny")
    llm = LLM(model=d, load_format="dummy", dtype="float32", skip_tokenizer_init=True, max_num_seqs=args.max_num_seqs,
              max_model_len=4096, async_scheduling=True, seed=0)
    rng = random.Random(0)
    prompt = {"prompt_token_ids": [rng.randrange(10, 1000) for _ in range(512)]}
    eng = llm.llm_engine
    driver = eng.core.executor.driver
    model = driver.runner.model
    core_s, exec_s, fwd_s = [], [], []
    clock = time.thread_time
    o_step, o_exec, o_fwd = eng.step, driver.execute, model.forward

    def step():
        t = clock()
        out = o_step()
        core_s.append(clock() - t)
        return out

    def execute(*a, **k):
        t = clock()
        out = o_exec(*a, **k)
        exec_s.append(clock() - t)
        return out

    def forward(*a, **k):
        t = clock()
        out = o_fwd(*a, **k)
        fwd_s.append(clock() - t)
        return out

    eng.step, driver.execute, model.forward = step, execute, forward
    llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True, temperature=0), use_tqdm=False)
    starts = list(range(1, args.tokens - args.window + 2, args.window))
    for _ in range(args.runs):
        for lst in (core_s, exec_s, fwd_s):
            lst.clear()
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0), use_tqdm=False)
        wall = time.perf_counter() - t
        host = [(e - f) * 1e6 for e, f in zip(exec_s, fwd_s)]
        core = [c * 1e6 for c in core_s]
        med = lambda v, a: round(statistics.median(v[a:a + args.window]))  # noqa: E731
        print(json.dumps({"wall_s": round(wall, 2), "steps": len(core), "contexts": [512 + a for a in starts],
                          "core_us": [med(core, a) for a in starts], "step_thread_minus_forward_us":
                          [med(host, a) for a in starts], "forward_us": [med([f * 1e6 for f in fwd_s], a)
                                                                         for a in starts]}), flush=True)
    llm.llm_engine.shutdown()


if __name__ == "__main__":
    main()
