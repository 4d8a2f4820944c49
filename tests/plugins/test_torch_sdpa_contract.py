"""The reference backend passes the attention contract suite (float64 dense attention as the truth)."""

import torch

from octavo.plugins.attention.torch_sdpa import TorchSDPABackend
from octavo.testing.attention import AttentionBackendContract


class TestTorchSDPAContract(AttentionBackendContract):
    backend_cls = TorchSDPABackend
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
