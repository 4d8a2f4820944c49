"""Probe (not a test): make and drop N ``LLM``s with async scheduling and no ``shutdown()``; print the threads still
alive and the RSS after each (session 13: the uni executor's step pool held the executor, so each dropped LLM kept
its model, KV cache and step thread)."""
import gc
import sys
import threading

import psutil

from octavo import LLM, SamplingParams

proc = psutil.Process()
base = proc.memory_info().rss
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    llm = LLM(max_model_len=256, async_scheduling=True)
    llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)
    del llm
    gc.collect()
    steps = [t.name for t in threading.enumerate() if t.name.startswith("octavo-step")]
    print(f"after LLM {i + 1} dropped: step threads alive {len(steps)}, RSS +{(proc.memory_info().rss - base) >> 20} MiB",
          flush=True)
