"""Every built-in attention backend, registered by lazy ``"module:Class"`` targets (entry point ``attention``).

Registry name == module name: ``torch_sdpa`` (the reference, pure PyTorch, every device), ``cpu_paged`` (the
CPU default: a C decode kernel over the paged cache, causal SDPA for fresh prompts), ``triton`` and
``flashinfer`` (GPU kernels, extra ``octavo[cuda]``). Importing this module imports no torch and no kernel
library; a backend's module is imported only when the backend is resolved. Which platforms a backend suits
is declared on the class (``platform_priority``), not here and not in any platform.
"""

from octavo import hookimpl

BACKENDS = {
    "torch_sdpa": "octavo.plugins.attention.torch_sdpa:TorchSDPABackend",
    "cpu_paged": "octavo.plugins.attention.cpu_paged:CpuPagedAttentionBackend",
    "triton": "octavo.plugins.attention.triton:TritonAttentionBackend",
    "flashinfer": "octavo.plugins.attention.flashinfer:FlashInferAttentionBackend",
}


@hookimpl(trylast=True)
def octavo_register_attention_backends(register):
    for name, target in BACKENDS.items():
        register(name, target)
