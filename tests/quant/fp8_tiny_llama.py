"""A loader-built tiny random Llama with the fp8 quantizer, on the CPU, for the interpreted fp8 tests' child scripts.

The fp8 quantizer is refused on a CPU platform, so it is resolved for a CUDA-like one; the weights stay on the CPU
where the Triton interpreter (``TRITON_INTERPRET=1``) runs the kernels. Imported by the child processes of
test_fp8_fused.py, test_fp8_gemv_norm.py and test_fp8_attn_rope.py (they run from the repository root).
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

from octavo.config import OctavoSettings
from octavo.core.loader import load_model, resolve_model
from octavo.core.loader.quant import resolve_quantizer
from octavo.core.plugin_manager import get_plugin_manager
from octavo.plugins.quant.fp8 import _FP8Method


class CudaLike:  # the resolver's view of a CUDA platform (fp8 is refused on CPU)
    name, device_type = "cuda", "cuda"


def tiny_fp8_llama(num_layers: int = 2, one_row_gemv: bool = False) -> torch.nn.Module:
    """The model (bf16 activations, e4m3 weights, dummy load). ``one_row_gemv``: every fp8 linear takes the Triton
    kernels as on a GPU (per-token quantization and the one-row GEMV, input quantized by its producer allowed)."""
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=96,
               num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
               max_position_embeddings=128, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False)
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    resolved = resolve_model(OctavoSettings.from_kwargs(model=d, load_format="dummy").model)
    pm = get_plugin_manager()
    model = load_model(resolved, model_cls=pm.resolve("models", resolved.architecture), dtype=torch.bfloat16,
                       device="cpu", quantizer=resolve_quantizer("fp8", resolved, CudaLike(), pm))
    if one_row_gemv:
        for m in model.modules():
            if isinstance(getattr(m, "quant_method", None), _FP8Method):
                m.quant_method.fused, m.quant_method.gemv_max_m, m.quant_method.gemv_pre_ok = True, 1, True
    return model
