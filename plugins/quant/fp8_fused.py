"""fp8 activation quantization fused into the kernels that produce the activations: RMSNorm (with or without
the residual add) and SiLU-and-mul write their bf16 output AND its per-token e4m3 quantization + scales.

Why: above the GEMV's row limit an fp8 linear layer runs ``quantize_per_token`` (one kernel that re-reads the
activations) and then ``torch._scaled_mm``. The norm / activation kernel before it already has each row in
registers; writing the quantized row there saves a launch and a read per linear (qkv_proj and gate_up_proj
after the two norms, down_proj after SiLU-and-mul). The o_proj input comes from attention and is still
quantized by the linear.

How a layer learns that its consumer wants fp8 input, without a model-file edit: :func:`link_fp8_inputs`
(called by the cuda platform's ``fuse_model`` after it installed the plain fused kernels) arms forward hooks
for ONE forward. Producers tag their output tensor with themselves; each fp8 linear whose input carries a tag
names its producer. At the end of that forward the hooks are removed and each named producer gets a
quantizing forward (checked once against its plain forward and ``quantize_per_token`` first). From then on
its output tensor carries ``_octavo_fp8 = (q, scale)``; the fp8 linear uses it when present (a view or a
copy of the tensor carries nothing, so the linear quantizes itself: correct either way). The quantized copy
is made by norms at every size (the GEMV then reads e4m3 and skips its own absmax pass) and by SiLU-and-mul
only above the consumers' GEMV rows (its quantizing kernel, one program per row, is slower at a few rows
than the GEMV's in-kernel quantization).
``OCTAVO_FP8_FUSE_INPUTS=0`` turns the linking off (A/B).

Numbers are unchanged by construction: the scale and the e4m3 values are computed from the rounded bf16
output exactly as ``quantize_per_token`` computes them (IEEE division, ``div_rn``), so the fused path
and the separate kernel give the same bytes (tests/quant/test_fp8_fused.py, interpreter and GPU).
"""

from __future__ import annotations

import logging
import os
import types

import torch
import triton
import triton.language as tl

from octavo.env_flags import env_int, env_switch
from octavo.plugins.quant import fp8_prefetch
from octavo.plugins.quant.fp8_e4m3 import _quant_row_store
from octavo.plugins.quant.fp8_gemv import _round_e4m3

logger = logging.getLogger(__name__)


@triton.jit
def _rms_norm_quant_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, q_ptr, s_ptr, stride_x, stride_r, n_cols,
                           eps, HAS_RES: tl.constexpr, SOFT_FP8: tl.constexpr, BLOCK: tl.constexpr,
                           TRIGGER: tl.constexpr = False, WAIT: tl.constexpr = False, W_FIRST: tl.constexpr = 0):
    """plugins/platforms/cuda_fusions.py's RMSNorm (same rounding steps), plus the quantized output.
    ``TRIGGER``: a consumer launched as a programmatic dependent launch may start now (it waits in the kernel for
    this one to finish before reading anything of it; fp8_prefetch.py). ``WAIT``: this kernel is itself launched as
    a programmatic dependent launch and waits for its producer (the GEMV before it) before it reads anything.
    ``W_FIRST`` (``W_FIRST_AT``; the same arithmetic, the same bits): 0 reads the norm weight after the sum of squares
    (its load then waits for that block reduction, and goes to DRAM behind the first weight blocks of the GEMV the
    trigger launched: sm_90 SASS of 0 has the weight's LDG after the first BAR.SYNC); 1 reads it first (before the
    PDL wait: no kernel writes it), then x / residual, then triggers; 2 as 1 but triggers after the sum of squares
    (the next GEMV's loads then start after all of this kernel's)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if W_FIRST:
        w_early = tl.load(w_ptr + cols, mask=mask, other=0.0)
    if WAIT:
        tl.extra.cuda.gdc_wait()
    if TRIGGER and not W_FIRST:
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
    if TRIGGER and W_FIRST == 1:  # every load of this kernel is issued: the GEMV's first blocks queue behind them
        tl.extra.cuda.gdc_launch_dependents()
    if HAS_RES:
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # torch rounds the sum to the dtype
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    if TRIGGER and W_FIRST == 2:
        tl.extra.cuda.gdc_launch_dependents()
    y = (xf * rstd).to(x.dtype).to(tl.float32)
    if W_FIRST:
        w = w_early.to(tl.float32)
    else:
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    o = (y * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n_cols + cols, o, mask=mask)
    _quant_row_store(o.to(tl.float32), cols, mask, q_ptr, s_ptr, row, n_cols, SOFT_FP8)


@triton.jit
def _silu_mul_quant_kernel(x_ptr, out_ptr, q_ptr, s_ptr, stride_x, d, SOFT_FP8: tl.constexpr, BLOCK: tl.constexpr):
    """``silu(g) * u`` rounded like torch (as cuda_fusions' kernel), then per-token e4m3: one program per row,
    two passes (the second reads back the row this program wrote)."""
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, d, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < d
        g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        u = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)
        o = (s * u.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * d + cols, o, mask=mask)
        amax = tl.maximum(amax, tl.where(mask, tl.abs(o.to(tl.float32)), 0.0))
    scale = tl.maximum(tl.math.div_rn(tl.max(amax, 0), 448.0), 1e-12)
    tl.store(s_ptr + row, scale)
    tl.debug_barrier()
    for start in range(0, d, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < d
        o = tl.load(out_ptr + row * d + cols, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(tl.math.div_rn(o, scale), -448.0), 448.0)
        if SOFT_FP8:
            q = _round_e4m3(q)
        tl.store(q_ptr + row * d + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


def _p2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def _soft() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"  # the interpreter's own fp8 cast is wrong on carries


# warps of the quantizing norm at <= 4 rows (None: as at any size). At batch 1 the 8B forward's 64 norms took 3.9 us
# each on H100 on 4 warps (one program per row), 3.3 on 8, 2.9 on 16 (session 5 batch 2: 0.800 -> 0.816 of the
# roofline); the default since session 6 (_install checks a one-row launch too). benchmarks/fp8_bs1.py --ab
SMALL_ROWS_WARPS: int | None = 16
# the quantizing norm launched as a programmatic dependent launch (WAIT: it waits in the kernel for the GEMV before
# it, so it starts the moment that one ends instead of after a launch gap). Same bits. ``OCTAVO_FP8_NORM_PDL``
# (needs the GEMVs' PDL, fp8_prefetch.PDL): on since session 15 with the weight read before the wait (W_FIRST): H100,
# one engine, norms -28 to -31 us a forward, o / qkv +7 / +9; forward -6 us with the rotary inside the attention
# (2.919-2.922 vs 2.926-2.928 ms), -7 without; tokens equal. (Session 12, without W_FIRST: even.) One row only.
NORM_PDL = env_switch("OCTAVO_FP8_NORM_PDL", default=True)
# where the quantizing norm reads its weight and lets the next GEMV launch (the kernel's ``W_FIRST``: 0 as sessions 6-14,
# 1 weight first + trigger after the loads, 2 weight first + trigger after the sum of squares); the same bits.
# ``OCTAVO_FP8_NORM_WFIRST`` (0 / 1 / 2). Default 1 since session 15's GPU A/B (H100, 8B fp8 bs1, one engine, 3 pairs:
# captured forward 2.950-2.951 ms vs 2.961-2.967, tokens equal, GPU tests passed); 2 lost (+9 us: the GEMV starts late)
W_FIRST_AT = env_int("OCTAVO_FP8_NORM_WFIRST", 1, 0, 2)


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
                   q_dtype: torch.dtype = torch.float8_e4m3fn):
    """``(out, new_residual or None, q [rows, d], scale [rows, 1])``: the fused RMSNorm and its quantization.

    ``q_dtype=torch.float32`` returns the e4m3-rounded values unpacked (tests under the interpreter).
    """
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res_out = torch.empty_like(x2) if residual is not None else out
    r2 = residual.reshape(-1, d) if residual is not None else x2
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    q = torch.empty((rows, d), dtype=q_dtype, device=x.device)
    s = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        warps = SMALL_ROWS_WARPS if SMALL_ROWS_WARPS and rows <= 4 else (8 if d > 4096 else 4)
        trigger = {"TRIGGER": True} if fp8_prefetch.PDL and fp8_prefetch.hopper(x.device) and not _soft() else {}
        if trigger and NORM_PDL and rows == 1:  # launched early too: resident while the GEMV before it runs, waits
            # for it (measured at batch 1 only: larger steps keep the plain launch)
            trigger.update(WAIT=True, launch_pdl=True)
        _rms_norm_quant_kernel[(rows,)](x2, r2, weight, out, res_out, q, s, x2.stride(0), r2.stride(0), d, eps,
                                        HAS_RES=residual is not None, SOFT_FP8=_soft(), BLOCK=_p2(d),
                                        num_warps=warps, W_FIRST=W_FIRST_AT if rows == 1 else 0, **trigger)
    return out.view(x.shape), (res_out.view(x.shape) if residual is not None else None), q, s


def silu_and_mul_quant(x: torch.Tensor, q_dtype: torch.dtype = torch.float8_e4m3fn):
    """``(silu(x[..., :d]) * x[..., d:], q [rows, d], scale [rows, 1])`` in one kernel."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(rows, d, dtype=x.dtype, device=x.device)
    q = torch.empty((rows, d), dtype=q_dtype, device=x.device)
    s = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows:
        block = min(4096, _p2(d))
        _silu_mul_quant_kernel[(rows,)](x2, out, q, s, x2.stride(0), d, SOFT_FP8=_soft(), BLOCK=block,
                                        num_warps=8 if block >= 2048 else 4)
    return out.view(*x.shape[:-1], d), q, s


# ----------------------------------------------------------------------------------- quantizing forwards
def _rms_quant_forward(self, x, residual=None):
    run = getattr(x, "_octavo_fp8_defer", None)  # the linear before left its launch to this norm (fp8_gemv_norm.py)
    if run is not None and residual is not None:
        out, res, q, s = run(residual, self.weight, self.eps)
        out = out.view(x.shape)
        out._octavo_fp8 = (q, s)
        return out, res.view(x.shape)
    if run is not None:
        run(None, None, None)  # the GEMV alone, into x
    if x.numel() // x.shape[-1] <= self._octavo_fp8_min_rows - 1:  # the consumers' GEMV quantizes itself
        return self._octavo_plain_forward(x, residual)
    out, res, q, s = rms_norm_quant(x, self.weight, self.eps, residual)
    out._octavo_fp8 = (q, s)
    return out if residual is None else (out, res)


def _silu_quant_forward(self, x):
    if x.numel() // x.shape[-1] <= self._octavo_fp8_min_rows - 1:
        return self._octavo_plain_forward(x)
    out, q, s = silu_and_mul_quant(x)
    out._octavo_fp8 = (q, s)
    return out


def _install(module, min_rows: int, device: torch.device, verified: dict) -> bool:
    """Give ``module`` its quantizing forward after checking it against the plain one on random rows (once per
    kind, width and dtype, as fuse_model checks its kernels)."""
    from octavo.nn.layernorm import RMSNorm
    from octavo.plugins.quant.fp8_triton import quantize_per_token

    rms = isinstance(module, RMSNorm)
    plain = module.forward
    fused = types.MethodType(_rms_quant_forward if rms else _silu_quant_forward, module)
    module._octavo_plain_forward, module._octavo_fp8_min_rows = plain, 1
    dtype = module.weight.dtype if rms else torch.bfloat16
    d = module.weight.shape[0] if rms else 1000
    key = (rms, d, dtype, getattr(plain, "__func__", None))
    if verified.get(key) is True:
        module._octavo_fp8_min_rows = min_rows
        module.forward = fused
        return True
    if verified.get(key) is False:
        del module._octavo_plain_forward, module._octavo_fp8_min_rows
        return False
    gen = torch.Generator(device=device).manual_seed(0)
    cases = ([(torch.randn(rows, d, generator=gen, device=device).to(dtype),
               *((torch.randn(rows, d, generator=gen, device=device).to(dtype),) if res else ()))
              for rows in (5, 1) for res in (False, True)] if rms  # 1 row: the small-rows launch
             else [(torch.randn(3, 2 * d, generator=gen, device=device).to(dtype),)])
    try:
        with torch.inference_mode():
            for args in cases:
                want, got = plain(*args), fused(*args)
                w0, g0 = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
                if isinstance(want, tuple) and not torch.allclose(want[1].float(), got[1].float(), rtol=1.6e-2,
                                                                  atol=1.6e-2):  # one bf16 step, as fuse_model
                    raise ValueError("residual differs from the plain forward")
                if not torch.allclose(w0.float(), g0.float(), rtol=1.6e-2, atol=1.6e-2):
                    raise ValueError("output differs from the plain forward")
                q, s = quantize_per_token(g0.reshape(-1, g0.shape[-1]))
                fq, fs = g0._octavo_fp8
                if not (torch.equal(fs, s) and torch.equal(fq.view(torch.uint8), q.view(torch.uint8))):
                    raise ValueError("quantized output differs from quantize_per_token")
    except Exception as e:  # noqa: BLE001 - keep the plain forward
        logger.warning("fp8 input fusion not used for %s: %s", type(module).__name__, e)
        del module._octavo_plain_forward, module._octavo_fp8_min_rows
        verified[key] = False
        return False
    verified[key] = True
    module._octavo_fp8_min_rows = min_rows
    module.forward = fused
    return True


def link_fp8_inputs(model: torch.nn.Module) -> dict[str, int]:
    """Arm the one-forward discovery described in the module docstring; returns what was armed."""
    from octavo.nn.activation import SiluAndMul
    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.linear import LinearBase
    from octavo.plugins.quant.fp8 import _FP8Method

    fp8 = [m for m in model.modules() if isinstance(m, LinearBase) and isinstance(m.quant_method, _FP8Method)
           and getattr(m.quant_method, "fused", False)]
    if not fp8:
        return {}
    fuse = env_switch("OCTAVO_FP8_FUSE_INPUTS")
    device = fp8[0].weight.device
    silu = rope = 0
    if device.type == "cuda":
        from octavo.plugins.quant import fp8_silu_gemv

        if fp8_silu_gemv.STATE["on"]:  # gate/up GEMV + SiLU-and-mul at one row (checked per shape here)
            silu = fp8_silu_gemv.fuse_fp8_silu_gemv(model, device)
        from octavo.plugins.quant import fp8_rope_gemv

        if fp8_rope_gemv.STATE["on"]:  # qkv GEMV + rotary at one row (checked per shape here)
            rope = fp8_rope_gemv.fuse_fp8_rope_gemv(model, device)
        from octavo.plugins.quant import fp8_attn_rope

        if fp8_attn_rope.ON:  # the rotary inside the one-launch attention at one row (session 15)
            fp8_attn_rope.install(model)
    producers = [m for m in model.modules() if type(m) in (RMSNorm, SiluAndMul)
                 and "_octavo_plain_forward" not in vars(m)] if fuse else []  # not twice
    handles, links, order, pairs = [], {}, [], []

    def tag(module, args, out):
        t = out[0] if isinstance(out, tuple) else out
        if isinstance(t, torch.Tensor):
            t._octavo_src = module

    def seen(layer, args):
        order.append(layer)  # the forward order: fp8_prefetch's L2 prefetch chain
        src = getattr(args[0], "_octavo_src", None) if args else None
        if src is not None:
            limit = links.get(id(src), (src, 0))[1]
            links[id(src)] = (src, max(limit, layer.quant_method.gemv_max_m))

    def lin_out(layer, args, out):
        if isinstance(out, torch.Tensor):
            out._octavo_lin = layer

    def norm_in(norm, args):  # a linear's output into a norm with a residual: fp8_gemv_norm may pair them
        lin = getattr(args[0], "_octavo_lin", None) if args else None
        if lin is not None and isinstance(norm, RMSNorm) and len(args) > 1 and args[1] is not None:
            pairs.append((lin, norm))

    def finish(module, args, out):
        for h in handles:
            h.remove()
        from octavo.plugins.quant.fp8_prefetch import link_chain

        logger.info("fp8 GEMV prefetch chain: %d links", link_chain(order))
        if not fuse:
            return
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():  # the checks would sync
            logger.warning("fp8 input fusion not installed: the first forward was inside a CUDA-graph capture")
            return
        done, verified = {"RMSNorm": 0, "SiluAndMul": 0}, {}
        for src, gemv_rows in links.values():
            # a norm quantizes at every size (the GEMV then skips its absmax pass); SiLU-and-mul only above the
            # GEMV's rows (its quantizing kernel is one program per row, slower than the plain one at 1-16 rows)
            min_rows = 1 if isinstance(src, RMSNorm) else gemv_rows + 1
            try:
                if _install(src, min_rows, device, verified):
                    done[type(src).__name__] += 1
            except Exception as e:  # noqa: BLE001 - never fail the forward that discovered the links
                logger.warning("fp8 input fusion not used for %s: %s: %s", type(src).__name__, type(e).__name__, e)
        logger.info("fp8 inputs quantized by their producers: %s (of %d fp8 linear layers)", done, len(fp8))
        from octavo.plugins.quant import fp8_gemv_norm

        paired = 0
        for lin, norm in pairs:  # norms that quantize at one row, after a linear whose output only they read
            if getattr(norm, "_octavo_fp8_min_rows", 0) == 1 and fp8_gemv_norm.pairable(model, lin, norm):
                fp8_gemv_norm.pair(lin, norm, device)
                paired += 1
        logger.info("fp8 GEMVs that run the norm after them in their tail at one row: %d (%s)", paired,
                    "on" if fp8_gemv_norm.STATE["on"] else "off: OCTAVO_FP8_GEMV_NORM")

    for p in producers:
        handles.append(p.register_forward_hook(tag))
        handles.append(p.register_forward_pre_hook(norm_in))
    for layer in fp8:
        handles.append(layer.register_forward_pre_hook(seen))
        handles.append(layer.register_forward_hook(lin_out))
    handles.append(model.register_forward_hook(finish))
    out = {"fp8_producers_armed": len(producers)} if fuse else {}
    return {**out, **({"MLP(fp8 gemv+silu)": silu} if silu else {}), **({"attn(fp8 qkv gemv+rope)": rope} if rope else {})}

