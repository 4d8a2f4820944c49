"""What the GPU end-to-end benchmarks share: the model shapes (Llama-3-8B, Qwen3-0.6B), dummy-weight checkpoints
(``write_config``), the engine as ``gpu_e2e.py`` builds it (``make_llm``), the untimed warm-up of a timed
workload's shapes, the count of Triton builds inside a timed region (``JitMisses``), the timed ``generate``,
nano-vllm's workload and the measured copy rate the roofline divides by. ``gpu_e2e.py`` re-exports every name,
so ``from benchmarks.gpu_e2e import make_llm`` keeps working.
"""

from __future__ import annotations

import json
import os
import random
import time

LLAMA3_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
                 tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16")
QWEN3_0P6B = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  hidden_act="silu", tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
                  torch_dtype="bfloat16")


def write_config(cfg: dict, root: str, name: str) -> str:
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def qwen3_config() -> tuple[dict, str]:
    """The Qwen3-0.6B shape; as a Llama config (same dims, no q/k norm) if octavo has no Qwen3 model yet."""
    from octavo.registry import names

    if "Qwen3ForCausalLM" in names("models"):
        return QWEN3_0P6B, "Qwen3ForCausalLM"
    cfg = dict(QWEN3_0P6B, architectures=["LlamaForCausalLM"], model_type="llama")
    return cfg, "LlamaForCausalLM (Qwen3-0.6B dims; octavo has no Qwen3 model registered)"


def copy_bandwidth() -> float:
    """Largest rate of a few large device-to-device copies (torch's and a Triton kernel), bytes read + written
    per second: the memory ceiling the roofline divides by."""
    import torch
    import triton
    import triton.language as tl
    import triton.testing

    @triton.jit
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + off, tl.load(src + off, mask=off < n), mask=off < n)

    n = 1 << 29  # int64 elements: 4 GiB
    a = torch.randint(0, 1 << 30, (n,), dtype=torch.int64, device="cuda")
    b = torch.empty_like(a)
    best = 0.0
    for fn in (lambda: b.copy_(a), lambda: _copy[(triton.cdiv(n, 4096),)](a, b, n, BLOCK=4096),
               lambda: _copy[(triton.cdiv(n, 1024),)](a, b, n, BLOCK=1024)):
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        best = max(best, 2 * n * 8 / (ms * 1e-3))
    assert torch.equal(a, b)
    return best  # the 8 GiB are freed on return


def make_llm(model_dir: str, **kw):
    from octavo import LLM

    llm = LLM(model=model_dir, load_format=kw.pop("load_format", "dummy"), dtype="bfloat16",
              skip_tokenizer_init=True, **kw)
    worker = llm.llm_engine.core.executor.driver
    info = worker.prepared.notes  # what the cuda platform's prepare_model did (fusions, graph sizes)
    return llm, worker, info


def warm_up(llm, lengths: list[tuple[int, int]], seed: int, temperature: float | None = None,
            ids: tuple[int, int] = (20000, 120000)) -> float:
    """An untimed run of the timed workload's shapes before the timed region, so no Triton kernel compiles and no
    autotune runs inside it (a fresh machine's first engine compiled ~13 s inside the timed run in session 6).
    ``lengths``: (prompt length, max_tokens) per request, the timed workload's prompt lengths (same prefill
    chunks and mixed steps) with short, staggered outputs (decode batches of every size from the full batch
    down). The prompts are fresh random ids (``seed``), never the timed ones, so prefix caching cannot serve
    the timed prompts from this run. Returns its seconds."""
    from octavo import SamplingParams

    rng = random.Random(seed)
    prompts = [{"prompt_token_ids": [rng.randrange(*ids) for _ in range(n_in)]} for n_in, _ in lengths]
    extra = {} if temperature is None else {"temperature": temperature}
    params = [SamplingParams(max_tokens=n_out, ignore_eos=True, **extra) for _, n_out in lengths]
    return gen_timed(llm, prompts, params)[0]


class JitMisses:
    """Counts Triton kernels built (compiled, or loaded from the disk cache) in this process from now on, by
    wrapping ``JITFunction._do_compile`` (called on an in-memory cache miss): a timed region should see none.
    ``since(mark)``: {kernel name: [misses, seconds]} after ``mark = len(self.log)``. ``available`` is False
    where this Triton has no such method (then nothing is counted and the JSON says so)."""

    def __init__(self) -> None:
        import triton.runtime.jit as jit

        self.log: list[tuple[str, float]] = []
        orig = getattr(jit.JITFunction, "_do_compile", None)
        self.available = orig is not None
        if orig is None or getattr(orig, "_octavo_counted", False):
            return
        log = self.log

        def counted(fn_self, *a, **k):
            t = time.perf_counter()
            try:
                return orig(fn_self, *a, **k)
            finally:  # a[0]: Triton's cache key (the argument specialization + options): names the variant
                log.append((getattr(fn_self, "__name__", "?"), time.perf_counter() - t, str(a[0] if a else "")[:600]))

        counted._octavo_counted = True
        jit.JITFunction._do_compile = counted

    def keys_since(self, mark: int) -> list:
        """[kernel name, Triton cache key] of each build after ``mark``: which specialization a warm-up missed."""
        return [[name, key] for name, _sec, key in self.log[mark:]]

    def since(self, mark: int) -> dict | str:
        if not self.available:
            return "not counted (this Triton has no JITFunction._do_compile)"
        out: dict[str, list] = {}
        for name, sec, _key in self.log[mark:]:
            row = out.setdefault(name, [0, 0.0])
            row[0] += 1
            row[1] = round(row[1] + sec, 3)
        return out


def gen_timed(llm, prompts, params) -> tuple[float, list]:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    return time.perf_counter() - t, outs


def nanovllm_workload(seed=0, num=256, lo=100, hi=1024, vocab=151936):
    rng = random.Random(seed)
    reqs = []
    for _ in range(num):
        n_in, n_out = rng.randint(lo, hi), rng.randint(lo, hi)
        reqs.append(([rng.randint(0, 10000) for _ in range(n_in)], n_out))
    return reqs
