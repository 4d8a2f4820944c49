#!/usr/bin/env bash
# Issue 11 (engineer "structured"): JSON-schema decode overhead on one GPU. Kind: nvidia-h100-x1 (one lane).
# HARD bound 72 s (every step under `timeout`, the last one gets what is left). Needs xgrammar (0.2.8).
# SmolLM2's tokenizer comes from benchmarks/device/smollm2_tokenizer.json.xz (so the grammar's masks are the
# embedded model's). Writes JSON + logs to $OUT/structured/. Runs from the repo root.
#   1. benchmarks/structured_outputs.py on a random-weight ~1.1B Llama shape (hidden 2048, 16 layers, vocab
#      49152) at batch 32 and 1 (issue 11's goal: JSON-schema step <= 1.05x the unconstrained one at 32):
#      free (sync), free_async / json_async (async scheduling, the CUDA default, switched on in the same
#      engine: session 6's loop: sampling parked on the grammar gate, N+2 launched between update(N) and N's
#      outputs, N+1's fill on the bitmask thread from 8 rows), free_async_old / json_async_old (session 5's loop,
#      the same engine), json_async_noearlyfill (fill inline when the gate opens), free_async_wait /
#      json_async_wait (core thread waits until N+2 is queued, batch 1's default); modes interleaved; per-part
#      host ms (fill, apply, accept, release, hand-off lags, the core thread's own work and its slack).
#      Session 7: records each thread's CPU ms per step (*_thread_cpu_ms_per_step); batch 1 ran json_async with a
#      0.2 ms GIL switch interval while structured steps are in flight vs json_async_noswitch (worse: now off by
#      default); batch 2 runs json_async (default: no switch, xgrammar's terminated flag kept in Python),
#      json_async_nostartwait (no 1 ms wait for the bitmask thread), json_async_sw{200,1000,50}us, json_async_old.
#      Session 8: batch 1 ran json_async vs free_async, json_async_nt8 (one fill call on xgrammar's own 8
#      threads: slower), then stack-sampled runs; batch 2 (default now): json_async (the device reads the pinned
#      rows itself: grammar_step.HOST_READ_APPLY) vs json_async_copy (copy first, session 7) and one
#      stack-sampled json_async run; STRUCTURED_MODES=... picks modes.
#   2. the same on the SmolLM2-135M shape (hidden 576, 30 layers, 9/3 heads: the embedded model's config),
#      random weights. (The 8B body's goal is met: sessions 6-7 within +-0.4%; no longer run.)
#   3. (first; STRUCTURED_APPLY_TEST=0 skips) tests/structured/test_apply_device.py (Triton and table apply == host path; session 7: the fill buffer is
#      pinned through the platform's capability once the runner applied on the device).
#   4. STRUCTURED_FILL=1: benchmarks/structured_fill.py on the device's CPU (no model): 32-row fill by threading.
# The real SmolLM2 GGUF cannot travel to the device (carry limit), so only random weights run there.
# STRUCTURED_DRY=1: a CPU dry run (tiny shapes, few steps).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/structured"
mkdir -p "$R"
DRY=${STRUCTURED_DRY:-0}
X=1; [ "$DRY" = 1 ] && X=20  # the dry run's CPU (2 loaded cores) imports torch + xgrammar in ~40 s
LIMIT=$(( 72 * X ))
left() { echo $(( LIMIT - SECONDS )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
# (no import here: importing xgrammar takes seconds; the benchmark imports it anyway)
if ! timeout 10 python3 -c "import importlib.util as u, importlib.metadata as m; assert u.find_spec('xgrammar'); \
print('xgrammar', m.version('xgrammar'))" 2>&1 | tee "$R/xgrammar.txt" | grep -q '^xgrammar'; then
  echo "SKIPPED: xgrammar is not installed on the device (needs xgrammar==0.2.8)" | tee "$R/SKIPPED.txt"
  exit 0
fi

step() {  # step NAME CAP_S CMD...: one bounded run, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== structured: $name (cap ${cap}s, ${SECONDS}s used) $(date -u +%T)"
  timeout -k 2 "$cap" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$R/exits.txt"
  grep -E 'steps, median|overhead_pct|exposed_pct|batch_t|pool_t|engine_t|slowest|apply host|serial |GIL|passed|failed|Error|error' "$R/$name.log" | tail -40
}

# model dirs: config.json written directly (no transformers import), SmolLM2's tokenizer unpacked next to it
timeout 10 python3 - "$DRY" <<'PY'
import json, lzma, os, sys
dry = sys.argv[1] == "1"
tok = lzma.open("benchmarks/device/smollm2_tokenizer.json.xz").read()
tcfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
shapes = {"llama1b": (2048, 8192, 16, 32, 8), "smol135m": (576, 1536, 30, 9, 3), "llama8b": (4096, 14336, 32, 32, 8)}
for name, (h, i, layers, heads, kv) in shapes.items():
    if dry:
        h, i, layers, heads, kv = 64, 128, 2, 4, 2
    d = f"/tmp/structured_{name}"
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": h,
           "intermediate_size": i, "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv, "head_dim": h // heads, "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}
    json.dump(cfg, open(f"{d}/config.json", "w"))
    open(f"{d}/tokenizer.json", "wb").write(tok)
    json.dump(tcfg, open(f"{d}/tokenizer_config.json", "w"))
print("model dirs ready")
PY

COMMON=(--batches 32 1 --steps 24 --repeats 2 --device cuda --dtype bfloat16 --skip-compile --async-modes off on
        --show-outputs 2)
[ "$DRY" = 1 ] && COMMON=(--batches 4 1 --steps 4 --repeats 1 --device cpu --dtype float32 --skip-compile
                          --async-modes off on --show-outputs 2)
# session 8: json_async (the default loop) vs free_async on both shapes; then one untimed run of each under the
# wall-clock stack sampler (benchmarks/stack_sampler.py: what the core / runner / bitmask threads do per step)
MODES=(--modes ${STRUCTURED_MODES:-json_async json_async_copy})
SAMPLE=(--stack-sample json_async)
FILL=(--rows 32 --steps 24 --threads 1 --pool-threads --engine-threads 1 2 4 8 --forms cap16_regex --repeats 1)
[ "$DRY" = 1 ] && FILL=(--rows 8 --steps 4 --threads 1 --pool-threads --engine-threads 1 2 --forms cap16_regex --repeats 1)
if [ "${STRUCTURED_APPLY_TEST:-1}" = 1 ] && [ "$DRY" != 1 ] && [ "$(left)" -ge 16 ]; then
  step apply_test 14 python3 -m pytest -q -p no:cacheprovider tests/structured/test_apply_device.py
fi
step llama1b $(( 30 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${MODES[@]}" "${SAMPLE[@]}" \
     --load-format dummy --model /tmp/structured_llama1b --json "$R/llama1b_dummy.json"
step smol135m $(( $(left) - 2 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${MODES[@]}" "${SAMPLE[@]}" \
     --batches 32 --load-format dummy --model /tmp/structured_smol135m --json "$R/smol135m_dummy.json"
if [ "${STRUCTURED_FILL:-0}" = 1 ] && [ "$(left)" -ge $(( 6 * X )) ]; then  # measured in session 5 batch 1
  step fill "$(( $(left) - 1 ))" python3 benchmarks/structured_fill.py --tokenizer /tmp/structured_smol135m "${FILL[@]}" \
       --json "$R/fill.json"
fi
echo "structured done in ${SECONDS}s"
ls -la "$R"
