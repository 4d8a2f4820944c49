"""Batch-1 CPU decode of a quantized Llama-family model in ONE C call per token (issue 18, issue 9's CPU ratio).

Why: after the int8-activation kernels, a batch-1 step of the embedded SmolLM2 GGUF was dominated by the ~1,500
small eager ops around them (norms, rotary, cache writes, residual adds, SiLU, each with Python and dispatcher
cost), ~36 ms eager and ~19 ms compiled per token at 2 threads against llama.cpp's 11.5 ms
(docs/performance.md "Goals of issue 18"). This runner replaces the whole decoder stack of a one-token decode
step by :mod:`.cpu_fused_decode_src`'s ``fused_decode``: embedding row -> for each layer RMSNorm, QKV,
rotary, K/V write into the paged cache, attention, O, residual, RMSNorm, gate_up, SiLU-and-mul, down,
residual -> final RMSNorm, all in C; the LM head and sampling stay where they are.

The linears call :mod:`octavo.plugins.quant.cpu_int8act`'s ``qa8_gemm`` and the attention
``cpu_paged``'s ``paged_rows`` (function pointers into their own libraries), so those compute the same
arithmetic as the per-op path; the hidden state between them stays float32 (no rounding to the model dtype
between ops), so the result equals the per-op path to rounding, not bit for bit (tests/quant/
test_cpu_fused_decode.py: the per-op fp32 path within a tolerance, and greedy agreement on the real GGUF).

It runs only where it computes exactly what the eager model would: a ``LlamaForCausalLM`` (``model_type``
llama), every linear a CPU int4/int8 layer with int8 activations (the GGUF methods; no bias, no act-order),
SiLU, neox rotary over the whole head, the ``cpu_paged`` backend over a float32/bfloat16 cache, no tensor or
pipeline parallelism, no module hooks (LoRA, speculator heads); :func:`unsupported_reason` names the first
thing that is not so, and such a model keeps the per-op path. Steps other than a single one-token decode
return ``None`` (eager, or the compiled runner when one is given). ``OCTAVO_CPU_FUSED_DECODE=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import operator

import torch

from octavo.plugins.attention import _cpu_paged_kernel
from octavo.plugins.platforms.cpu_fused_decode_src import C_SOURCE
from octavo.plugins.quant import cpu_int8act, cpu_int8act_ops
from octavo.plugins.quant.cpu_build import cached_library

ENV = "OCTAVO_CPU_FUSED_DECODE"
_I64, _P = ctypes.c_int64, ctypes.c_void_p
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-strict-aliasing", "-ffp-contract=off"]
_state: dict[str, object] = {}


class _Lin(ctypes.Structure):
    _fields_ = [("bits", _I64), ("n", _I64), ("k", _I64), ("w", _P), ("s", _P), ("z", _P)]


class _Layer(ctypes.Structure):
    _fields_ = [("ln1", _P), ("ln2", _P), ("qkv", _Lin), ("o", _Lin), ("gu", _Lin), ("dn", _Lin),
                ("kc", _P), ("vc", _P)]


class _Stack(ctypes.Structure):
    _fields_ = [(n, _I64) for n in ("nlayers", "hidden", "nh", "kvh", "d", "inter", "bs", "kv_bf16", "w_bf16",
                                    "embed_bf16", "nthreads", "attn_abi")] + [
        ("eps", ctypes.c_double), ("scale", ctypes.c_double), ("embed", _P), ("final_norm", _P),
        ("gemm", _P), ("attn", _P), ("layers", ctypes.POINTER(_Layer)), ("quant", _P), ("q4", _P), ("q8", _P)]


def library() -> ctypes.CDLL | None:
    """The fused stack's library, or None (reason in ``_state["why"]``; ``OCTAVO_CPU_FUSED_DECODE=0``)."""
    return cached_library(_state, C_SOURCE, "octavo_fused_decode", _FLAGS,
                          {name: ([_P, _I64, _P, _P, _I64, _P, ctypes.c_int, _I64, _P], ctypes.c_int)
                           for name in ("fused_decode", "fused_decode_team")},
                          switch=ENV)


def _linear_args(module) -> tuple | None:
    """``(bits, w, s, z)`` of a CPU int4 / int8 linear with int8 activations, else None."""
    qm = getattr(module, "quant_method", None)
    if getattr(module, "bias", None) is not None or not getattr(qm, "int8_activations", False):
        return None
    if getattr(qm, "input_perm", False):
        return None
    if hasattr(module, "w4"):
        return 4, module.w4, module.s32, module.z32
    if hasattr(module, "s32") and getattr(module, "qweight", None) is not None and module.qweight.dtype == torch.int8:
        return 8, module.qweight, module.s32, None
    return None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when :class:`CpuFusedDecodeRunner` computes this model's decode step exactly as its modules would,
    else the first reason it does not (see the module docstring)."""
    from octavo.nn.parallel import get_tp_size

    config = getattr(model, "config", None)
    if type(model).__name__ != "LlamaForCausalLM" or getattr(config, "model_type", None) != "llama":
        return f"{type(model).__name__}: only LlamaForCausalLM (model_type llama) has a fused decode stack"
    if get_tp_size() > 1:
        return "tensor parallelism"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "the MLP is not a bias-free SiLU MLP"
    if not cpu_int8act_ops.enabled():
        return "int8-activation kernels are off (OCTAVO_CPU_INT8_ACT=0 or not buildable)"
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks:
            return f"{type(m).__name__} has forward hooks (LoRA, a speculator head): the fused stack would skip them"
    inner = model.model
    layers = list(inner.layers)
    if inner.start_layer != 0 or inner.end_layer != len(layers) or type(inner.norm).__name__ != "RMSNorm":
        return "pipeline parallelism"
    for layer in layers:
        att = layer.self_attn
        for name, mod in (("qkv_proj", att.qkv_proj), ("o_proj", att.o_proj), ("gate_up_proj", layer.mlp.gate_up_proj),
                          ("down_proj", layer.mlp.down_proj)):
            if _linear_args(mod) is None:
                return f"{name} is not a CPU int4/int8 linear with int8 activations (GGUF), or has a bias"
        rot, a = att.rotary_emb, att.attn
        if not rot.is_neox_style or rot.rotary_dim != att.head_dim or rot.cos_cache.dtype != torch.float32:
            return "rotary is not neox-style over the whole head"
        impl = getattr(a.impl, "impl", a.impl)  # the compiled runner wraps the bound backend
        if getattr(impl, "name", None) != "cpu_paged":
            return f"attention backend {type(impl).__name__}: the fused stack runs cpu_paged's kernel"
        if a.sliding_window is not None or a.logits_soft_cap is not None:
            return "sliding window / logits soft cap"
        cache = a.kv_cache
        if cache is None or not _cpu_paged_kernel.shape_supported(cache, a.num_heads):
            return "the KV cache is not a float32/bfloat16 [2, blocks, block_size, kv_heads, d] cache"
        if att.head_dim % 2 or layer.input_layernorm.weight.dtype not in (torch.float32, torch.bfloat16):
            return "odd head size or norm dtype"
    if inner.embed_tokens.weight.dtype not in (torch.float32, torch.bfloat16):
        return "embedding dtype"
    if _cpu_paged_kernel.library() is None or library() is None:
        return f"a C kernel cannot be built: {_cpu_paged_kernel.unavailable_reason() or _state.get('why')}"
    return _abi_reason()


def same_bits_reason(model: torch.nn.Module, dtype: torch.dtype) -> str | None:
    """None when the per-op path of ``model`` computes the fused stack's bits (its norms, rotary and SiLU-and-mul
    run the C kernels whose arithmetic the stack copies, everything in ``dtype``), else why not. Only then may the
    fused stack be the default: batch 1 and batch > 1, decode and prefill give the same hidden states."""
    from octavo.nn.activation import SiluAndMul
    from octavo.nn.layernorm import RMSNorm
    from octavo.nn.rotary import RotaryEmbedding

    from . import cpu_norm, cpu_rope, cpu_silu

    inner = model.model
    if inner.embed_tokens.weight.dtype != dtype:
        return "the embedding is not in the model dtype"
    for m in model.modules():
        if type(m) is RMSNorm and (m.weight.dtype != dtype or not cpu_norm.installed(m)):
            return "an RMSNorm does not run cpu_norm's kernel (OCTAVO_CPU_C_NORM=0?)"
        f = getattr(m.__dict__.get("forward"), "__func__", None)
        if type(m) is SiluAndMul and f is not cpu_silu.silu_forward:
            return "SiLU-and-mul does not run cpu_silu's kernel (OCTAVO_CPU_FUSED_SILU=0 or not the same bits here)"
        if type(m) is RotaryEmbedding and f is not cpu_rope.rope_forward:
            return "rotary does not run cpu_rope's kernel (OCTAVO_CPU_FUSED_ROPE=0 or not the same bits here)"
    if inner.layers[0].mlp.gate_up_proj.output_size % (2 * cpu_silu.ROW_MULTIPLE):
        return "the MLP width is not a multiple of cpu_silu's row tile"
    return None


def _fn_ptr(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


_C = ctypes
#: the C signatures fused_decode can call ``paged_rows`` with (typedefs attn0_fn, attn_fn); another one is refused
PAGED_ROWS_ABIS = {
    0: ([_C.c_void_p] * 3 + [_C.c_int, _C.c_void_p, _C.c_int] + [_C.c_void_p] * 4 + [_C.c_int] * 5
        + [_C.c_float, _C.c_void_p, _C.c_int], None),
    1: ([_C.c_void_p, _C.c_int, _C.c_long, _C.c_void_p, _C.c_void_p, _C.c_int, _C.c_void_p, _C.c_int]
        + [_C.c_void_p] * 4 + [_C.c_int] * 5 + [_C.c_float, _C.c_void_p, _C.c_int, _C.c_int], _C.c_int)}
QA8_GEMM_ARGTYPES = [_C.c_int, _C.c_void_p] + [_C.c_int] * 3 + [_C.c_void_p] * 3 + [_C.c_int, _C.c_void_p, _C.c_int]
#: cpu_int8act's split form (fused_decode_team): name -> (argtypes, restype)
INT8ACT_SPLIT = {"quant_act": ([_C.c_void_p] + [_C.c_int] * 4 + [_C.c_void_p] * 3, None),
                 "q4a8_gemm_q": ([_C.c_void_p] * 3 + [_C.c_int] * 2 + [_C.c_void_p] * 3
                                 + [_C.c_int, _C.c_void_p, _C.c_int], _C.c_int),
                 "q8a8_gemm_q": ([_C.c_void_p] * 2 + [_C.c_int] * 2 + [_C.c_void_p] * 2
                                 + [_C.c_int, _C.c_void_p, _C.c_int], _C.c_int)}


def _paged_abi() -> int | None:
    attn = _cpu_paged_kernel.library().paged_rows
    return next((k for k, (args, res) in PAGED_ROWS_ABIS.items() if list(attn.argtypes) == args and attn.restype is res),
                None)


def _abi_reason() -> str | None:
    """The kernels are called through C function pointers: their ctypes signatures must be the ones compiled in."""
    gemm = cpu_int8act.library().qa8_gemm
    if _paged_abi() is None:
        return "cpu_paged's paged_rows has another signature than the fused stack was written for"
    if list(gemm.argtypes) != QA8_GEMM_ARGTYPES or gemm.restype is not _C.c_int:
        return "cpu_int8act's qa8_gemm has another signature than the fused stack was written for"
    for name, (args, res) in INT8ACT_SPLIT.items():
        fn = getattr(cpu_int8act.library(), name)
        if list(fn.argtypes) != args or fn.restype is not res:
            return f"cpu_int8act's {name} has another signature than the fused stack was written for"
    return None


class CpuFusedDecodeRunner:
    """:class:`octavo.platform.StepRunner` for single-request one-token decode steps (see the module docstring).

    ``fallback``: another step runner asked for every step this one does not take (the compiled runner)."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, fallback=None) -> None:
        why = unsupported_reason(model)
        if why is not None:
            raise ValueError(f"fused CPU decode: {why}")
        self.model, self.dtype, self.fallback = model, dtype, fallback
        self.lib = library()
        self.num_runs = 0
        #: True: fused_decode_team (one OpenMP region per token, the linears' rows split over the threads);
        #: False: fused_decode (each kernel opens its own region). Same bits (tests); the team form syncs less.
        self.team = True
        self._build()

    @property
    def holds_addresses(self) -> bool:
        """False unless the fallback holds some: this runner finds every tensor again at each step (``_stale``), so
        sleep mode may move the weights and KV cache (octavo.platform.StepRunner)."""
        return self.fallback is not None and getattr(self.fallback, "holds_addresses", True)

    def _slots(self) -> list[tuple[dict, str]]:
        """Where every tensor whose address the C struct holds lives: ``(the module's dict, name)``."""
        inner, out = self.model.model, []

        def slot(m, name):
            d = m._parameters if name in m._parameters else m._buffers if name in m._buffers else m.__dict__
            out.append((d, name))
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            slot(layer.input_layernorm, "weight"), slot(layer.post_attention_layernorm, "weight")
            slot(att.attn, "kv_cache"), slot(att.rotary_emb, "cos_cache"), slot(att.rotary_emb, "sin_cache")
            for mod in (att.qkv_proj, att.o_proj, mlp.gate_up_proj, mlp.down_proj):
                for name in (("w4", "s32", "z32") if _linear_args(mod)[0] == 4 else ("qweight", "s32")):
                    slot(mod, name)
        slot(inner.embed_tokens, "weight"), slot(inner.norm, "weight")
        return out

    def _stale(self) -> bool:
        """Whether a held tensor was replaced (another object in its slot, or new data in place: reload_weights
        swaps ``.data``); then the C struct is rebuilt. ~1 us per layer of dict lookups and data_ptr calls."""
        dicts, names = self._slot_cols
        return not all(map(operator.is_, map(dict.get, dicts, names), self._hold)) or \
            list(map(torch.Tensor.data_ptr, self._hold)) != self._ptrs

    def _build(self) -> None:
        inner = self.model.model
        layers = list(inner.layers)
        att0 = layers[0].self_attn
        cache0 = att0.attn.kv_cache
        self._slot_list = self._slots()
        self._slot_cols = ([d for d, _ in self._slot_list], [n for _, n in self._slot_list])
        self._hold = [d[name] for d, name in self._slot_list]
        self._ptrs = [t.data_ptr() for t in self._hold]
        lins = []
        arr = (_Layer * len(layers))()
        for i, layer in enumerate(layers):
            att, mlp = layer.self_attn, layer.mlp
            for name, mod in (("qkv", att.qkv_proj), ("o", att.o_proj), ("gu", mlp.gate_up_proj),
                              ("dn", mlp.down_proj)):
                bits, w, s, z = _linear_args(mod)
                n = w.shape[0]
                k = w.shape[1] * (2 if bits == 4 else 1)
                for t in (w, s, z):
                    if t is not None and not t.is_contiguous():
                        raise ValueError(f"fused CPU decode: {name} weights are not contiguous")
                setattr(arr[i], name, _Lin(bits, n, k, w.data_ptr(), s.data_ptr(), z.data_ptr() if z is not None else 0))
                lins.append((name, n, k))
            cache = att.attn.kv_cache
            arr[i].ln1 = layer.input_layernorm.weight.data_ptr()
            arr[i].ln2 = layer.post_attention_layernorm.weight.data_ptr()
            arr[i].kc, arr[i].vc = cache[0].data_ptr(), cache[1].data_ptr()
            if not torch.equal(att.rotary_emb.cos_cache, att0.rotary_emb.cos_cache):
                raise ValueError("fused CPU decode: layers with different rotary tables")
        hidden, nh, kvh, d = layers[0].input_layernorm.weight.shape[0], att0.num_heads, att0.num_kv_heads, att0.head_dim
        inter = lins[2][1] // 2
        want = {"qkv": ((nh + 2 * kvh) * d, hidden), "o": (hidden, nh * d), "gu": (2 * inter, hidden),
                "dn": (hidden, inter)}
        for name, n, k in lins:
            if (n, k) != want[name]:
                raise ValueError(f"fused CPU decode: {name} is {n} x {k}, expected {want[name]}")
        norms = [m.weight for m in inner.modules() if type(m).__name__ == "RMSNorm"]
        wdt = norms[0].dtype
        if any(w.dtype != wdt or w.shape != (hidden,) or not w.is_contiguous() for w in norms):
            raise ValueError("fused CPU decode: norm weights of mixed dtypes or shapes")
        eps = {float(m.eps) for m in inner.modules() if type(m).__name__ == "RMSNorm"}
        if len(eps) != 1:
            raise ValueError("fused CPU decode: norms with different eps")
        self._layers = arr
        self._stack = _Stack(nlayers=len(layers), hidden=hidden, nh=nh, kvh=kvh, d=d, inter=inter,
                             bs=cache0.shape[2], kv_bf16=int(cache0.dtype == torch.bfloat16),
                             w_bf16=int(wdt == torch.bfloat16),
                             embed_bf16=int(inner.embed_tokens.weight.dtype == torch.bfloat16), nthreads=1,
                             eps=eps.pop(), scale=float(att0.attn.impl.scale), embed=inner.embed_tokens.weight.data_ptr(),
                             final_norm=inner.norm.weight.data_ptr(), gemm=_fn_ptr(cpu_int8act.library().qa8_gemm),
                             attn=_fn_ptr(_cpu_paged_kernel.library().paged_rows), attn_abi=_paged_abi(),
                             layers=ctypes.cast(arr, ctypes.POINTER(_Layer)),
                             **{k: _fn_ptr(getattr(cpu_int8act.library(), n)) for k, n in
                                (("quant", "quant_act"), ("q4", "q4a8_gemm_q"), ("q8", "q8a8_gemm_q"))})
        self._cos, self._sin = att0.rotary_emb.cos_cache, att0.rotary_emb.sin_cache
        self._hidden, self._half = hidden, d // 2

    def maybe_run(self, inputs) -> torch.Tensor | None:
        layout = inputs.layout
        if inputs.input_ids.shape[0] != 1 or layout.num_decode_reqs != 1 or layout.query_start_loc.shape[0] != 2:
            return self.fallback.maybe_run(inputs) if self.fallback is not None else None
        if self._stale():
            self._build()
        pos, length = int(inputs.positions[0]), int(layout.seq_lens[0])
        table = layout.block_tables[0]
        if length != pos + 1 or pos >= self._cos.shape[0] or table.dtype not in (torch.int32, torch.int64) \
                or not table.is_contiguous() or table.shape[0] * self._stack.bs < length:
            return self.fallback.maybe_run(inputs) if self.fallback is not None else None
        self._stack.nthreads = torch.get_num_threads()
        out = torch.empty(1, self._hidden, dtype=torch.float32)
        fn = self.lib.fused_decode_team if self.team else self.lib.fused_decode
        rc = fn(ctypes.byref(self._stack), int(inputs.input_ids[0]),
                                   self._cos.data_ptr() + 4 * pos * self._half, self._sin.data_ptr() + 4 * pos * self._half,
                                   int(layout.slot_mapping[0]), table.data_ptr(), int(table.dtype == torch.int64),
                                   length, out.data_ptr())
        if rc:
            raise RuntimeError(f"fused CPU decode step failed ({rc})")
        self.num_runs += 1
        return out.to(self.dtype)
