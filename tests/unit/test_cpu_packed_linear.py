"""bfloat16 CPU linears on oneDNN-packed weights (plugins/platforms/cpu_packed_linear.py) give ``F.linear``'s bits.

Layer level: row counts 1 .. 300, strided and 3-D inputs, bias; a replaced weight (sleep / reload assign
``param.data``) is repacked, never read stale; float32 stays ``F.linear``; the budget switch. Engine level: the
embedded SmolLM2 in bfloat16 installs it (and the rotary and SiLU C kernels, cpu_rope.py / cpu_silu.py) by default,
and greedy tokens and logprobs are identical with both taken out again in the same engine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from octavo.errors import ConfigError
from octavo.nn.linear import UnquantizedLinearMethod
from octavo.plugins.platforms import cpu_packed_linear as cpl
from octavo.plugins.platforms import cpu_rope, cpu_silu

pytestmark = pytest.mark.skipif(not cpl.available(), reason="torch without oneDNN packed linear ops")


class _Layer(torch.nn.Module):
    def __init__(self, n, k, bias=False, dtype=torch.bfloat16):
        super().__init__()
        g = torch.Generator().manual_seed(n + k)
        self.weight = torch.nn.Parameter(torch.randn(n, k, generator=g).to(dtype), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n, generator=g).to(dtype), requires_grad=False) if bias else None


@pytest.mark.parametrize("n,k,bias", [(960, 576, False), (576, 1536, True), (49, 64, False)])
def test_packed_equals_f_linear_bitwise(n, k, bias):
    layer = _Layer(n, k, bias)
    method = cpl.PackedLinearMethod(layer.weight, 64)
    g = torch.Generator().manual_seed(1)
    for rows in (1, 7, 37, 64, 300):
        x = torch.randn(rows, k, generator=g).bfloat16()
        assert torch.equal(method.apply(layer, x, layer.bias), F.linear(x, layer.weight, layer.bias)), rows
    strided = torch.randn(64, 2 * k, generator=g).bfloat16()[:, :k]
    three_d = torch.randn(2, 5, k, generator=g).bfloat16()
    for x in (strided, three_d):
        assert torch.equal(method.apply(layer, x, layer.bias), F.linear(x, layer.weight, layer.bias))


def test_replaced_weight_is_repacked_and_float32_is_plain():
    layer = _Layer(128, 64)
    method = cpl.PackedLinearMethod(layer.weight, 64)
    x = torch.randn(8, 64).bfloat16()
    first = method.apply(layer, x)
    layer.weight.data = torch.randn(128, 64).bfloat16()  # what LLM.sleep(level=2) / wake_up / reload_weights do
    assert method._packed is None  # the old storage died: its packed copy was dropped with it (sleep frees it)
    assert torch.equal(method.apply(layer, x), F.linear(x, layer.weight)) and not torch.equal(method.apply(layer, x),
                                                                                               first)
    x32 = torch.randn(8, 64)
    layer32 = _Layer(128, 64, dtype=torch.float32)
    assert torch.equal(cpl.PackedLinearMethod(layer.weight, 64).apply(layer32, x32), F.linear(x32, layer32.weight))


def test_budget_switch(monkeypatch):
    model = torch.nn.Module()
    monkeypatch.setenv(cpl.BUDGET_ENV, "0")
    assert cpl.pack_dense_linears(model) == {}
    monkeypatch.setenv(cpl.BUDGET_ENV, "lots")
    with pytest.raises(ConfigError, match=cpl.BUDGET_ENV):
        cpl.pack_dense_linears(model)


@pytest.fixture(scope="module")
def llm():
    from octavo import LLM
    from octavo.core.loader import default_model_path

    engine = LLM(default_model_path(), dtype="bfloat16", quantization="none", enable_prefix_caching=False,
                 max_num_seqs=8, max_model_len=256, num_threads=1)
    return engine


def test_engine_installs_it_and_tokens_and_logprobs_are_identical_without_it(llm):
    from octavo import SamplingParams

    model = llm.llm_engine.core.executor.driver.runner.model
    packed = [m for m in model.modules() if isinstance(getattr(m, "quant_method", None), cpl.PackedLinearMethod)]
    heads = [m for m in model.modules() if isinstance(getattr(m, "logits_method", None), cpl.PackedLogitsMethod)]
    assert len(packed) == 4 * model.config.num_hidden_layers and len(heads) == 1
    prompts = [{"prompt_token_ids": list(range(200 + 13 * i, 240 + 17 * i))} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=2, ignore_eos=True)

    def run():
        return [(o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs])
                for o in llm.generate(prompts, params, use_tqdm=False)]

    ropes = [m for m in model.modules() if "forward" in vars(m) and m.forward.__func__ is cpu_rope.rope_forward]
    assert len(ropes) == model.config.num_hidden_layers  # the rotary C kernel (cpu_rope.py) as well
    with_packed = run()
    for m in packed:
        m.quant_method = UnquantizedLinearMethod()
    heads[0].logits_method = None
    silus = [m for m in model.modules() if "forward" in vars(m) and m.forward.__func__ is cpu_silu.silu_forward]
    assert len(silus) == model.config.num_hidden_layers  # and SiLU-and-mul (cpu_silu.py)
    for m in ropes + silus:
        del m.forward
    try:
        plain = run()
    finally:
        for m in packed:
            m.quant_method = cpl.PackedLinearMethod(m.weight, 64)
        heads[0].logits_method = cpl.PackedLogitsMethod(heads[0].weight, 64)
        cpu_rope.install_rope(model, torch.bfloat16)
        cpu_silu.install_silu(model, torch.bfloat16)
    assert [t for t, _ in with_packed] == [t for t, _ in plain]
    assert with_packed == plain  # logprobs too: the same bits
