#!/usr/bin/env bash
# Issue 12 (engineer "dist"): tensor parallelism on H100s. Kind: nvidia-h100-x4. Runs from the repo root; JSON + logs
# to $OUT/dist/. Every step has a hard cap. Two parts (DIST_PARTS, default "2"; part 1 ran at 14:15 UTC,
# results in benchmarks/results/gpu_tp_h100x4.json):
#  part 1 (~200 s, caps 365 s): all-reduce micro-benchmark on 2 GPUs (NCCL vs one-shot symmetric memory, eager and
#     in a CUDA graph, correctness) + copy rate; Llama-3-8B shape dummy bf16 TP=1 (uni), TP=1 through mp, TP=2 NCCL,
#     TP=2 symm_mem (batch-1 decode; 256 x 512/128 throughput for TP=1/TP=2); Llama-3-70B TP=4 decode vs roofline.
#  part 2 (~170 s, caps 265 s): is symm_mem's per-call win (9.7 vs 17.2 us) visible end to end? The all-reduce
#     micro-benchmark on 4 GPUs; 8B TP=2 NCCL vs symm_mem again (a second A/B pair); 70B TP=4 NCCL vs symm_mem.
# Needs no real weights ($SMOLLM2_GGUF is not used). NVLink multicast stays off (the device's rule).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "dist: pip install -e . failed (continuing)"
R="${OUT:-/tmp/out}/dist"
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpus.csv" 2>&1
nvidia-smi topo -m > "$R/topo.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" > "$R/versions.txt" 2>&1
cat "$R/gpus.csv" "$R/versions.txt"

step() {  # step NAME CAP_S ENV... -- CMD...: run one bounded config, log to $R/NAME.log
  local name=$1 cap=$2; shift 2
  echo "== dist: $name (cap ${cap}s) $(date -u +%T)"
  timeout -k 5 "$cap" env "$@" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name exit $rc" | tee -a "$R/exits.txt"
  grep -v " INFO " "$R/$name.log" | tail -4
  sleep 2  # a killed run's worker processes exit within ~1 s (orphan check) and free their GPUs
}

PARTS="${DIST_PARTS:-2}"
if [[ $PARTS == *1* ]]; then
  step allreduce_w2 45 python3 benchmarks/gpu_allreduce.py --world 2 --out "$R/allreduce_w2.json"
fi
if [[ $PARTS == *2* ]]; then
  step allreduce_w4 45 python3 benchmarks/gpu_allreduce.py --world 4 --out "$R/allreduce_w4.json"
fi
RATE=$(python3 -c "import json, glob; print(json.load(open(sorted(glob.glob('$R/allreduce_w*.json'))[0]))['copy_rate_Bps'])" \
       2>/dev/null || echo 3.01e12)
echo "dist: copy rate $RATE B/s"
TP="python3 benchmarks/gpu_tp.py --copy-rate $RATE --out-dir $R"
if [[ $PARTS == *1* ]]; then
  step 8b_tp1 70 $TP --one 1 --shape 8b --prompts 256 --in-len 512 --out-len 128
  step 8b_tp1_mp 45 $TP --one 1 --shape 8b --backend mp --tag mp --prompts 0 --max-num-seqs 64
  step 8b_tp2 70 $TP --one 2 --shape 8b --prompts 256 --in-len 512 --out-len 128
  step 8b_tp2_symm 45 OCTAVO_TP_ALLREDUCE=symm_mem $TP --one 2 --shape 8b --tag symm --prompts 0 --max-num-seqs 64
  step 70b_tp4 90 $TP --one 4 --shape 70b --prompts 0 --max-num-seqs 64
fi
if [[ $PARTS == *2* ]]; then
  step 8b_tp2_b 40 $TP --one 2 --shape 8b --tag b --prompts 0 --max-num-seqs 64
  step 8b_tp2_symm_b 40 OCTAVO_TP_ALLREDUCE=symm_mem $TP --one 2 --shape 8b --tag symm_b --prompts 0 --max-num-seqs 64
  step 70b_tp4_b 70 $TP --one 4 --shape 70b --tag b --prompts 0 --max-num-seqs 64
  step 70b_tp4_symm 70 OCTAVO_TP_ALLREDUCE=symm_mem $TP --one 4 --shape 70b --tag symm --prompts 0 --max-num-seqs 64
fi

python3 - "$R" <<'PY'
import glob, json, os, sys
r = sys.argv[1]
runs = {os.path.basename(p)[:-5]: json.load(open(p)) for p in glob.glob(f"{r}/*_tp*.json")}
def get(name, key):
    return runs.get(name, {}).get(key)
s = {"card": open(f"{r}/gpus.csv").read().strip(), "versions": open(f"{r}/versions.txt").read().strip(),
     "runs": runs}
d1, d2 = get("8b_tp1", "decode_bs1_ms_per_token"), get("8b_tp2", "decode_bs1_ms_per_token")
ds, dm = get("8b_tp2_symm", "decode_bs1_ms_per_token"), get("8b_tp1_mp", "decode_bs1_ms_per_token")
t1, t2 = get("8b_tp1", "throughput_tok_s"), get("8b_tp2", "throughput_tok_s")
if d1 and d2: s["decode_bs1_tp2_over_tp1"] = d2 / d1
if d1 and ds: s["decode_bs1_tp2_symm_over_tp1"] = ds / d1
if d1 and dm: s["mp_executor_host_overhead_ms_per_token"] = dm - d1
if t1 and t2: s["throughput_tp2_over_tp1_256x512_128"] = t2 / t1
s["decode_bs1_70b_tp4_fraction_of_roofline"] = get("70b_tp4", "decode_bs1_fraction_of_roofline") or \
    get("70b_tp4_b", "decode_bs1_fraction_of_roofline")
for a, b in (("8b_tp2_symm_b", "8b_tp2_b"), ("70b_tp4_symm", "70b_tp4_b")):
    x, y = get(a, "decode_bs1_ms_per_token"), get(b, "decode_bs1_ms_per_token")
    if x and y:
        s[f"decode_bs1_{a}_over_{b}"] = x / y
for w in ("w2", "w4"):
    try:
        s[f"allreduce_{w}"] = json.load(open(f"{r}/allreduce_{w}.json"))
    except OSError:
        pass
json.dump(s, open(f"{r}/summary.json", "w"), indent=1)
print(json.dumps({k: v for k, v in s.items() if k not in ("runs", "allreduce_w2", "allreduce_w4")}, indent=1))
PY
echo "dist: done $(date -u +%T)"
