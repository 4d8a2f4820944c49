"""Every built-in speculative-decoding proposer, registered by lazy ``"module:Class"`` targets.

This is the entry-point module (``spec_decode`` in group ``octavo``): it imports nothing heavy. Built-ins
are ``trylast``, so an installed plugin registering the same method shadows them. ``medusa``,
``mlp_speculator``, ``eagle`` and ``eagle3`` are heads on the target's hidden states (``octavo.spec_heads``:
they draft on the worker, next to the target).
"""

from octavo import hookimpl

_PKG = "octavo.plugins.spec_decode"

# method name (as in speculative_config) -> "module:Class"
SPECULATORS = {
    "ngram": f"{_PKG}.ngram:NgramProposer",
    "draft_model": f"{_PKG}.draft_model:DraftModelProposer",
    "medusa": f"{_PKG}.medusa:MedusaSpeculator",
    "mlp_speculator": f"{_PKG}.mlp_speculator:MLPSpeculatorProposer",
    "eagle": f"{_PKG}.eagle:EagleSpeculator",
    "eagle3": f"{_PKG}.eagle:Eagle3Speculator",
}


@hookimpl(trylast=True)
def octavo_register_speculators(register):
    for method, target in SPECULATORS.items():
        register(method, target)
