"""The residual add + RMSNorm + per-token e4m3 quantization that follows an fp8 one-row GEMV, done by the GEMV's last
program instead of by a kernel of its own (batch-1 decode; opt-in: ``OCTAVO_FP8_GEMV_NORM=1``).

Measured slower (session 14, H100, 8B fp8 bs1, one engine, three alternating pairs, tokens equal): captured forward
2.957 / 2.964 / 2.965 -> 2.998 / 2.999 / 3.000 ms. The tail adds 4.7 us a layer after o_proj and 3.8 after down on the
critical path, the norm kernel it replaces 3.6: the saved launch and kernel end were cheap under PDL, the fence and
ticket are not (docs/performance.md "FP8 session 14"). Kept opt-in for other cards and kernels.

Why: at batch 1 the 8B forward runs 64 quantizing norms (fp8_fused.py), one after each o_proj and down GEMV. Each is
one program on the critical path: launch after the GEMV ends, a round trip for its inputs, two block reductions,
its stores, its end before the next GEMV may read them: 7.3 us a layer in session 12's critical-path table (H100,
docs/performance.md "FP8 session 12"), 235 us a forward. Here the GEMV does it in its tail: every program, after
storing its outputs, takes a ticket (an acq_rel atomic on a counter, after a gpu-scope fence of its stores); the
program that draws the last ticket has every output of the row visible in L2 and runs the norm kernel's own
expressions on it, then resets the counter for the next launch. One kernel boundary and one launch fewer a norm;
the next GEMV (launched early under PDL) waits for this kernel as before.

Bits: the GEMV part is fp8_gemv's kernel itself (called inline, the same tile and loop), so its output has the
unfused bits. The norm part repeats fp8_fused._rms_norm_quant_kernel's steps (the residual sum rounded, ``rsqrt``,
the two roundings, the weight, ``_quant_row_store``) on the GEMV's ``num_warps`` instead of the norm's 16: the sum of
squares is reduced in another fp32 order, so ``rstd`` may differ in its last bits and an element of the normed row
may land a bf16 step or two away (rarely: a rounding boundary); the quantized copy is always ``quantize_per_token`` of
the normed row this kernel wrote. Tests: tests/quant/test_fp8_gemv_norm.py (interpreter: the GEMV bits, the norm vs
a float64 reference within its two bf16 roundings, the quantization exact, the counter reset, the engine plumbing on a
2-layer Llama; sm_90 compile; GPU: the same, eager and replayed, and how many elements differ from the norm kernel).

Plumbing (fp8_fused.link_fp8_inputs' discovery forward): an fp8 linear whose output tensor goes, untouched, into a
quantizing RMSNorm with a residual, inside Llama's decoder layer / attention / MLP code (so nothing else reads that
tensor), is paired with the norm. At one row its ``apply`` then launches nothing and returns an empty tensor that
carries the launch (``_octavo_fp8_defer``); the norm's quantizing forward, called next with the residual, launches
the GEMV with the norm in its tail and returns the normed row (with its e4m3 copy) and the new residual. The GEMV's
output is written into that tensor by the same launch, so it holds what it would have held.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_switch
from octavo.plugins.quant.fp8_e4m3 import _quant_row_store
from octavo.plugins.quant.fp8_gemv import _fp8_gemv_kernel

logger = logging.getLogger(__name__)
STATE = {"on": env_switch("OCTAVO_FP8_GEMV_NORM", default=False)}  # read per call (benchmarks flip it, recapture)


@triton.jit
def _fp8_gemv_norm_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, pf_ptr, pf_total, pf_piece, M, N, K, stride_xm,
                          stride_wn, stride_ym, res_ptr, nw_ptr, out_ptr, res_out_ptr, q_ptr, s_ptr, cnt_ptr, eps,
                          QUANT_X: tl.constexpr, PRE_Q: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                          SOFT_FP8: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          PREFETCH: tl.constexpr = False, USE_PDL: tl.constexpr = False,
                          SELF_PF: tl.constexpr = False, W_BITS: tl.constexpr = False, REG_PF: tl.constexpr = False,
                          ACC_SPLIT: tl.constexpr = 0, X2D: tl.constexpr = False, PDL_W: tl.constexpr = False,
                          AMAX_KP: tl.constexpr = 0, LOOP2: tl.constexpr = 0, NORM_BLOCK: tl.constexpr = 4096,
                          FENCE: tl.constexpr = True):
    """fp8_gemv's one-row kernel (``M == 1``), then: the program drawing the last ticket computes
    ``res_out = y + res``, ``out = rmsnorm(res_out) * nw`` and its e4m3 copy ``q`` / scale ``s`` as
    fp8_fused._rms_norm_quant_kernel does (``NORM_BLOCK``: N rounded up to a power of two), and resets ``cnt``."""
    _fp8_gemv_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, y_ptr, pf_ptr, pf_total, pf_piece, M, N, K, stride_xm,
                     stride_wn, stride_ym, QUANT_X, PRE_Q, HAS_BIAS, EVEN, SOFT_FP8, BLOCK_N, BLOCK_K, PREFETCH,
                     USE_PDL, SELF_PF, W_BITS, REG_PF, ACC_SPLIT, X2D, PDL_W, AMAX_KP, LOOP2)
    if FENCE:  # every thread's stores of y ordered before the ticket (Triton brackets the atomic with bar.sync)
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:  # the last program: the whole row is in L2 (read past L1: .cg)
        cols = tl.arange(0, NORM_BLOCK)
        mask = cols < N
        x = tl.load(y_ptr + cols, mask=mask, other=0.0, cache_modifier=".cg")
        r = tl.load(res_ptr + cols, mask=mask, other=0.0, cache_modifier=".cg")  # L2: written by an earlier kernel
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # torch rounds the sum to the dtype
        tl.store(res_out_ptr + cols, x, mask=mask)
        xf = x.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(xf * xf, 0) / N + eps)
        yv = (xf * rstd).to(x.dtype).to(tl.float32)
        w = tl.load(nw_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        o = (yv * w).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + cols, o, mask=mask)
        _quant_row_store(o.to(tl.float32), cols, mask, q_ptr, s_ptr, 0, N, SOFT_FP8)
        tl.store(cnt_ptr, 0)  # the next launch counts from 0 (it reads the counter only after this kernel ended)


def tail_args(tail: dict, n: int, soft: bool) -> tuple[tuple, dict]:
    """``fp8_gemv``'s extra arguments and constexprs for ``tail`` (the dict :func:`fp8_gemv_norm` builds)."""
    t = tail
    return ((t["res"], t["nw"], t["out"], t["res_out"], t["q"], t["s"], t["cnt"], float(t["eps"])),
            {"NORM_BLOCK": triton.next_power_of_2(n), "FENCE": not soft})


def tail_tile(n: int, k: int, pre: bool, split: int, device) -> tuple:
    """The unfused GEMV's tile for this shape (its table's, or its autotuner's once it has tuned it: as
    fp8_silu_gemv.gemv_tile): with it the GEMV part has the unfused bits. Raises when there is none yet."""
    from octavo.plugins.quant import fp8_gemv, fp8_gemv_tiles

    tile = fp8_gemv_tiles.table_tile(device, n, k, split)
    tuner = fp8_gemv._fp8_gemv_tuned_split if split else fp8_gemv._fp8_gemv_tuned
    for key, cfg in ([] if tile is not None else tuner.cache.items()):
        if key[0] == n and key[1] == k and bool(key[3]) == pre and bool(key[2]) != pre:
            kw = cfg.all_kwargs()
            tile = kw["BLOCK_N"], kw["BLOCK_K"], kw["num_warps"], kw["num_stages"]
            break
    if tile is None:
        raise LookupError(f"fp8 GEMV + norm: no tuned tile for [{n}, {k}] yet (run the GEMV once first)")
    return tile


def fp8_gemv_norm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, residual: torch.Tensor,
                  norm_weight: torch.Tensor, eps: float, counter: torch.Tensor, *, x_scale: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None, y: torch.Tensor | None = None,
                  q_dtype: torch.dtype = torch.float8_e4m3fn, **launch):
    """One row: ``y = fp8_gemv(x, weight)`` and the RMSNorm of ``y + residual`` with its quantization, in one launch.
    Returns ``(y, out, res_out, q [1, N], s [1, 1])``. ``counter``: an int32 zero on the device, owned by this call
    site (the launch leaves it zero). ``y``: where the GEMV writes (default: a new tensor). ``launch``: fp8_gemv's
    one-row options (pdl, pdl_w, config, ...). ``q_dtype=torch.float32``: the e4m3 values unpacked (interpreter)."""
    from octavo.plugins.quant.fp8_gemv import fp8_gemv

    n = weight.shape[0]
    if x.shape[0] != 1 or residual.numel() != n or norm_weight.numel() != n:
        raise ValueError(f"fp8_gemv_norm: one row and an [N] residual / norm weight: x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}, residual {tuple(residual.shape)}, norm {tuple(norm_weight.shape)}")
    dev = x.device
    y_dtype = out_dtype or (torch.bfloat16 if x_scale is not None else x.dtype)
    out = torch.empty(1, n, dtype=torch.promote_types(norm_weight.dtype, y_dtype), device=dev)
    tail = {"res": residual.reshape(1, n).contiguous(), "nw": norm_weight, "out": out,
            "res_out": torch.empty(1, n, dtype=y_dtype, device=dev), "q": torch.empty(1, n, dtype=q_dtype, device=dev),
            "s": torch.empty(1, 1, dtype=torch.float32, device=dev), "cnt": counter, "eps": eps, "y": y,
            "kernel": _fp8_gemv_norm_kernel, "args": lambda n_, soft: tail_args(tail, n_, soft), "tile": tail_tile}
    y = fp8_gemv(x, weight, weight_scale, None, x_scale=x_scale, out_dtype=y_dtype, tail=tail, **launch)
    return y, out, tail["res_out"], tail["q"], tail["s"]


# ----------------------------------------------------------------------------------- the engine's plumbing
def _same_code(fn, ref) -> bool:
    code, want = getattr(fn, "__code__", None), ref.__code__
    return code is not None and (code.co_code, code.co_names, code.co_consts) == (want.co_code, want.co_names,
                                                                               want.co_consts)


def pairable(model: torch.nn.Module, linear, norm) -> bool:
    """``linear`` is the o_proj of a LlamaAttention (or down_proj of a LlamaMLP) whose forward returns its output as
    is, and ``norm`` a RMSNorm of a layer running LlamaDecoderLayer's forward (it receives that output untouched and
    nothing else reads it); ``linear`` on the CUDA-core one-row GEMV without bias."""
    from octavo.plugins.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP

    qm = linear.quant_method
    if (getattr(qm, "gemv_tc", None) is not None or not getattr(qm, "gemv_max_m", 0) or linear.bias is not None
            or linear.weight.stride(1) != 1 or getattr(linear, "tp_size", 1) != 1):
        return False
    parents = {id(child): m for m in model.modules() for child in m.children()}
    owner, layer = parents.get(id(linear)), parents.get(id(norm))
    if owner is None or layer is None or not _same_code(type(layer).forward, LlamaDecoderLayer.forward):
        return False
    for m in (owner, layer):  # an instance's own forward: only the fused GEMVs' (they return the linear's output)
        if "forward" in vars(m) and not (vars(m).get("_octavo_fp8_silu") or vars(m).get("_octavo_fp8_rope")):
            return False
    if getattr(owner, "o_proj", None) is linear:
        return _same_code(type(owner).forward, LlamaAttention.forward)
    return getattr(owner, "down_proj", None) is linear and _same_code(type(owner).forward, LlamaMLP.forward)


def pair(linear, norm, device: torch.device) -> None:
    """Let ``linear``'s one-row apply hand its launch to ``norm`` (fp8.py's apply, fp8_fused's norm forward)."""
    linear._octavo_norm_tail = type(norm).__name__  # a name, not the module: no submodule registered
    linear._octavo_norm_cnt = torch.zeros(1, dtype=torch.int32, device=device)  # the ticket counter, this site's


def deferred(layer, x2: torch.Tensor, pre, launch: dict) -> torch.Tensor:
    """The empty ``[1, N]`` output of ``layer`` at one row, carrying the launch that will fill it (see above)."""
    n = layer.weight.shape[0]
    y = torch.empty(1, n, dtype=x2.dtype, device=x2.device)

    def run(residual, norm_weight, eps):
        """Launch the GEMV (into ``y``) with the norm in its tail: ``(out, res_out, q, s)``; without a residual
        (not a Llama layer's norm: never paired so) the GEMV alone, then None."""
        vars(y).pop("_octavo_fp8_defer", None)  # y -> run -> y: no cycle left for the collector
        xq, xs = (pre[0], pre[1]) if pre is not None else (x2, None)
        if residual is None:
            from octavo.plugins.quant.fp8_gemv import fp8_gemv

            y.copy_(fp8_gemv(xq, layer.weight, layer.weight_scale, x_scale=xs, out_dtype=x2.dtype, **launch))
            return None
        _, out, res_out, q, s = fp8_gemv_norm(xq, layer.weight, layer.weight_scale, residual, norm_weight, eps,
                                              layer._octavo_norm_cnt, x_scale=xs, out_dtype=x2.dtype, y=y, **launch)
        return out, res_out, q, s

    y._octavo_fp8_defer = run
    return y


def carry(y: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """``view`` of the deferred ``y`` (a linear's output of another shape) with ``y``'s pending launch."""
    view._octavo_fp8_defer = y._octavo_fp8_defer
    return view
