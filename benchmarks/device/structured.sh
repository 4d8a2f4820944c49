#!/usr/bin/env bash
# Issue 11 (engineer "structured"): structured-output (JSON schema) decode overhead on one GPU.
# Kind: nvidia-h100-x1. Needs ~150 s (hard caps sum 175 s). Needs xgrammar (the lead installs xgrammar==0.2.8).
# Writes JSON + logs to $OUT/structured/. Runs from the repo root.
#   benchmarks/structured_outputs.py times the engine core's decode steps at batch 1 and 32, three modes
#   interleaved in one process: free (no grammar), overlap (default: bitmasks filled on a host thread while the
#   forward runs) and serial (fill before the step: the executor fallback), greedy, CUDA graphs on.
#   1. real SmolLM2-135M (bf16) if $SMOLLM2_GGUF is set: a tiny model, so host costs weigh the most here;
#   2. a random-weight ~1.1B Llama shape (hidden 2048, 16 layers, GQA 32/8, vocab 49152) with SmolLM2's tokenizer
#      if $SMOLLM2_GGUF is set, else with a small byte-level BPE tokenizer trained here (8k tokens; logits still
#      49152 wide): random weights, so the grammar, not the model, decides where the JSON goes.
set -u
[ "${STRUCTURED_DRY:-0}" = 1 ] || pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "structured: pip install -e . failed (continuing)"
R="${OUT:-/tmp/out}/structured"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
python3 -c "import xgrammar, importlib.metadata as m; print('xgrammar', m.version('xgrammar'))" 2>&1 | tee "$R/xgrammar.txt"
if ! python3 -c "import xgrammar" 2>/dev/null; then
  echo "SKIPPED: xgrammar is not installed on the device (needs xgrammar==0.2.8)" | tee "$R/SKIPPED.txt"
  exit 0
fi

step() {  # step NAME CAP_S CMD...: one bounded run, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== structured: $name (cap ${cap}s) $(date -u +%T)"
  timeout -k 5 "$cap" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$R/exits.txt"
  grep -E 'steps, median|overhead_pct|exposed|Error|error' "$R/$name.log" | tail -14
}

D=/tmp/structured_llama1b
# STRUCTURED_DRY=1: a CPU dry run of this script (tiny shape, few steps), as done before queueing it
DRY=${STRUCTURED_DRY:-0}
python3 - "$DRY" <<'PY'
import os, sys, transformers as T
d = "/tmp/structured_llama1b"
dry = sys.argv[1] == "1"
T.LlamaConfig(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=64 if dry else 2048,
              intermediate_size=128 if dry else 8192, num_hidden_layers=2 if dry else 16,
              num_attention_heads=4 if dry else 32, num_key_value_heads=2 if dry else 8, max_position_embeddings=4096,
              rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=1,
              eos_token_id=2).save_pretrained(d)
if not os.environ.get("SMOLLM2_GGUF"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = ("the a of to and in is it name tags score item number value json object array string true false null "
             "describe with as for on that this are be was were".split())
    corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) + ' {"name": "x%d", "tags": ["t%d"], '
              '"score": %d.5}' % (i, i, i) for i in range(4000)]
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fast.save_pretrained(d)
    print("trained an 8k byte-level BPE tokenizer (SMOLLM2_GGUF unset)")
PY

COMMON=(--batches 1 32 --steps 32 --repeats 3 --device cuda --dtype bfloat16 --skip-compile)
[ "$DRY" = 1 ] && COMMON=(--batches 1 4 --steps 4 --repeats 1 --device cpu --dtype float32 --skip-compile)
if [ -n "${SMOLLM2_GGUF:-}" ] && [ -f "$SMOLLM2_GGUF" ]; then
  echo "structured: real SmolLM2 at $SMOLLM2_GGUF"
  step smollm2 75 python3 benchmarks/structured_outputs.py "${COMMON[@]}" --model "$SMOLLM2_GGUF" \
       --quantization none --json "$R/smollm2.json"
  TOK=(--tokenizer "$SMOLLM2_GGUF")
else
  echo "SKIPPED real weights: SMOLLM2_GGUF unset" | tee "$R/SKIPPED_real_weights.txt"
  TOK=()
fi
step llama1b_dummy 100 python3 benchmarks/structured_outputs.py "${COMMON[@]}" --model "$D" --load-format dummy \
     ${TOK[@]+"${TOK[@]}"} --json "$R/llama1b_dummy.json"
ls -la "$R"
