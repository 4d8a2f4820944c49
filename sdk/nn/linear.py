"""Linear layers that shard for tensor parallelism and take an optional quantization ``LinearMethod``.

Every parameter carries a ``weight_loader(param, loaded, shard_id=None)`` so a model's ``load_weights`` needs
nothing but names: the loader narrows the checkpoint tensor to this rank's shard and, for fused layers
(``qkv_proj``, ``gate_up_proj``), copies it into the right slice of the fused parameter. Parameters mark the
dimension that is split across ranks with ``output_dim`` / ``input_dim`` attributes (as vLLM does), so a
quantization method's own parameters load through the same code.

    ColumnParallelLinear        W [out/tp, in]        y_r = x W_r^T                 (no communication)
    MergedColumnParallelLinear  [gate; up] each split  shard_id 0, 1, ...
    QKVParallelLinear           [q; k; v] by heads     shard_id "q", "k", "v"
    RowParallelLinear           W [out, in/tp]        y = all_reduce(x_r W_r^T) + b
    ReplicatedLinear            full W on every rank
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.nn.parallel import divide, get_tp_rank, get_tp_size, tp_all_gather, tp_all_reduce
from octavo.quant import LinearMethod, linear_method_for


def set_weight_attrs(param: nn.Parameter, **attrs) -> nn.Parameter:
    """Attach loader attributes (``weight_loader``, ``output_dim``, ``input_dim``) to a parameter."""
    for key, value in attrs.items():
        setattr(param, key, value)
    return param


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Copy a whole checkpoint tensor into ``param`` (shapes must match exactly)."""
    if param.shape != loaded.shape:
        raise ValueError(f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit parameter of shape "
                         f"{tuple(param.shape)}; is the config.json the one of this checkpoint?")
    param.data.copy_(loaded)


class UnquantizedLinearMethod(LinearMethod):
    """Plain dense weights: ``weight [sum(output_sizes), input_size]`` in the current default dtype."""

    def create_weights(self, layer, input_size, output_sizes, params_dtype):
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, output_dim=0, input_dim=1)
        layer.register_parameter("weight", weight)

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


class LinearBase(nn.Module):
    """Common part: the linear method, the bias, and a loader that every created parameter receives.

    Args:
        input_size: this rank's input features.
        output_sizes: this rank's output features per fused part (one entry for a plain layer).
        bias: whether to create a bias of ``sum(output_sizes)``.
        quant_method: how weights are stored and applied; None means dense weights.
        prefix: the layer's dotted name in the model (quantizers key on it).
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool,
                 quant_method: LinearMethod | None = None, prefix: str = "") -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = output_sizes
        self.output_size = sum(output_sizes)
        self.prefix = prefix
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        # an explicit method wins; else the loader's quantization scope decides by prefix (None: dense)
        self.quant_method = quant_method or linear_method_for(prefix) or UnquantizedLinearMethod()
        params_dtype = torch.get_default_dtype()
        self.quant_method.create_weights(self, input_size, output_sizes, params_dtype)
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size, dtype=params_dtype), requires_grad=False)
            set_weight_attrs(self.bias, output_dim=0)
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            set_weight_attrs(param, weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        default_weight_loader(param, loaded)

    def process_weights_after_loading(self) -> None:
        self.quant_method.process_weights_after_loading(self)

    def extra_repr(self) -> str:
        return f"in={self.input_size}, out={self.output_sizes}, bias={self.bias is not None}, tp={self.tp_size}"


class ReplicatedLinear(LinearBase):
    """A linear layer whose full weight lives on every rank (small projections, routers)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False,
                 quant_method: LinearMethod | None = None, prefix: str = "") -> None:
        super().__init__(input_size, [output_size], bias, quant_method, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnParallelLinear(LinearBase):
    """``y = x W^T + b`` with W split by output rows: each rank computes its slice of ``y``.

    Args:
        gather_output: all-gather the slices so every rank returns the full ``y``.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False,
                 quant_method: LinearMethod | None = None, prefix: str = "",
                 output_sizes: list[int] | None = None) -> None:
        tp_size = get_tp_size()
        full_sizes = output_sizes or [output_size]
        self.full_output_sizes = full_sizes
        super().__init__(input_size, [divide(s, tp_size, f"{prefix} output size") for s in full_sizes], bias,
                         quant_method, prefix)
        self.gather_output = gather_output

    def weight_loader(self, param, loaded, shard_id=None):
        output_dim = getattr(param, "output_dim", None)
        if output_dim is not None and self.tp_size > 1:
            shard = param.shape[output_dim]
            loaded = loaded.narrow(output_dim, self.tp_rank * shard, shard)
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, self.bias)
        return tp_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul (``gate_up_proj``).

    The checkpoint holds each part separately; ``weight_loader(param, loaded, shard_id=i)`` copies part ``i``
    into its slice of this rank's fused weight.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False,
                 quant_method: LinearMethod | None = None, prefix: str = "") -> None:
        super().__init__(input_size, sum(output_sizes), bias, False, quant_method, prefix, output_sizes)

    def _shard_range(self, shard_id: int) -> tuple[int, int]:
        """(offset, size) of part ``shard_id`` inside this rank's fused output."""
        return sum(self.output_sizes[:shard_id]), self.output_sizes[shard_id]

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:  # a checkpoint that already holds the fused tensor
            return super().weight_loader(param, loaded)
        output_dim = getattr(param, "output_dim", None)
        if output_dim is None:  # per-layer scalars (e.g. a quant scale) are shared by all parts
            return default_weight_loader(param, loaded)
        offset, size = self._shard_range(shard_id)
        loaded = loaded.narrow(output_dim, self.tp_rank * size, size)
        default_weight_loader(param.data.narrow(output_dim, offset, size), loaded)


class QKVParallelLinear(MergedColumnParallelLinear):
    """Fused q, k and v projections split by heads; KV heads are replicated when ``tp_size > num_kv_heads``.

    Output layout on each rank: ``[q (num_heads * head_size) | k (num_kv_heads * head_size) | v (same)]``.
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int | None = None,
                 bias: bool = False, quant_method: LinearMethod | None = None, prefix: str = "") -> None:
        tp_size = get_tp_size()
        total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp_size, f"{prefix} num_attention_heads")
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, total_num_kv_heads, f"{prefix} tensor_parallel_size/kv heads")
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size, f"{prefix} num_key_value_heads")
            self.num_kv_head_replicas = 1
        sizes = [self.num_heads * head_size, self.num_kv_heads * head_size, self.num_kv_heads * head_size]
        # bypass the column split of the parent: sizes here are already per rank
        LinearBase.__init__(self, hidden_size, sizes, bias, quant_method, prefix)
        self.gather_output = False
        self.full_output_sizes = [s * tp_size for s in sizes]

    def weight_loader(self, param, loaded, shard_id=None):
        if shard_id is None:
            raise ValueError(f"{self.prefix}: a fused qkv checkpoint tensor is not supported; the checkpoint "
                             "must hold q_proj, k_proj and v_proj separately")
        index = shard_id if isinstance(shard_id, int) else {"q": 0, "k": 1, "v": 2}[shard_id]
        output_dim = getattr(param, "output_dim", None)
        if output_dim is None:
            return default_weight_loader(param, loaded)
        offset, size = self._shard_range(index)
        # q is split over all ranks; k/v over groups of ranks that share a replicated KV head
        rank = self.tp_rank if index == 0 else self.tp_rank // self.num_kv_head_replicas
        loaded = loaded.narrow(output_dim, rank * size, size)
        default_weight_loader(param.data.narrow(output_dim, offset, size), loaded)


class RowParallelLinear(LinearBase):
    """``y = x W^T + b`` with W split by input columns; partial products are summed across ranks.

    Args:
        input_is_parallel: ``x`` is already this rank's slice (the output of a column-parallel layer).
        reduce_results: all-reduce the partial products (False leaves that to the caller).
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False, input_is_parallel: bool = True,
                 reduce_results: bool = True, quant_method: LinearMethod | None = None, prefix: str = "") -> None:
        tp_size = get_tp_size()
        super().__init__(divide(input_size, tp_size, f"{prefix} input size"), [output_size], bias,
                         quant_method, prefix)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results

    def weight_loader(self, param, loaded, shard_id=None):
        input_dim = getattr(param, "input_dim", None)
        if input_dim is not None and self.tp_size > 1:
            shard = param.shape[input_dim]
            loaded = loaded.narrow(input_dim, self.tp_rank * shard, shard)
        default_weight_loader(param, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel and self.tp_size > 1:
            x = x.chunk(self.tp_size, dim=-1)[self.tp_rank]
        # the bias is added once, after the sum, not once per rank
        y = self.quant_method.apply(self, x, self.bias if self.tp_size == 1 else None)
        if self.tp_size > 1 and self.reduce_results:
            y = tp_all_reduce(y)
            if self.bias is not None:
                y = y + self.bias
        return y
