"""The serving benchmark client (``octavo bench serve``): latency and throughput of a running server.

Definitions are those of ``vllm bench serve``. Each request streams ``/v1/completions`` with a random
prompt of ``input_len`` token ids and ``max_tokens=output_len, ignore_eos=true``; at most
``concurrency`` requests are in flight (a new one starts when one ends).

- TTFT: from sending the request to the first streamed chunk that carries text.
- ITL: the gaps between successive text-carrying chunks of a request (all requests pooled).
- TPOT: per request, ``(e2e latency - TTFT) / (output tokens - 1)``.
- E2EL: from sending the request to its last chunk.
- Output throughput: all output tokens / wall time of the run; request throughput likewise.

Output tokens are the server's ``usage.completion_tokens`` (``stream_options.include_usage``), or the
number of text-carrying chunks for a server that sends no usage. Works against any OpenAI-compatible
server (octavo, vLLM, llama.cpp's ``llama-server``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_tokens: int = 0
    error: str = ""


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _summary(values: list[float]) -> dict[str, float]:
    out = {"mean": sum(values) / len(values) if values else float("nan")}
    for p in PERCENTILES:
        out[f"p{p}"] = _percentile(values, p)
    return out


def random_prompts(num: int, input_len: int, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Random token-id prompts (distinct, so no prefix-cache hits), ids from the ordinary vocabulary range."""
    rng = random.Random(seed)
    lo, hi = min(1000, vocab_size // 4), vocab_size - 1
    return [[rng.randint(lo, hi) for _ in range(input_len)] for _ in range(num)]


async def _one(client: Any, url: str, model: str, prompt: list[int] | str, output_len: int,
               headers: dict[str, str], ignore_eos: bool = True) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": ignore_eos, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(ok=False, prompt_len=len(prompt))
    start = time.perf_counter()
    last = start
    chunks = 0
    usage_tokens = None
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("error"):
                    res.error = str(msg["error"])
                    return res
                if msg.get("usage") and msg["usage"].get("completion_tokens") is not None:
                    usage_tokens = msg["usage"]["completion_tokens"]
                text = "".join((c.get("text") or "") for c in msg.get("choices") or [])
                if not text:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
                chunks += 1
        if chunks == 0:  # ended at once (EOS first): fine unless EOS was to be ignored
            last = time.perf_counter()
            res.ttft = last - start
        res.e2el = last - start
        res.output_tokens = usage_tokens if usage_tokens is not None else chunks
        res.ok = chunks > 0 or not ignore_eos
        if not res.ok:
            res.error = "no output"
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_level(base_url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int,
                    api_key: str | None = None) -> dict[str, Any]:
    """Send every prompt with at most ``concurrency`` in flight; return the metrics of this level."""
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        async def bounded(p: list[int]) -> RequestResult:
            async with sem:
                return await _one(client, url, model, p, output_len, headers)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(bounded(p) for p in prompts))
        duration = time.perf_counter() - t0
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2el - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "concurrency": concurrency,
        "num_requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": sum(r.prompt_len for r in ok),
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "ttft_ms": {k: v * 1000 for k, v in _summary([r.ttft for r in ok]).items()},
        "tpot_ms": {k: v * 1000 for k, v in _summary(tpot).items()},
        "itl_ms": {k: v * 1000 for k, v in _summary([x for r in ok for x in r.itl]).items()},
        "e2el_ms": {k: v * 1000 for k, v in _summary([r.e2el for r in ok]).items()},
    }


def server_model(base_url: str, api_key: str | None = None) -> tuple[str, int | None]:
    """(model id, max_model_len if the server says) from ``GET /v1/models``."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    data = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=30).json()["data"][0]
    return data["id"], data.get("max_model_len")


def run_benchmark(base_url: str, *, concurrencies: list[int], input_len: int, output_len: int,
                  num_prompts: int | None, vocab_size: int, api_key: str | None = None, seed: int = 0,
                  warmup: int = 2, label: str = "", waves: int = 2) -> dict[str, Any]:
    """All concurrency levels against one server, each with fresh random prompts, after a short warm-up.

    Each level sends ``num_prompts`` requests, or ``waves x concurrency`` when that is not given.
    """
    model, _ = server_model(base_url, api_key)
    levels = []
    asyncio.run(run_level(base_url, model, random_prompts(warmup, input_len, vocab_size, seed + 999),
                          min(output_len, 8), warmup, api_key))
    for i, c in enumerate(concurrencies):
        n = num_prompts or waves * c
        prompts = random_prompts(n, input_len, vocab_size, seed + i)
        level = asyncio.run(run_level(base_url, model, prompts, output_len, c, api_key))
        levels.append(level)
        print(format_level(level, label), flush=True)
    return {"label": label, "base_url": base_url, "model": model, "input_len": input_len,
            "output_len": output_len, "waves": waves, "levels": levels}


def format_level(m: dict[str, Any], label: str = "") -> str:
    return (f"{label:>14} c={m['concurrency']:<3} ok={m['completed']}/{m['num_requests']} "
            f"out={m['output_throughput']:7.1f} tok/s  req={m['request_throughput']:5.2f}/s  "
            f"TTFT p50/p99={m['ttft_ms']['p50']:7.1f}/{m['ttft_ms']['p99']:7.1f} ms  "
            f"TPOT p50/p99={m['tpot_ms']['p50']:6.1f}/{m['tpot_ms']['p99']:6.1f} ms  "
            f"ITL p50/p99={m['itl_ms']['p50']:6.1f}/{m['itl_ms']['p99']:6.1f} ms  "
            f"E2E p50={m['e2el_ms']['p50']:7.0f} ms" + (f"  errors={m['errors']}" if m["failed"] else ""))


def plot(runs: list[dict[str, Any]], path: str) -> bool:
    """Latency percentiles and output throughput against concurrency, one line per server (octavo, the peer).

    Returns False, after saying why on stderr, when matplotlib is missing.
    """
    from octavo.cli.bench_plot import pyplot

    plt = pyplot(path)
    if plt is None:
        return False
    panels = [("output_throughput", "output tokens/s"), ("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"),
              ("itl_ms", "ITL (ms)"), ("e2el_ms", "E2E latency (ms)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (key, title) in zip(axes, panels):
        for i, run in enumerate(runs):  # one colour per server: p50 solid, p99 dotted
            xs = [lv["concurrency"] for lv in run["levels"]]
            if key == "output_throughput":
                ax.plot(xs, [lv[key] for lv in run["levels"]], marker="o", color=f"C{i}", label=run["label"])
            else:
                for p, style in (("p50", "-"), ("p99", ":")):
                    ax.plot(xs, [lv[key][p] for lv in run["levels"]], style, marker="o", color=f"C{i}",
                            label=f"{run['label']} {p}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def to_json(obj: Any) -> str:
    return json.dumps(obj if not hasattr(obj, "__dataclass_fields__") else asdict(obj), indent=2)
