"""Batch-1 fp8 decode: SiLU-and-mul inside down_proj's one-row GEMV (session 17, engineer fp817;
``OCTAVO_FP8_SILU_DOWN``, opt-in until its GPU A/B).

Why: at one row the MLP is gate_up GEMV -> SiLU-and-mul -> down GEMV. The SiLU kernel holds 79 us of the H100's
critical path a forward (32 x 2.5 us: launched under PDL, it waits for gate_up, makes one L2 round trip, stores, ends;
docs/performance.md "FP8 session 16") for work down's GEMV half does anyway: down quantizes its own input, so each of
its programs reads the whole row after its wait for the absmax. Here down's programs read gate_up's output instead
and compute SiLU(gate) * up with the platform kernel's expressions and roundings (cuda_silu_tile.silu_mul_values), for
the absmax and for each weight block's input: the same bf16 values, so the same scale, the same sums, the same bits.
One kernel boundary less a layer, for twice the L2 reads of the row (gate and up) in down's programs.

How: :func:`install` wraps, per instance, a LlamaMLP whose forward is that class's code and whose act_fn is
SiluAndMul. At one row, when down_proj runs the CUDA-core one-row GEMV (no tensor-core tile, no bias, one rank, no
norm in its tail while ``OCTAVO_FP8_GEMV_NORM`` is on: fp8_gemv_norm), the wrapper hands gate_up's output to down_proj marked ``_octavo_silu_in``, and
fp8.py's apply launches the GEMV with ``silu_in``; every other call runs the layer's own forward. ``ON`` is read per
call (graphs captured after a switch use it).
"""

from __future__ import annotations

import logging
import types

import torch

from octavo.env_flags import env_switch

logger = logging.getLogger(__name__)

# read per call by the installed wrappers; benchmarks switch it and recapture their graphs
ON = env_switch("OCTAVO_FP8_SILU_DOWN", default=False)


def fusable(module) -> bool:
    """LlamaMLP's own forward code with SiluAndMul between an fp8 gate_up_proj and down_proj."""
    from octavo.nn.activation import SiluAndMul
    from octavo.plugins.models.llama import LlamaMLP
    from octavo.plugins.quant.fp8 import _FP8Method

    down, act = getattr(module, "down_proj", None), getattr(module, "act_fn", None)
    if down is None or getattr(module, "gate_up_proj", None) is None or type(act) is not SiluAndMul:
        return False
    if not isinstance(getattr(down, "quant_method", None), _FP8Method):
        return False
    code, ref = getattr(type(module).forward, "__code__", None), LlamaMLP.forward.__code__
    return code is not None and (code.co_code, code.co_names, code.co_consts) == (ref.co_code, ref.co_names,
                                                                               ref.co_consts)


def _takes(down, x: torch.Tensor) -> bool:
    """down_proj's apply would run the CUDA-core one-row GEMV quantizing its own input for this call."""
    from octavo.plugins.quant import fp8_gemv_norm

    qm = down.quant_method
    # a down_proj paired with the next norm (fp8_fused's discovery pairs them whether or not that tail is on) keeps
    # its tail launch only while OCTAVO_FP8_GEMV_NORM is on, as fp8.py's apply decides
    tail = getattr(down, "_octavo_norm_tail", None) is not None and fp8_gemv_norm.STATE["on"]
    return (x.dim() == 2 and x.shape[0] == 1 and getattr(qm, "gemv_max_m", 0) >= 1
            and getattr(qm, "gemv_tc", None) is None and down.bias is None and getattr(down, "tp_size", 1) == 1
            and not tail and not down._forward_hooks and not down._forward_pre_hooks)


def _install(module) -> None:
    inner = module.forward

    def forward(self, x):
        if ON and _takes(self.down_proj, x):
            gu = self.gate_up_proj(x)
            gu._octavo_silu_in = True  # fp8.py's apply: the GEMV computes SiLU(gate) * up itself
            return self.down_proj(gu)
        return inner(x)

    module.forward = types.MethodType(forward, module)
    module._octavo_fp8_silu_down = True  # never wrapped twice


def install(model: torch.nn.Module, device: torch.device | None = None) -> int:
    """Wrap every fusable MLP of ``model`` once (not one with a forward of its own: fp8_silu_gemv's); returns how
    many are wrapped."""
    n = 0
    for m in model.modules():
        if "_octavo_fp8_silu_down" in vars(m):
            n += 1
        elif "forward" not in vars(m) and fusable(m):
            _install(m)
            n += 1
    logger.info("batch-1 fp8 MLP with SiLU-and-mul inside down_proj's GEMV: %d layers wrapped (%s)", n,
                "on" if ON else "off: OCTAVO_FP8_SILU_DOWN")
    return n
