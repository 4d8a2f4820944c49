"""Where :mod:`.cpu_int8act`'s kernels enter the engine: the on/off switch and the ops the compiled graph calls.

Why a separate module: :mod:`.cpu_kernel` routes a linear here when its caller accepts int8 activations
(``act8=True``: the GGUF methods, whose file format llama.cpp runs this way), for **every** row count, unless
``OCTAVO_CPU_INT8_ACT=0`` (an :func:`octavo.env_flags.env_switch`; default on since session 6: opt-in for the
end of session 5, until the ``cpu_paged`` attention became prefix-cache invariant). Session 4 ran only
steps of <= 16 rows this way and bigger steps with fp32 activations, so a request's greedy tokens depended on how
many requests shared its step; now every row takes the same kernel and the same per-row arithmetic
(docs/quantization.md). ``0`` gives the exact fp32-activation kernels everywhere; when the integer kernels cannot
be built, a warning names the reason once and the fp32 kernels run.

Under ``torch.compile`` each linear is one call of the op ``octavo_cpu::int4_a8`` / ``int8_a8``, defined with
a plain :class:`torch.library.Library` (a Python CPU kernel and a fake): about 10 us of dispatch a call on
this VM, against ~30 us for a ``torch.library.custom_op`` (benchmarks/cpu_kernel_bw.py ``per_call_us_*``).
"""

from __future__ import annotations

import logging

import torch

from octavo.env_flags import env_switch
from octavo.plugins.quant import cpu_int8act

logger = logging.getLogger(__name__)

_state: dict[str, object] = {}


def _constant_result(fn):
    # NOTE: torch.compiler.assume_constant_result(fn) only sets this attribute (torch 2.4-2.13), but it imports
    # torch._dynamo first: ~2 s of `octavo serve`'s start on a CPU (docs/performance.md "Start-up"). Set it here.
    fn._dynamo_marked_constant = True
    return fn


@_constant_result
def enabled() -> bool:
    """Whether act8 callers get the integer kernels (read once per process; tests reset ``_state``)."""
    if "on" not in _state:
        on = env_switch("OCTAVO_CPU_INT8_ACT", default=True)
        if on:
            try:
                cpu_int8act.library()
            except (OSError, RuntimeError) as e:
                logger.warning("int8-activation CPU kernels unavailable (%s): GGUF layers keep the fp32 kernels", e)
                on = False
        _state["on"] = on
    return bool(_state["on"])


def int4_linear(x: torch.Tensor, w4: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.octavo_cpu.int4_a8(x, w4, s, z)
    return cpu_int8act.int4_linear(x, w4, s, z)


def int8_linear(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.octavo_cpu.int8_a8(x, w8, s)
    return cpu_int8act.int8_linear(x, w8, s)


_lib = torch.library.Library("octavo_cpu", "DEF")
_lib.define("int4_a8(Tensor x, Tensor w4, Tensor s, Tensor z) -> Tensor")
_lib.define("int8_a8(Tensor x, Tensor w8, Tensor s) -> Tensor")
_lib.impl("int4_a8", cpu_int8act.int4_linear, "CPU")
_lib.impl("int8_a8", cpu_int8act.int8_linear, "CPU")


@torch.library.register_fake("octavo_cpu::int4_a8", lib=_lib)
def _(x, w4, s, z):
    return x.new_empty((x.shape[0], w4.shape[0]), dtype=torch.float32)


@torch.library.register_fake("octavo_cpu::int8_a8", lib=_lib)
def _(x, w8, s):
    return x.new_empty((x.shape[0], w8.shape[0]), dtype=torch.float32)
