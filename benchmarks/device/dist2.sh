#!/usr/bin/env bash
# Issue 12 (engineer "dist", session 4): tensor parallelism with async scheduling through the mp executor.
# NEEDS BOTH GPUs (2x H100 or 2x H200), runs alone; <= 120 s in all (every step has a hard cap). Runs from the
# repo root; JSON + logs to $OUT/dist2/. Dummy-weight Llama-3-8B shape, bf16; no real weights needed.
# NVLink multicast stays off: this script neither sets nor unsets NCCL_NVLS_ENABLE / TORCH_SYMM_MEM_DISABLE_MULTICAST
# (the machine sets them); it only records their values.
#  part 1 (batch 1): TP=2 (mp, NCCL) and TP=1 (uni), one engine each started with async scheduling and switched
#     off/on while idle: batch-1 decode ms/token per mode, the captured batch-1 decode graph replayed alone on every
#     rank (the device time of a token), 256 x 512/128 throughput per mode, step timers.
#  part 2 (DIST2_PART=2, ~70 s): the in-step all-reduce A/B under async scheduling: TP=2 NCCL vs TP=2 symm_mem
#     (one-shot, no multicast), batch-1 ms/token and the decode graph replayed alone on every rank; the NCCL engine
#     also runs sync then async (greedy tokens must agree across the modes on the GPU).
#     Batch 1 (2x H100, 20:47 UTC): graph replay TP=2 3.74 ms vs TP=1 5.38 ms -> ~1.05 ms/token of all-reduce.
#  part 3 (DIST2_PART=3, ~115 s): the issue's 512 x 1000/1000 throughput at TP=2 with async scheduling (TP=1 of the
#     same workload: the lead's e2e_8b.sh in the same batch, one GPU of this machine).
set -u
cd "$(dirname "$0")/../.."
R="${OUT:-/tmp/out}/dist2"
mkdir -p "$R"
PART="${DIST2_PART:-2}"  # batch 1 ran part 1; batch 2 runs part 2 (and 3 if the lead has room)
git rev-parse HEAD > "$R/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpus.csv" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__, torch.cuda.device_count())" \
  > "$R/versions.txt" 2>&1
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-<unset>} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST-<unset>}" \
  > "$R/env.txt"
cat "$R/gpus.csv" "$R/versions.txt" "$R/env.txt"

step() {  # step NAME CAP_S ENV... -- CMD...: run one bounded config, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== dist2: $name (cap ${cap}s) $(date -u +%T)"
  timeout -k 3 "$cap" env "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$R/exits.txt"
  grep -v " INFO " "$R/$name.log" | grep -v "^\[transformers\]" | tail -3 | cut -c1-600
  sleep 1  # a killed run's worker processes exit within ~1 s (orphan check) and free their GPUs
}

TP="python3 benchmarks/gpu_tp.py --shape 8b --copy-rate 3.01e12 --out-dir $R"
if [[ $PART == *1* ]]; then
  step 8b_tp2_async 58 $TP --one 2 --async-modes off on --graph-replay --prompts 256 --in-len 512 --out-len 128 \
    --max-num-seqs 256
  step 8b_tp1_async 58 $TP --one 1 --async-modes off on --graph-replay --prompts 256 --in-len 512 --out-len 128 \
    --max-num-seqs 256
fi
if [[ $PART == *2* ]]; then
  step 8b_tp2_nccl_b 38 $TP --one 2 --tag nccl_b --async-modes off on --graph-replay --prompts 0 --max-num-seqs 8
  step 8b_tp2_symm_b 34 OCTAVO_TP_ALLREDUCE=symm_mem $TP --one 2 --tag symm_b --async-modes on --graph-replay \
    --prompts 0 --max-num-seqs 8
fi
if [[ $PART == *3* ]]; then
  step 8b_tp2_512x1000 118 $TP --one 2 --tag goal --async-modes on --prompts 512 --in-len 1000 --out-len 1000 \
    --max-num-seqs 512
fi

python3 - "$R" <<'PY'
import glob, json, os, sys
r = sys.argv[1]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in sorted(glob.glob(f"{r}/8b_tp*.json"))}
summary = {"runs": runs}
t1, t2 = runs.get("8b_tp1", {}), runs.get("8b_tp2", {})
for mode in ("off", "on"):
    k = f"decode_bs1_ms_per_token_async_{mode}"
    if k in t1 and k in t2:
        summary[f"bs1_tp2_over_tp1_async_{mode}"] = t2[k] / t1[k]
    k = f"throughput_tok_s_async_{mode}"
    if k in t1 and k in t2:
        summary[f"throughput_tp2_over_tp1_async_{mode}"] = t2[k] / t1[k]
if "decode_bs1_ms_per_token_async_on" in t2 and "decode_bs1_ms_per_token_async_off" in t1:
    summary["bs1_tp2_async_on_over_tp1_async_off"] = (t2["decode_bs1_ms_per_token_async_on"]
                                                     / t1["decode_bs1_ms_per_token_async_off"])
nb, sb = runs.get("8b_tp2_nccl_b", {}), runs.get("8b_tp2_symm_b", {})
k = "decode_bs1_ms_per_token_async_on"
if k in nb and k in sb:
    summary["bs1_async_symm_over_nccl"] = sb[k] / nb[k]
if nb.get("graph_replay_bs1_ms_by_rank") and sb.get("graph_replay_bs1_ms_by_rank"):
    summary["graph_replay_symm_over_nccl"] = max(sb["graph_replay_bs1_ms_by_rank"]) / max(nb["graph_replay_bs1_ms_by_rank"])
json.dump(summary, open(f"{r}/summary.json", "w"), indent=1)
print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=1))
PY
