"""Issue 12's CPU matrix (``make distributed`` only): every model x parallel mode equals the single process.

Models: the embedded SmolLM2 (fp32 safetensors conversion; its 9 heads split in 3, so its TP runs are TP=3)
and random-weight Llama (3 layers: an uneven 2 + 1 pipeline split), Qwen3 (2 KV heads) and Qwen3-MoE (tied
embeddings: the last stage loads the embedding matrix into its head). Modes: TP=2, PP=2, TP=2 x PP=2, DP=2,
the ``ray`` executor (TP=2, not SmolLM2: its TP=3 needs 3 CPUs for Ray; PP=2 on Llama), and for Qwen3-MoE expert parallelism (TP=2, TP=2 x PP=2, each
rank holding 2 of the 4 experts). Greedy tokens equal, logprobs and prompt logprobs within
1e-4 of the ``uni`` run (``tests.distributed.test_tensor_parallel.run``/``assert_same``). ~15 engines of 2-6
processes each: several minutes on 2 cores.
"""

from __future__ import annotations

import pytest
import transformers as T

from tests.distributed.test_pipeline_parallel import QWEN3_MOE, save_checkpoint
from tests.distributed.test_tensor_parallel import assert_same, full_only, run
from tests.plugins.test_model_contracts import TINY
from tests.utils import smollm2_safetensors_dir

pytestmark = full_only

CONFIGS = {
    "llama": T.LlamaConfig(architectures=["LlamaForCausalLM"], **{**TINY, "num_hidden_layers": 3}),
    "qwen3": T.Qwen3Config(architectures=["Qwen3ForCausalLM"], head_dim=32, **TINY),
    "qwen3-moe": QWEN3_MOE,
}
SMOLLM2_PROMPTS = [[1, 504, 3458, 314, 260, 6530, 28, 1303], list(range(100, 140))]
MODES = {
    "tp": {"tensor_parallel_size": 2},
    "pp": {"pipeline_parallel_size": 2},
    "tp-x-pp": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
    "dp": {"data_parallel_size": 2},
    "ray-tp": {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
}
EXTRA = {  # modes only some models take
    "ray-pp": {"pipeline_parallel_size": 2, "distributed_executor_backend": "ray"},
    "tp-ep": {"tensor_parallel_size": 2, "enable_expert_parallel": True},
    "tp-x-pp-ep": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "enable_expert_parallel": True},
}
CASES = [(m, mode) for m in ("smollm2", *CONFIGS) for mode in MODES
         if (m, mode) != ("smollm2", "ray-tp")] + [  # Ray gives each rank a CPU: TP=3 does not fit 2 cores
    ("llama", "ray-pp"), ("qwen3-moe", "tp-ep"), ("qwen3-moe", "tp-x-pp-ep")]
_cache: dict[str, tuple] = {}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    def get(name: str):
        """(path, prompts, single-process result), built once per module"""
        if name not in _cache:
            if name == "smollm2":
                path, prompts = str(smollm2_safetensors_dir("float32")), SMOLLM2_PROMPTS
            else:
                path, prompts = save_checkpoint(CONFIGS[name], tmp_path_factory.mktemp(name)), None
            kw = {"prompts": prompts} if prompts else {}
            _cache[name] = (path, kw, run(path, **kw))
        return _cache[name]
    return get


@pytest.mark.parametrize(("name", "mode"), CASES, ids=[f"{m}-{mode}" for m, mode in CASES])
def test_parallel_mode_equals_single_process(model, name, mode):
    kw = dict(MODES.get(mode) or EXTRA[mode])
    if kw.get("distributed_executor_backend") == "ray":
        pytest.importorskip("ray", reason="the ray executor needs `pip install octavo[ray]`")
    if name == "smollm2" and "tensor_parallel_size" in kw:
        kw["tensor_parallel_size"] = 3  # 9 heads, 3 KV heads
    path, prompt_kw, want = model(name)
    assert_same(want, run(path, **prompt_kw, **kw))
