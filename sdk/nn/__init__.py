"""``octavo.nn``: the layers model plugins are built from.

Linear layers shard for tensor parallelism and accept a quantization ``LinearMethod``; every parameter has
a ``weight_loader``; the ``Attention`` layer delegates to the attention backend the model runner binds.
Importing this package imports torch (it is not imported by ``import octavo``).
"""

from octavo.nn.activation import GeluAndMul, SiluAndMul, get_act_and_mul
from octavo.nn.attention import Attention
from octavo.nn.embedding import ParallelLMHead, VocabParallelEmbedding
from octavo.nn.layernorm import LayerNorm, RMSNorm
from octavo.nn.linear import (
    ColumnParallelLinear,
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
    default_weight_loader,
    set_weight_attrs,
)
from octavo.nn.parallel import get_tp_rank, get_tp_size, set_tensor_parallel_group
from octavo.nn.rotary import RotaryEmbedding, get_rope, rope_config

__all__ = [
    "Attention", "ColumnParallelLinear", "GeluAndMul", "LayerNorm", "LinearBase", "MergedColumnParallelLinear",
    "ParallelLMHead", "QKVParallelLinear", "RMSNorm", "ReplicatedLinear", "RotaryEmbedding", "RowParallelLinear",
    "SiluAndMul", "UnquantizedLinearMethod", "VocabParallelEmbedding", "default_weight_loader", "get_act_and_mul",
    "get_rope", "get_tp_rank", "get_tp_size", "rope_config", "set_tensor_parallel_group", "set_weight_attrs",
]
