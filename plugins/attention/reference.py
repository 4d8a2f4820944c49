"""Entry-point module of the reference attention backend ``torch_sdpa``: registers it by lazy target, so that
loading the plugin imports no torch (the backend's module is imported only when it is resolved)."""

from octavo import hookimpl


@hookimpl(trylast=True)
def octavo_register_attention_backends(register):
    register("torch_sdpa", "octavo.plugins.attention.torch_sdpa:TorchSDPABackend")
