"""The ``Quantizer`` interface and the build-time quantization scope that linear layers consult.

A quantizer is registered under its Hugging Face ``quant_method`` name (``gptq``, ``awq``, ``fp8``, ...).
The loader resolves one per model (from the ``quantization`` setting or the checkpoint), then builds the
model inside :func:`quantization_scope`; each ``octavo.nn`` linear layer asks :func:`linear_method_for` for
its method by prefix, so model files never mention quantization::

    with quantization_scope(quantizer, model_cls.packed_modules_mapping):
        model = model_cls(config=cfg)           # LinearBase(prefix="...qkv_proj") -> linear_method_for(prefix)
    model.load_weights(quantizer.adapt_weights(checkpoint))   # on-disk tensors -> the methods' parameters

``adapt_weights`` groups each projection's on-disk tensors (``q_proj.qweight``, ``q_proj.scales``, ...) and
lets its method convert them into parameters laid out like a dense weight (output rows first, input
columns second), so the ordinary fused ``weight_loader`` of ``qkv_proj`` / ``gate_up_proj`` places quantized
shards exactly as it places dense ones, tensor-parallel narrowing included.
"""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from octavo.platform import Availability

if TYPE_CHECKING:
    import torch


@dataclass
class GGUFBlocks:
    """A GGUF tensor kept in its ggml block format (rows of raw bytes), for quantizers that repack it.

    Attributes:
        data: ``uint8 [rows, bytes per row]`` (rows in torch order, llama.cpp's q/k permutation undone).
        ggml_type: the ggml type number (2 = Q4_0, 3 = Q4_1, 8 = Q8_0, 12 = Q4_K, 13 = Q5_K, 14 = Q6_K, ...).
        shape: the tensor's torch shape ``(rows, columns)``.
    """

    data: Any
    ggml_type: int
    shape: tuple[int, ...]


class LinearMethod(ABC):
    """How one linear layer creates, loads, post-processes and applies its (quantized) weights.

    The method works on the sizes it is given (this rank's shard when tensor parallel); parameters mark
    their split dimensions with ``output_dim`` / ``input_dim`` so the layer's loader narrows them.
    """

    #: on-disk tensor suffixes one projection needs before :meth:`convert` can run (``("weight",)`` = dense).
    checkpoint_suffixes: ClassVar[tuple[str, ...]] = ("weight",)

    @abstractmethod
    def create_weights(
        self, layer: torch.nn.Module, input_size: int, output_sizes: list[int], params_dtype: torch.dtype
    ) -> None:
        """Register the layer's parameters (each with a ``weight_loader`` attribute)."""

    def convert(self, tensors: dict[str, Any], module: str) -> dict[str, torch.Tensor]:
        """One projection's on-disk tensors (suffix -> tensor) -> this method's parameters (suffix -> tensor)."""
        return tensors

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack or transpose loaded weights into the layout ``apply`` wants (runs once, after loading)."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W^T (+ bias)`` with this scheme's weights."""


class Quantizer(ABC):
    """A quantization scheme. Registered under its Hugging Face ``quant_method`` name.

    Class attributes tell the resolver (and ``octavo plugins``) what the scheme is for:
    ``device_types`` it runs on, and whether it can quantize a dense checkpoint at load
    (``quantizes_dense``) or needs a checkpoint already in its format (``reads_checkpoint``).
    """

    name: ClassVar[str]
    #: device types (``Platform.device_type``) the scheme has kernels for, e.g. ``("cpu", "cuda")``.
    device_types: ClassVar[tuple[str, ...]] = ()
    #: ``quantization=<name>`` on a dense checkpoint quantizes it while loading.
    quantizes_dense: ClassVar[bool] = False
    #: the scheme reads checkpoints saved in its own format (``quantization_config.quant_method == name``).
    reads_checkpoint: ClassVar[bool] = True

    packed_modules_mapping: dict[str, list[str]]

    @classmethod
    @abstractmethod
    def from_config(cls, hf_quant_config: dict[str, Any]) -> Quantizer:
        """Build from the checkpoint's ``quantization_config`` dict (``{"quant_method": name}`` when online)."""

    def supports(self, platform: Any) -> Availability:
        """Whether this scheme runs on ``platform`` (a :class:`octavo.Platform`); default: by device type."""
        if platform.device_type in self.device_types:
            return Availability(True)
        return Availability(False, f"{self.name} has kernels for {', '.join(self.device_types) or 'no device'}, "
                                   f"not for {platform.device_type}")

    @abstractmethod
    def get_linear_method(self, layer_prefix: str) -> LinearMethod | None:
        """The method for the linear layer at ``layer_prefix``, or None to leave it unquantized."""

    def get_lm_head_method(self) -> LinearMethod | None:
        """A method for the LM head (``ParallelLMHead``), or None to keep it dense (the default).

        The head keeps its dense weight (a tied head shares it with the embedding lookup); the method's
        ``process_weights_after_loading`` builds its own copy from ``layer.weight`` and ``apply`` computes
        the logits from it.
        """
        return None

    # ------------------------------------------------------------------ used by the loader
    def part_prefixes(self, layer_prefix: str) -> list[str]:
        """The checkpoint modules a (possibly fused) layer is made of: ``qkv_proj`` -> ``[q_proj, k_proj, v_proj]``."""
        head, _, last = layer_prefix.rpartition(".")
        parts = getattr(self, "packed_modules_mapping", {}).get(last)
        if not parts:
            return [layer_prefix]
        return [f"{head}.{p}" if head else p for p in parts]

    def adapt_weights(self, weights: Iterable[tuple[str, Any]],
                      methods: dict[str, LinearMethod]) -> Iterator[tuple[str, Any]]:
        """Turn each quantized projection's on-disk tensors into its method's parameters; pass the rest through.

        Args:
            weights: the checkpoint's ``(name, tensor)`` stream.
            methods: layer prefix -> the method the layer was built with (from :func:`quantization_scope`).

        Raises:
            ValueError: a projection's tensors are incomplete at the end of the checkpoint.
        """
        by_module: dict[str, LinearMethod] = {}
        for prefix, method in methods.items():
            for part in self.part_prefixes(prefix):
                by_module[part] = method
        pending: dict[str, dict[str, Any]] = {}
        for name, tensor in weights:
            module, _, suffix = name.rpartition(".")
            method = by_module.get(module)
            if method is None or suffix not in method.checkpoint_suffixes:
                yield name, tensor
                continue
            parts = pending.setdefault(module, {})
            parts[suffix] = tensor
            if all(s in parts for s in method.checkpoint_suffixes):
                for out_suffix, out in method.convert(pending.pop(module), module).items():
                    yield f"{module}.{out_suffix}", out
        if pending:
            module, parts = next(iter(pending.items()))
            need = by_module[module].checkpoint_suffixes
            raise ValueError(f"{self.name} checkpoint: {module} has {sorted(parts)} but lacks "
                             f"{sorted(set(need) - set(parts))} ({len(pending)} projections incomplete)")


# ---------------------------------------------------------------------- the build-time scope

@dataclass
class _Scope:
    quantizer: Quantizer
    methods: dict[str, LinearMethod]


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("octavo_quant_scope", default=None)


@contextmanager
def quantization_scope(quantizer: Quantizer | None, packed_modules_mapping: dict[str, list[str]] | None = None):
    """Build a model under ``quantizer``: yields the dict of layer prefix -> method that layers fill in.

    Used by the loader around the model constructor (build time only; ``forward`` never reads it).
    """
    if quantizer is None:
        yield {}
        return
    quantizer.packed_modules_mapping = dict(packed_modules_mapping or {})
    scope = _Scope(quantizer, {})
    token = _SCOPE.set(scope)
    try:
        yield scope.methods
    finally:
        _SCOPE.reset(token)


def lm_head_method() -> LinearMethod | None:
    """The LM-head method of the active quantizer (None: dense logits, or no scope)."""
    scope = _SCOPE.get()
    return scope.quantizer.get_lm_head_method() if scope is not None else None


def linear_method_for(prefix: str) -> LinearMethod | None:
    """The linear method the active quantizer gives the layer at ``prefix`` (None: dense, or no scope)."""
    scope = _SCOPE.get()
    if scope is None:
        return None
    method = scope.quantizer.get_linear_method(prefix)
    if method is not None:
        scope.methods[prefix] = method
    return method
