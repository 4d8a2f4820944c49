#!/usr/bin/env bash
# The fp8 variant of e2e_8b.sh (quantization=fp8, kv_cache_dtype=fp8; issue 9).
E2E_VARIANT=fp8 bash "$(dirname "$0")/e2e_8b.sh"
