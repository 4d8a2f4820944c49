#!/usr/bin/env bash
# Runs device scripts on a 2-GPU machine: two lanes at once (one GPU each, CUDA_VISIBLE_DEVICES=0 / 1), then the
# scripts that need both GPUs, one after another. Each lane is a run_queue.sh list; results: $OUT/<lane>.tar.gz.
# Usage: bash benchmarks/device/run_lanes.sh "name=script:secs ..." "name=script:secs ..." ["name=script:secs ..."]
set -uo pipefail
final=${OUT:?OUT must be set}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
run_lane() {  # lane-name gpus specs
  mkdir -p "$work/$1"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$2 OUT="$work/$1" bash "$here/run_queue.sh" $3 > "$work/$1.log" 2>&1
}
[ -n "${1:-}" ] && run_lane lane0 0 "$1" &
[ -n "${2:-}" ] && run_lane lane1 1 "$2" &
wait
[ -n "${3:-}" ] && run_lane both 0,1 "$3"
for lane in lane0 lane1 both; do
  [ -d "$work/$lane" ] || continue
  echo "##### $lane"; grep -E "^(===|rc=)" "$work/$lane.log"
  (cd "$work/$lane" && for t in *.tar.gz; do [ -f "$t" ] && tar -xzf "$t" && rm "$t"; done)
  cp "$work/$lane.log" "$work/$lane/"
  tar -C "$work" -czf "$final/$lane.tar.gz" "$lane"
done
