"""The engine-settings half of issue 16's rule, proven by behaviour: every ``OctavoSettings`` field either
changes what an engine does (two engines that differ only in it behave differently) or is refused naming it.

Engines here run a tiny random-weight Llama with SmolLM2's tokenizer (a build takes ~0.2 s once torch is
imported), so each check builds the engines it needs. Settings whose effect needs another process, a GPU,
images or a server are proven by a named behavioural test elsewhere (``ELSEWHERE``: the test checks that each
named test exists). ``test_every_setting_has_evidence`` fails when a new setting has neither.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import transformers as T

from octavo import LLM, SamplingParams
from octavo.config import FIELD_SECTION
from octavo.testing.model import randomize_

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils import smollm2_safetensors_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CFG = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2)
G = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = "The capital of France is"
BASE = dict(dtype="float32", kv_cache_memory_bytes=8 << 20, max_model_len=256)


def _save(path: Path, seed: int) -> str:
    torch.manual_seed(seed)
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **CFG)).float()
    randomize_(model, seed=seed)
    model.save_pretrained(path)
    src = smollm2_safetensors_dir("float32")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(src / name, path / name)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    return {"a": _save(root / "a", 0), "b": _save(root / "b", 1), "root": root}


def build(tiny, **kw) -> LLM:
    return LLM(kw.pop("model", tiny["a"]), **{**BASE, **kw})


def tokens(llm: LLM, prompt=PROMPT, params=G) -> list[int]:
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids


def info(tiny, **kw):
    llm = build(tiny, **kw)
    try:
        return llm.llm_engine.model_info
    finally:
        llm.llm_engine.shutdown()


def differs(tiny, name, a, b, observe) -> None:
    """Two engines differing only in setting ``name`` observe differently."""
    seen = []
    for value in (a, b):
        llm = build(tiny, **{name: value})
        try:
            seen.append(observe(llm))
        finally:
            llm.llm_engine.shutdown()
    assert seen[0] != seen[1], f"{name}={a!r} and {name}={b!r} behave the same: {seen[0]!r}"


def refused(tiny, name, value, match: str | None = None, **kw) -> None:
    """Building with ``name=value`` fails with an error naming the setting (or ``match``, its words)."""
    with pytest.raises((ValueError, TypeError, RuntimeError)) as e:
        build(tiny, **{name: value}, **kw).llm_engine.shutdown()
    text = str(e.value)
    assert name in text or name.replace("_", "-") in text or (match and match in text), text


def _tokenizer_dir(tiny) -> str:
    d = tiny["root"] / "tok"
    if not d.exists():
        tok = T.AutoTokenizer.from_pretrained(tiny["a"])
        tok.add_tokens(["<capital-of>"])
        tok.save_pretrained(d)
    return str(d)


def _gen_config_dir(tiny) -> str:
    d = tiny["root"] / "genconf"
    d.mkdir(exist_ok=True)
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_k": 7}))
    return str(d)


def _steps_until_first_token(llm: LLM, prompt_len: int = 40) -> int:
    engine = llm.llm_engine
    engine.add_request("s", {"prompt_token_ids": list(range(100, 100 + prompt_len))}, G)
    steps = 0
    while True:
        steps += 1
        outs = engine.step()
        if any(o.outputs[0].token_ids for o in outs):
            engine.abort_request("s")
            return steps


def _running_after_one_step(llm: LLM) -> int:
    llm.enqueue([f"prompt {i}" for i in range(3)], G)
    llm.llm_engine.step()
    running = llm.llm_engine.get_stats().num_running_reqs
    llm.wait_for_completion(use_tqdm=False)
    return running


def _prefix_hits(llm: LLM) -> int:
    long = "one two three four five six seven eight nine ten " * 4
    tokens(llm, long)
    tokens(llm, long)
    return round(llm.llm_engine.get_stats().prefix_cache_hit_rate, 3)


CHECKS = {
    "model": lambda t: differs(t, "model", t["a"], t["b"], tokens),
    "tokenizer": lambda t: differs(t, "tokenizer", None, _tokenizer_dir(t),
                                   lambda llm: llm.get_tokenizer().encode("<capital-of>")),
    "served_model_name": lambda t: differs(t, "served_model_name", None, ["x", "y"],
                                           lambda llm: llm.llm_engine.model_info.served_model_name),
    "dtype": lambda t: differs(t, "dtype", "float32", "bfloat16", lambda llm: llm.llm_engine.model_info.dtype),
    "max_model_len": lambda t: differs(t, "max_model_len", 128, 256,
                                       lambda llm: llm.llm_engine.model_info.max_model_len),
    "load_format": lambda t: differs(t, "load_format", "auto", "dummy", tokens),
    "skip_tokenizer_init": lambda t: differs(t, "skip_tokenizer_init", False, True,
                                             lambda llm: llm.get_tokenizer() is None),
    "revision": lambda t: refused(t, "revision", "main"),
    "download_dir": lambda t: refused(t, "download_dir", str(t["root"])),
    "task": lambda t: differs(t, "task", "generate", "embed", lambda llm: llm.llm_engine.model_info.is_pooling),
    "runner": lambda t: differs(t, "runner", "generate", "pooling", lambda llm: llm.llm_engine.model_info.is_pooling),
    "seed": lambda t: differs(t, "seed", 0, 1, lambda llm: tokens(llm, params=SamplingParams(max_tokens=8))),
    "quantization": lambda t: differs(t, "quantization", None, "int8",
                                      lambda llm: llm.llm_engine.model_info.quantization),
    "chat_template": lambda t: differs(t, "chat_template", None, "{% for m in messages %}<<{{ m.content }}>>{% endfor %}",
                                       lambda llm: llm.llm_engine.render_chat([{"role": "user", "content": "hi"}])[0]),
    "hf_overrides": lambda t: differs(t, "hf_overrides", {}, {"rms_norm_eps": 0.5}, tokens),
    "generation_config": lambda t: differs(t, "generation_config", "auto", _gen_config_dir(t),
                                           lambda llm: llm.get_default_sampling_params().top_k),
    "enable_sleep_mode": lambda t: differs(t, "enable_sleep_mode", False, True, _can_sleep),
    "device": lambda t: refused(t, "device", "cuda") if not torch.cuda.is_available() else None,
    "attention_backend": lambda t: refused(t, "attention_backend", "no_such_backend"),
    "num_threads": lambda t: differs(t, "num_threads", 1, 2, lambda llm: torch.get_num_threads()),
    "block_size": lambda t: differs(t, "block_size", 16, 32, lambda llm: llm.llm_engine.model_info.block_size),
    "enable_prefix_caching": lambda t: differs(t, "enable_prefix_caching", False, True, _prefix_hits),
    "kv_cache_memory_bytes": lambda t: differs(t, "kv_cache_memory_bytes", 4 << 20, 8 << 20,
                                               lambda llm: llm.llm_engine.model_info.num_kv_blocks),
    "num_gpu_blocks_override": lambda t: differs(t, "num_gpu_blocks_override", None, 40,
                                                 lambda llm: llm.llm_engine.model_info.num_kv_blocks),
    "kv_cache_dtype": lambda t: differs(t, "kv_cache_dtype", "auto", "bfloat16",
                                        lambda llm: str(llm.collective_rpc(lambda w: w.kv_caches[0].dtype)[0])),
    "max_num_seqs": lambda t: differs(t, "max_num_seqs", 1, 3, _running_after_one_step),
    "max_num_batched_tokens": lambda t: differs(t, "max_num_batched_tokens", 16, 64, _steps_until_first_token),
    "enable_chunked_prefill": lambda t: refused(t, "enable_chunked_prefill", False, max_num_batched_tokens=16,
                                                match="chunked prefill"),
    "scheduling_policy": lambda t: differs(t, "scheduling_policy", "fcfs", "priority", _priority_accepted),
    "max_logprobs": lambda t: differs(t, "max_logprobs", 2, 20, _logprobs_5_accepted),
    "kv_admission": lambda t: _kv_admission(t),
    "structured_outputs_backend": lambda t: refused(t, "structured_outputs_backend", "no_such_backend",
                                                    match="structured output backend"),
    "speculative_config": lambda t: differs(t, "speculative_config", None,
                                            {"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_max": 2, "prompt_lookup_min": 1},
                                            lambda llm: llm.llm_engine.core.spec is not None),
    "lora_dtype": lambda t: _lora_dtype(t),
    "gpu_memory_utilization": lambda t: refused(t, "gpu_memory_utilization", 0.5, kv_cache_memory_bytes=None)
    if not torch.cuda.is_available() else None,
    "enable_lora": lambda t: differs(t, "enable_lora", False, True, lambda llm: llm.llm_engine.core.settings.lora
                                     .enable_lora and llm.collective_rpc(lambda w: w.runner.lora is not None)[0]),
}


def _lora_dtype(t) -> None:
    seen = []
    for dtype in ("auto", "bfloat16"):
        llm = build(t, enable_lora=True, lora_dtype=dtype)
        seen.append(str(llm.collective_rpc(lambda w: w.runner.lora.dtype)[0]))
        llm.llm_engine.shutdown()
    assert seen == ["torch.float32", "torch.bfloat16"], seen


def _can_sleep(llm: LLM) -> bool:
    try:
        llm.sleep(1)
    except ValueError:
        return False
    llm.wake_up()
    return True


def _kv_admission(t) -> None:
    """4 x (20 + 40) tokens in 11 blocks of 16 (176 tokens): greedy admits all four and preempts when they
    grow; projected admits two at a time and never preempts."""
    seen = {}
    for mode in ("greedy", "projected"):
        llm = build(t, kv_admission=mode, num_gpu_blocks_override=12, enable_prefix_caching=False)
        try:
            params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
            outs = llm.generate([{"prompt_token_ids": list(range(100 + i, 120 + i))} for i in range(4)], params,
                                use_tqdm=False)
            assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
            seen[mode] = llm.llm_engine.get_stats().num_preemptions
        finally:
            llm.llm_engine.shutdown()
    assert seen["greedy"] > 0 and seen["projected"] == 0, seen


def _priority_accepted(llm: LLM) -> bool:
    try:
        llm.generate([PROMPT], G, use_tqdm=False, priority=[1])
    except ValueError:
        return False
    return True


def _logprobs_5_accepted(llm: LLM) -> bool:
    try:
        tokens(llm, params=SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    except ValueError:
        return False
    return True


# Proven by a behavioural test elsewhere: it needs several processes, a GPU, images, adapters or a server.
ELSEWHERE = {
    "trust_remote_code": "PERMISSION: remote code never runs; a model needing it fails naming its architecture",
    "limit_mm_per_prompt": "tests/multimodal/test_llava.py",
    "async_scheduling": "tests/e2e/test_async_scheduling.py",  # tokens identical on vs off; refusals
    "kv_admission_ratio": "tests/unit/test_kv_admission.py",  # early-stopping requests' share, through settings
    "kv_admission_ratio_after_preemption": "tests/unit/test_kv_admission.py",
    "kv_admission_overcommit": "tests/unit/test_kv_admission.py",
    "kv_admission_pacing": "tests/unit/test_kv_pacing.py",
    "allowed_media_domains": "tests/multimodal/test_media_fetch.py",
    "media_fetch_timeout": "tests/multimodal/test_llava_server.py",
    "media_max_bytes": "tests/multimodal/test_llava_server.py",
    "enforce_eager": "tests/gpu/parity.py",
    "tensor_parallel_size": "tests/distributed/test_tensor_parallel.py",
    "pipeline_parallel_size": "tests/distributed/test_pipeline_parallel.py",
    "data_parallel_size": "tests/distributed/test_data_parallel.py",
    "enable_expert_parallel": "tests/distributed/test_expert_parallel.py",
    "distributed_executor_backend": "tests/distributed/test_tensor_parallel.py",
    "max_loras": "tests/lora/test_lora_llama.py",
    "max_lora_rank": "tests/lora/test_lora_llama.py",
    "max_cpu_loras": "tests/lora/test_lora_llama.py",
    "lora_modules": "tests/lora/test_lora_serve.py",
    # server settings: a real `octavo serve` shows each
    "host": "sdk/cli/serve.py::host=srv.host",  # static: no test binds another address
    "port": "sdk/server/launch.py::--port",  # every server test binds a free port
    "api_key": "tests/e2e/test_server.py",
    "max_queue_len": "tests/e2e/test_server_faults.py", "uvicorn_log_level": "tests/e2e/test_server.py",
    "disable_frontend_multiprocessing": "tests/e2e/test_ui_routes.py",
    "enable_auto_tool_choice": "tests/structured/test_server.py", "tool_call_parser": "tests/structured/test_server.py",
    "reasoning_parser": "tests/structured/test_parsers.py",
    "trust_request_chat_template": "tests/reliability/test_soak.py",
    "max_request_body_bytes": "tests/reliability/test_hostile.py::413",
    "shutdown_timeout": "tests/reliability/test_shutdown.py", "disable_ui": "tests/e2e/test_ui_routes.py",
    "root_path": "tests/e2e/test_vllm_api.py", "allowed_origins": "tests/e2e/test_vllm_api.py",
    "ssl_keyfile": "tests/e2e/test_vllm_server.py", "ssl_certfile": "tests/e2e/test_vllm_server.py",
    "ssl_ca_certs": "sdk/server/vllm_server.py:check_server_settings (refused without a file)",
    "ssl_cert_reqs": "sdk/server/vllm_server.py:check_server_settings (refused without ssl_ca_certs)",
    "enable_request_id_headers": "tests/e2e/test_vllm_server.py", "enable_log_requests": "tests/e2e/test_vllm_server.py",
    "max_log_len": "tests/e2e/test_vllm_server.py", "disable_log_requests": "tests/unit/test_vllm_server_flags.py",
    "disable_log_stats": "tests/unit/test_vllm_server_flags.py",
    "disable_uvicorn_access_log": "tests/unit/test_vllm_server_flags.py",
}


def test_every_setting_has_evidence():
    missing = sorted(set(FIELD_SECTION) - set(CHECKS) - set(ELSEWHERE))
    assert not missing, f"settings with no behavioural check (add one to CHECKS or ELSEWHERE): {missing}"
    for name, where in ELSEWHERE.items():
        path, _, pattern = where.partition("::")  # "path::text" when the test shows it by its effect (413)
        path = path.split(":")[0]
        if not where.startswith("PERMISSION"):
            assert (REPO / path).is_file(), f"{name}: {path} does not exist"
            pattern = re.escape(pattern) if pattern else rf"\b{name}\b|--{name.replace('_', '-')}\b"
            assert re.search(pattern, (REPO / path).read_text()), f"{name}: {path} never mentions it"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_setting_changes_behaviour_or_is_refused(tiny, name):
    CHECKS[name](tiny)
