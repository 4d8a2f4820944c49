#!/usr/bin/env bash
# Issue 10 (engineer "spec"): speculative decoding on one GPU. Kind: nvidia-h100-x1. Needs ~200 s (hard caps sum 230 s).
#   0. tests/spec_decode/test_spec_gpu.py: verify steps captured as CUDA graphs and replayed; greedy output with
#      speculation + graphs equal to eager decoding without speculation (fp32 tiny Llama; ngram, mlp_speculator).
# Writes JSON + logs to $OUT/spec/. Runs from the repo root.
#   With $SMOLLM2_GGUF (real SmolLM2-135M-Instruct, dequantized to bf16; CUDA graphs on, the default):
#     1. batch-1 and batch-64 output tok/s, same process, engines alternating: no speculation vs ngram (k=4,
#        input-grounded chat prompts: "repeat / correct this text") vs draft_model (SmolLM2 drafting for itself:
#        every greedy draft accepted, so it shows the path's cost, not a real draft's gain). Batch 64 runs with the
#        default policy (disable_by_batch_size=8: speculation off), so it shows what the policy costs.
#     2. mlp_speculator with a RANDOM head at SmolLM2's shape (no trained head exists for it): acceptance ~0, so
#        it shows the head path's overhead on the GPU, not a speedup.
#   Without it: the same on a random-weight model of SmolLM2's shape (load_format=dummy, token prompts that repeat
#   a span) — acceptance there is NOT meaningful (random logits), only the cost of the speculative path is.
# Verify steps (k+1 tokens per request, same k for every request) replay CUDA graphs at batch sizes 1/2/4
# (plugins/platforms/cuda_verify_graphs.py); the JSON's graph_replays_verify counts them.
set -u
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "spec: pip install -e . failed (continuing)"
R="${OUT:-/tmp/out}/spec"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null

step() {  # step NAME CAP_S CMD...: one bounded run, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== spec: $name (cap ${cap}s) $(date -u +%T)"
  timeout -k 5 "$cap" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$R/exits.txt"
  grep -E '^\{|engines loaded|Error|error' "$R/$name.log" | tail -6
}

step gpu_tests 50 python3 -m pytest -q -s tests/spec_decode/test_spec_gpu.py -p no:cacheprovider
grep -E "verify replays|passed|failed|Error" "$R/gpu_tests.log" | tail -5

KV='"kv_cache_memory_bytes": 2147483648'  # explicit KV size: several engines share the card
NGRAM='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
HEAD_DIR=/tmp/spec_mlp_head
python3 - <<'EOF' || echo "spec: could not write the random MLP-speculator head"
from tests.spec_decode.head_checkpoints import write_mlp_speculator
write_mlp_speculator("/tmp/spec_mlp_head", n_predict=3, tie_weights=True, seed=0, vocab_size=49152, emb_dim=576)
EOF
MLP="{\"method\": \"mlp_speculator\", \"model\": \"$HEAD_DIR\", \"num_speculative_tokens\": 3}"

if [ -n "${SMOLLM2_GGUF:-}" ] && [ -f "$SMOLLM2_GGUF" ]; then
  echo "spec: real SmolLM2 at $SMOLLM2_GGUF"
  DRAFT="{\"method\": \"draft_model\", \"model\": \"$SMOLLM2_GGUF\", \"quantization\": \"none\", \"num_speculative_tokens\": 4}"
  # token-id prompts (the chat workload pre-tokenized here): the device's transformers failed to build the GGUF
  # tokenizer in the 14:05 run, and no tokenizer is needed to measure decoding
  COMMON=(--model "$SMOLLM2_GGUF" --dtype bfloat16 --max-tokens 64 --batch1-prompts 4 --repeats 2
          --prompt-file benchmarks/data/spec_decode_smollm2_prompts.json
          --llm-kwargs "{\"quantization\": \"none\", \"skip_tokenizer_init\": true, $KV}")
  step smollm2_ngram_draft 140 python3 benchmarks/spec_decode.py "${COMMON[@]}" --batch-sizes 1,64 \
       --speculative-config "[$NGRAM, $DRAFT]" --out "$R/smollm2_ngram_draft.json"
  step smollm2_mlp_random_head 40 python3 benchmarks/spec_decode.py "${COMMON[@]}" --batch-sizes 1 --repeats 1 \
       --speculative-config "$MLP" --out "$R/smollm2_mlp_random_head.json"
else
  echo "spec: SMOLLM2_GGUF unset: random-weight SmolLM2-shape model; acceptance is NOT meaningful"
  echo "SKIPPED real weights: SMOLLM2_GGUF unset" > "$R/SKIPPED_real_weights.txt"
  D=/tmp/spec_dummy_smollm2
  python3 - <<'EOF'
import transformers as T
T.LlamaConfig(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576, intermediate_size=1536,
              num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
              rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True).save_pretrained("/tmp/spec_dummy_smollm2")
EOF
  DRAFT="{\"method\": \"draft_model\", \"model\": \"$D\", \"num_speculative_tokens\": 4}"
  COMMON=(--model "$D" --dtype bfloat16 --max-tokens 64 --batch1-prompts 4 --repeats 2 --token-prompts
          --llm-kwargs "{\"load_format\": \"dummy\", \"skip_tokenizer_init\": true, $KV}")
  step dummy_ngram_draft 140 python3 benchmarks/spec_decode.py "${COMMON[@]}" --batch-sizes 1,64 \
       --speculative-config "[$NGRAM, $DRAFT]" --out "$R/dummy_ngram_draft.json"
  step dummy_mlp_random_head 40 python3 benchmarks/spec_decode.py "${COMMON[@]}" --batch-sizes 1 --repeats 1 \
       --speculative-config "$MLP" --out "$R/dummy_mlp_random_head.json"
fi
ls -la "$R"
