#!/usr/bin/env bash
# Runs several device scripts one after another on the GPU machine, each under its own time limit, and packs
# each one's $OUT into one archive (the device tool returns at most 8 files, 2 folders deep).
# Usage (on the device, repo root): bash benchmarks/device/run_queue.sh name=script.sh:seconds ...
# A script may take arguments joined by "+": name=script.sh+1:75 runs `bash script.sh 1`.
# Each script sees OUT=<its own folder>; its stdout/stderr go to <folder>/log.txt and are echoed at the end.
set -uo pipefail
final_out=${OUT:?OUT must be set}
work=$(mktemp -d)
[ -f /tmp/w/smollm2.gguf ] && export SMOLLM2_GGUF=/tmp/w/smollm2.gguf
for spec in "$@"; do
  name=${spec%%=*}; rest=${spec#*=}; script=${rest%%:*}; secs=${rest##*:}
  dir=$work/$name; mkdir -p "$dir"
  echo "=== $name: $script (limit ${secs}s) $(date -u +%T)"
  start=$(date +%s)
  IFS=+ read -r -a argv <<< "$script"
  OUT=$dir timeout -k 10 "$secs" bash "${argv[@]}" >"$dir/log.txt" 2>&1
  rc=$?
  echo "rc=$rc wall=$(( $(date +%s) - start ))s" | tee -a "$dir/log.txt"
  tail -n 25 "$dir/log.txt"
  tar -C "$work" -czf "$final_out/$name.tar.gz" "$name"
done
