#!/usr/bin/env bash
# Runs device scripts on a multi-GPU machine: one lane per GPU at once (lane i gets CUDA_VISIBLE_DEVICES=i), then
# the scripts that need all GPUs, one after another. Each lane is a run_queue.sh list; results: $OUT/<lane>/<name>.tar.gz
# (written as each script ends, so a call that runs past the device's limit still returns what finished); at the end
# they are packed into one $OUT/results.tgz, since the device tool returns only 8 files per call.
# Usage: bash benchmarks/device/run_lanes.sh "lane0 specs" "lane1 specs" ["all-GPU specs"]      (2 GPUs)
#        LANES=4 bash benchmarks/device/run_lanes.sh "lane0" "lane1" "lane2" "lane3" ["all-GPU specs"]
# A spec is name=script[+arg]:secs (see run_queue.sh); an empty string leaves that lane idle. A lane that starts
# with "@<gpus> " (e.g. "@0,1 head=x.sh:200 nano=y.sh:150") runs on those GPUs instead of GPU i.
set -uo pipefail
final=${OUT:?OUT must be set}
here=$(cd "$(dirname "$0")" && pwd)
lanes=${LANES:-2}
run_lane() {  # lane-name gpus specs
  mkdir -p "$final/$1"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$2 OUT="$final/$1" bash "$here/run_queue.sh" $3 > "$final/$1/lane.log" 2>&1
}
args=("$@")
all_gpus=$(seq -s, 0 $((lanes - 1)))
for ((i = 0; i < lanes; i++)); do
  spec=${args[$i]:-}; gpus=$i
  if [[ $spec == @* ]]; then gpus=${spec%% *}; gpus=${gpus#@}; spec=${spec#* }; fi
  [ -n "$spec" ] && run_lane "lane$i" "$gpus" "$spec" &
done
wait
[ -n "${args[$lanes]:-}" ] && run_lane both "$all_gpus" "${args[$lanes]}"
for lane in $(for ((i = 0; i < lanes; i++)); do echo "lane$i"; done) both; do
  [ -f "$final/$lane/lane.log" ] && { echo "##### $lane"; grep -E "^(===|rc=)" "$final/$lane/lane.log"; }
done
(cd "$final" && tar -czf results.tgz lane* both 2>/dev/null; rm -rf lane[0-9]* both)
