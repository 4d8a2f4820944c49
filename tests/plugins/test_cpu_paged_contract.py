"""``cpu_paged`` (the CPU default attention backend) passes the attention contract suite, float64 as the truth."""

import torch

from octavo.plugins.attention.cpu_paged import CpuPagedAttentionBackend
from octavo.testing.attention import AttentionBackendContract


class TestCpuPagedContract(AttentionBackendContract):
    backend_cls = CpuPagedAttentionBackend
    dtypes = (torch.float32, torch.bfloat16)
