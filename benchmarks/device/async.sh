#!/usr/bin/env bash
# Issue 17 item 1 (engineer "async"): async scheduling on vs off, side by side in ONE engine (modes switched
# while idle, runs interleaved off/on), on one GPU. Kind: nvidia-h100-x1. Hard bound: 58 s (timeout).
#   benchmarks/async_scheduling.py --shape qwen3-0.6b: random-weight Qwen3-0.6B shape, bf16, CUDA graphs;
#   1. nano-vllm-style throughput: 64 requests, prompt/output lengths U[50, 300], ignore_eos, greedy;
#      tok/s off/on, tokens identical?, step timers (host ms per step, overlapped, exposed);
#   2. batch-32 JSON-schema decode step vs unconstrained, off/on (tokenizer: an 8k byte-level BPE trained here,
#      logits stay 151936 wide; needs xgrammar, else part 2 is skipped).
# Writes $OUT/async/async.json + logs. Runs from the repo root. ASYNC_DRY=1: CPU dry run on a tiny shape.
set -u
R="${OUT:-/tmp/out}/async"
mkdir -p "$R"
DRY=${ASYNC_DRY:-0}
START=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1; cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
TOK=/tmp/async_bpe_tok
timeout -k 2 12 python3 - "$TOK" <<'PY' > "$R/tokenizer.log" 2>&1 || echo "async: tokenizer training failed (structured part skipped)"
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
words = "the a of to and in is it name tags score item number value json object array string true false".split()
corpus = [" ".join(words[(i * 7 + j) % len(words)] for j in range(30)) + ' {"name": "x%d", "tags": ["t%d"], '
          '"score": %d.5}' % (i, i, i) for i in range(3000)]
trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>").save_pretrained(sys.argv[1])
print("tokenizer ok")
PY
echo "async: tokenizer $(tail -1 "$R/tokenizer.log") ($(( $(date +%s) - START )) s)"
ARGS=(--shape qwen3-0.6b --dtype bfloat16 --num-requests 64 --in-len 50 300 --out-len 50 300 --repeats 2
      --max-num-seqs 64 --max-model-len 1024)
[ "$DRY" = 1 ] && ARGS=(--shape tiny-qwen3 --device cpu --dtype float32 --num-requests 8 --in-len 8 32
                        --out-len 8 24 --repeats 1 --max-num-seqs 8 --max-model-len 256 --structured-steps 12
                        --kv-cache-memory-bytes 33554432)
SB=32; [ "$DRY" = 1 ] && SB=4
if [ -f "$TOK/tokenizer.json" ] && python3 -c "import xgrammar" 2>/dev/null; then
  ARGS+=(--tokenizer "$TOK" --structured-batch "$SB")
else
  echo "SKIPPED structured part: no tokenizer or no xgrammar" | tee "$R/SKIPPED_structured.txt"
fi
LEFT=$(( 58 - ($(date +%s) - START) ))
echo "== async: benchmarks/async_scheduling.py (cap ${LEFT}s) $(date -u +%T)"
timeout -k 3 "$LEFT" python3 benchmarks/async_scheduling.py "${ARGS[@]}" --json "$R/async.json" > "$R/async.log" 2>&1
echo "exit $?" | tee "$R/exit.txt"
grep -E "throughput async|structured batch|Error|error" "$R/async.log" | tail -16
ls -la "$R"
