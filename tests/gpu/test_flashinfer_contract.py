"""The ``flashinfer`` backend passes ``AttentionBackendContract`` on the GPU (skips where flashinfer, a GPU
or nvcc is missing). Each dtype / head size / window / soft-cap variant JIT-compiles once (tens of seconds)."""

import pytest
import torch

from octavo.plugins.attention.flashinfer import FlashInferAttentionBackend
from octavo.testing import AttentionBackendContract

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
if not torch.cuda.is_available() or not FlashInferAttentionBackend.is_available():
    pytest.skip("flashinfer needs a CUDA GPU, flashinfer-python and nvcc", allow_module_level=True)


class TestFlashInferContract(AttentionBackendContract):
    backend_cls = FlashInferAttentionBackend
    device = "cuda"
    dtypes = (torch.bfloat16, torch.float16)
    block_sizes = (16, 4)
    head_configs = ((4, 4, 64), (8, 2, 64), (4, 2, 128))
