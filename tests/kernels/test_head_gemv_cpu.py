"""plugins/platforms/cuda_head_gemv.py on the CPU through Triton's interpreter: the LM head's one-row GEMM goes
through the GEMV (installed only where it matches F.linear; OCTAVO_HEAD_GEMV=0 keeps none), more rows, a bias or
the switch off run what ran before, and compute_logits keeps its contract (float32, cut to the vocabulary)."""

from tests.utils import run_triton_interpreted

_CODE = """
import os
import torch
import torch.nn.functional as F
from octavo.nn.embedding import ParallelLMHead
from octavo.plugins.platforms import cuda_fusions
from octavo.plugins.platforms.cuda_head_gemv import HeadGemvMethod, install_head_gemv

torch.manual_seed(0)
dev = torch.device("cpu")
model = torch.nn.Module()
model.lm_head = ParallelLMHead(300, 128)
model.lm_head.weight.data = torch.randn(300, 128).to(torch.bfloat16)
os.environ["OCTAVO_HEAD_GEMV"] = "0"
assert install_head_gemv(model, torch.bfloat16, dev) == {} and model.lm_head.logits_method is None
del os.environ["OCTAVO_HEAD_GEMV"]  # default: on
assert install_head_gemv(model, torch.bfloat16, dev) == {"LMHead(gemv)": 1}
head = model.lm_head
m = head.logits_method
assert isinstance(m, HeadGemvMethod) and m.inner is None
calls = []
real = cuda_fusions.gemv
cuda_fusions.gemv = lambda x, w, b=None: (calls.append(x.shape[0]), real(x, w, b))[1]
x1, x3 = torch.randn(1, 128).to(torch.bfloat16), torch.randn(3, 128).to(torch.bfloat16)
y1 = head.compute_logits(x1)
assert calls == [1] and y1.dtype == torch.float32 and y1.shape == (1, 300)
assert torch.allclose(y1, F.linear(x1, head.weight).float(), rtol=1.6e-2, atol=1.6e-2)
assert torch.equal(head.compute_logits(x3), F.linear(x3, head.weight).float()) and calls == [1]
m.enabled = False
assert torch.equal(head.compute_logits(x1), F.linear(x1, head.weight).float()) and calls == [1]
print("ok")
"""


def test_head_gemv_method_dispatch_and_install():
    run_triton_interpreted(_CODE)
