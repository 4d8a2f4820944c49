#!/usr/bin/env bash
# Refreshes the Triton kernels shipped with the install (plugins/platforms/kernel_caches/) and measures start time
# (issue 17 item 4): noship_cold compiles every kernel the 8B start + first token needs and its cache is kept
# ($OUT/start/triton_cache.tar.gz; repack as triton-<ver>-cuda90.tar.xz here), then new_cold (the archive as
# committed) and new_warm. JSON: $OUT/start/start.json. Bound: START_LIMIT (default 150 s).
set -u
cd "$(dirname "$0")/../.."
R="$OUT/start"; mkdir -p "$R"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; python -c "import triton; print(triton.__version__)"; } > "$R/env.txt" 2>&1
timeout -k 5 "${START_LIMIT:-150}" python benchmarks/gpu_start.py noship_cold new_cold new_warm \
  --keep-cache "$R/triton_cache.tar.gz" --out "$R/start.json"
echo "exit $?"; cat "$R/env.txt"; ls -la "$R"; python - "$R/start.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    print(r.get("variant"), {k: r[k] for k in ("import_s", "llm_s", "first_token_s", "spawn_to_first_token_s") if k in r}, r.get("error", "")[:300])
print(d.get("kept_cache"))
PY
