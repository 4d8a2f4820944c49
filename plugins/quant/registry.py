"""Every built-in quantizer, registered by lazy ``"module:Class"`` targets under its ``quant_method`` name.

This is the entry-point module (``quant`` in group ``octavo``): it imports nothing heavy; a quantizer's
module (and torch) is imported only when a model is loaded with it. Built-ins are ``trylast``, so an
installed plugin registering the same name shadows them.
"""

from octavo import hookimpl

_PKG = "octavo.plugins.quant"

# quant_method -> "module:Class"
QUANTIZERS = {
    "gguf": f"{_PKG}.gguf:GGUFQuantizer",
    "int8": f"{_PKG}.weight_only:Int8Quantizer",
    "int4": f"{_PKG}.weight_only:Int4Quantizer",
    "gptq": f"{_PKG}.gptq_awq:GPTQQuantizer",
    "awq": f"{_PKG}.gptq_awq:AWQQuantizer",
    "fp8": f"{_PKG}.fp8:FP8Quantizer",
    "compressed-tensors": f"{_PKG}.compressed_tensors:CompressedTensorsQuantizer",
}


@hookimpl(trylast=True)
def octavo_register_quantizers(register):
    for name, target in QUANTIZERS.items():
        register(name, target)
