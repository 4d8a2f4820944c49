"""The ``triton`` backend passes ``AttentionBackendContract`` (float64 attention as the oracle) on the GPU.

Without a GPU the module skips, unless ``OCTAVO_TRITON_INTERPRET=1`` runs it through Triton's CPU
interpreter (slow). Long contexts (8k) are covered in ``test_triton_kernels.py::test_long_context_8k``.
"""

import pytest
import torch

from octavo.plugins.attention.triton import TritonAttentionBackend
from octavo.testing import AttentionBackendContract
from tests.gpu.conftest import INTERPRET

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() and not INTERPRET:
    pytest.skip("the triton backend needs a CUDA GPU (or OCTAVO_TRITON_INTERPRET=1)", allow_module_level=True)


class TestTritonContract(AttentionBackendContract):
    backend_cls = TritonAttentionBackend
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = (torch.bfloat16, torch.float16, torch.float32) if torch.cuda.is_available() else (torch.float16,)
    block_sizes = (16, 4, 64)
