"""fp8 linear layers at 2-64 rows on the tensor-core GEMV (fp8_gemv_tc.py) instead of ``torch._scaled_mm``.

Why: the 512 x 1000/1000 fp8 run ends with ~1,000 steps of a few dozen rows (the requests the KV cache could not
hold at once), each reading the 7 GB of fp8 weights, and ``_scaled_mm``'s row-wise kernels reached only 0.52-0.61
of the copy bandwidth at 1-64 rows on H100 (docs/performance.md, FP8 session 3); the tensor-core GEMV streams the
weight once for all rows of its ``BLOCK_M`` (16, 32 or 64) and was 1.2-1.8x faster at 2-16 rows (session 5).

Which tile serves which rows comes from ``fp8_configs/smallm.json`` (card name -> ``"NxK"`` -> list of ``[max_rows,
"f16" | "fp8", BLOCK_N, BLOCK_K, num_warps, num_stages, BLOCK_M]``, written from benchmarks/fp8_smallm_bench.py);
a shape or card without an entry keeps ``_scaled_mm``. Each entry is checked once per shape at load against the
exact ``_scaled_mm`` at its largest row count (prequantized rows, the same e4m3 operands: only the fp32 summation
order differs) and dropped with a warning if it does not match within a bf16 rounding step. The input is always
quantized before the kernel (by its producer, fp8_fused.py, or one ``quantize_per_token`` launch, as the
``_scaled_mm`` path does): the kernel's in-kernel quantization would redo every row in every program.
``OCTAVO_FP8_SMALL_M=0`` keeps ``_scaled_mm`` everywhere (A/B in one process: read at each layer's load).
"""

from __future__ import annotations

import json
import logging
import os

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)
_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fp8_configs", "smallm.json")
_VERIFIED: dict[tuple, bool] = {}


def table_for(n: int, k: int, device_name: str, path: str = _CONFIG) -> list[tuple[int, bool, tuple[int, ...]]]:
    """``[(max_rows, dot_fp8, (BLOCK_N, BLOCK_K, warps, stages, BLOCK_M)), ...]`` for an ``[n, k]`` weight on this
    card, by rising ``max_rows``; empty where none was measured. A malformed entry is refused (ValueError)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f).get(device_name, {}).get(f"{n}x{k}", [])
    out = []
    for row in rows:
        if (len(row) != 7 or row[1] not in ("f16", "fp8") or not all(isinstance(v, int) for v in row[:1] + row[2:])
                or row[6] not in (16, 32, 64) or not 1 < row[0] <= row[6]):
            raise ValueError(f"{path}: {device_name} {n}x{k}: {row!r} is not [max_rows (2..BLOCK_M), \"f16\"|\"fp8\", "
                             "BLOCK_N, BLOCK_K, warps, stages, BLOCK_M (16|32|64)]")
        out.append((row[0], row[1] == "fp8", tuple(row[2:])))
    return sorted(out)


def choose(layer, scaled_mm) -> list[tuple[int, bool, tuple[int, ...]]]:
    """The verified small-M tiles for ``layer`` (empty: ``_scaled_mm`` serves every row count above the GEMV's).
    ``scaled_mm(x2, pre, exact)``: the method's exact ``_scaled_mm`` path, the reference."""
    if not env_switch("OCTAVO_FP8_SMALL_M", default=True) or layer.weight.device.type != "cuda":
        return []
    from octavo.plugins.quant import fp8_triton
    from octavo.plugins.quant.fp8_gemv_tc import fp8_gemv_tc

    n, k = layer.weight.shape
    good = []
    for max_rows, dot_fp8, cfg in table_for(n, k, torch.cuda.get_device_name(layer.weight.device)):
        key = (n, k, layer.bias is not None, max_rows, dot_fp8, cfg)
        if key not in _VERIFIED:
            ok = False
            try:
                with torch.inference_mode():
                    x = torch.randn(max_rows, k, device=layer.weight.device, dtype=torch.bfloat16)
                    pre = fp8_triton.quantize_per_token(x)
                    want = scaled_mm(x, pre, True).float()
                    got = fp8_gemv_tc(pre[0], layer.weight, layer.weight_scale, layer.bias, x_scale=pre[1],
                                      out_dtype=torch.bfloat16, config=cfg, dot_fp8=dot_fp8).float()
                    err = float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))
                ok = err < 2e-2  # a rounding step of the bf16 output, not a wrong product
                if not ok:
                    logger.warning("fp8 small-M GEMV %s not used for %s: %.3g from _scaled_mm", cfg, (n, k), err)
            except Exception as e:  # noqa: BLE001 - keep _scaled_mm for a tile this card cannot run
                logger.warning("fp8 small-M GEMV %s not used for %s: %s: %s", cfg, (n, k), type(e).__name__, e)
            _VERIFIED[key] = ok
        if _VERIFIED[key]:
            good.append((max_rows, dot_fp8, cfg))
    return good


def apply(layer, tiles, x2: torch.Tensor, pre, bias) -> torch.Tensor | None:
    """``x2 [m, K]`` through the first tile whose ``max_rows >= m``, or None (no tile takes ``m`` rows)."""
    m = x2.shape[0]
    for max_rows, dot_fp8, cfg in tiles:
        if m <= max_rows:
            from octavo.plugins.quant import fp8_triton
            from octavo.plugins.quant.fp8_gemv_tc import fp8_gemv_tc

            xq, xs = pre if pre is not None else fp8_triton.quantize_per_token(x2)
            return fp8_gemv_tc(xq, layer.weight, layer.weight_scale, bias, x_scale=xs, out_dtype=x2.dtype,
                               config=cfg, dot_fp8=dot_fp8)
    return None
