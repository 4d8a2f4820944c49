"""``ModelContract``: the pytest suite every model plugin must pass, plus ``PagedRunner`` to drive a model.

The suite builds tiny random-weight models from transformers configs, saves them with ``save_pretrained``
(sharded, so the index path is exercised), loads them through octavo's loader into the plugin's class, runs
them on an attention backend (the reference ``torch_sdpa`` unless ``backend_cls`` names another) over a
paged KV cache, on ``device`` (default ``cpu``), and compares logits and log-probabilities
with transformers in float32 — for whole prompts run together, and for prompts fed in chunks and then one
token at a time (chunked prefill and decode over the cache). No engine is needed.

    from octavo.testing import ModelContract
    from transformers import LlamaConfig

    class TestMyLlama(ModelContract):
        model_cls = MyLlama
        configs = {"tiny": LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)}
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

import pytest
import torch

from octavo.model import ForwardContext
from octavo.testing.attention import make_layout


class PagedRunner:
    """Runs a model over a paged KV cache with an attention backend, one step at a time, like a tiny engine.

    No scheduler, no sampler: you name the tokens each request gets this step and read back float32 logits,
    so a model or an attention backend can be checked against a reference without building an engine::

        runner = PagedRunner(model, block_size=16)                   # reference backend, on the CPU
        first = runner.step([("a", [1, 2, 3]), ("b", [7, 8])])       # two prefills in one flat batch
        nxt = runner.step([("a", [4]), ("b", [9, 10])])              # a decode and a chunk of b
        logits = runner.prompts([[1, 2, 3, 4]])[0]                   # [4, vocab], request then forgotten

    Args:
        model: an octavo model (built from ``octavo.nn``).
        backend_cls: the attention backend class; default the registered reference ``torch_sdpa``.
        num_blocks: KV blocks per layer (block 0 stays the null block).
        block_size: tokens per block.
        device: where the model lives.
        kv_dtype: KV cache dtype; default the model's parameter dtype.
    """

    def __init__(self, model: torch.nn.Module, backend_cls=None, *, num_blocks: int = 256, block_size: int = 16,
                 device: str | torch.device = "cpu", kv_dtype: torch.dtype | None = None) -> None:
        from octavo.nn import Attention

        if backend_cls is None:
            from octavo.registry import resolve

            backend_cls = resolve("attention_backends", "torch_sdpa")
        self.model, self.backend_cls = model, backend_cls
        self.block_size, self.device = block_size, torch.device(device)
        dtype = kv_dtype or next(model.parameters()).dtype
        for layer in model.modules():
            if isinstance(layer, Attention):
                impl = backend_cls(num_heads=layer.num_heads, head_size=layer.head_size,
                                   num_kv_heads=layer.num_kv_heads, scale=layer.scale,
                                   sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap)
                shape = backend_cls.kv_cache_shape(num_blocks, block_size, layer.num_kv_heads, layer.head_size)
                layer.bind(impl, torch.zeros(shape, dtype=dtype, device=self.device))
        self.free_blocks = list(range(num_blocks - 1, 0, -1))
        self.block_tables: dict[Any, list[int]] = {}
        self.num_computed: dict[Any, int] = {}

    def free(self, key) -> None:
        """Forget a request and return its blocks."""
        self.free_blocks.extend(self.block_tables.pop(key, []))
        self.num_computed.pop(key, None)

    @torch.no_grad()
    def step(self, batch: list[tuple[Any, list[int]]]) -> list[torch.Tensor]:
        """Run one step; ``batch`` holds ``(request key, new token ids)``; returns float32 logits per request.

        A new key starts a request; a known key continues it after its cached tokens.
        """
        order = sorted(range(len(batch)), key=lambda i: len(batch[i][1]) != 1)  # decodes first
        tables, computed, new = [], [], []
        for i in order:
            key, tokens = batch[i]
            start = self.num_computed.setdefault(key, 0)
            table = self.block_tables.setdefault(key, [])
            while len(table) * self.block_size < start + len(tokens):
                if not self.free_blocks:
                    raise RuntimeError("PagedRunner ran out of KV blocks; pass a larger num_blocks")
                table.append(self.free_blocks.pop())
            tables.append(table)
            computed.append(start)
            new.append(len(tokens))
        layout = make_layout(tables, computed, new, self.block_size)
        metadata = self.backend_cls.build_metadata(layout, self.device)
        input_ids = torch.tensor([t for i in order for t in batch[i][1]], dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(c, c + n) for c, n in zip(computed, new)]).to(self.device)
        ctx = ForwardContext(attn_metadata=metadata, query_start_loc=layout.query_start_loc.to(self.device))
        hidden = self.model(input_ids, positions, ctx)  # [num_tokens, hidden]
        logits = self.model.compute_logits(hidden).cpu()  # [num_tokens, vocab]
        out: list[torch.Tensor | None] = [None] * len(batch)
        start = 0
        for i, n in zip(order, new):
            out[i] = logits[start:start + n]
            start += n
            self.num_computed[batch[i][0]] += n
        return out

    def prompts(self, prompts: list[list[int]]) -> list[torch.Tensor]:
        """Logits of every position of each prompt, all prompts in one step (then forgotten)."""
        keys = [("prompt", i, id(self)) for i in range(len(prompts))]
        try:
            return self.step(list(zip(keys, prompts)))
        finally:
            for key in keys:
                self.free(key)


def randomize_(model: torch.nn.Module, seed: int = 0, std: float = 0.08) -> torch.nn.Module:
    """Give every parameter random values (norm weights around 1): default inits hide bugs (zero biases)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * std
            p.copy_(1.0 + noise if "norm" in name else noise)
    return model


class ModelContract:
    """Contract tests for a model class registered with ``octavo_register_models``.

    Attributes:
        model_cls: the class under test (required).
        configs: name -> tiny transformers config (random weights are made from it; keep it small).
        atol: absolute tolerance on float32 logits against transformers.
        prompt_lens: lengths of the random prompts run together.
        block_size: KV block size of the paged runs.
        check_registered: also require the installed plugins to resolve each config's architecture to
            ``model_cls``.
        backend_cls: the attention backend the model runs on (default: the registered ``torch_sdpa``), so a
            vendor can check a model on their own backend and device.
        device: where the model runs (``"cpu"``, ``"cuda"``, ...); the transformers reference stays on the CPU.
    """

    model_cls: ClassVar[type]
    configs: ClassVar[dict[str, Any]] = {}
    atol: ClassVar[float] = 1e-4
    prompt_lens: ClassVar[tuple[int, ...]] = (1, 7, 23, 40)
    block_size: ClassVar[int] = 16
    check_registered: ClassVar[bool] = True
    backend_cls: ClassVar[type | None] = None
    device: ClassVar[str] = "cpu"

    @pytest.fixture(scope="class")
    def checkpoints(self, tmp_path_factory):
        """name -> (checkpoint dir, transformers reference model in float32)."""
        from transformers import AutoModelForCausalLM

        assert self.configs, "set ModelContract.configs to at least one tiny transformers config"
        out = {}
        for i, (name, config) in enumerate(self.configs.items()):
            torch.manual_seed(i)
            ref = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            randomize_(ref, seed=i)
            if getattr(config, "tie_word_embeddings", False):
                ref.tie_weights()
            ref.eval()
            path = tmp_path_factory.mktemp(f"ckpt-{name}")
            ref.save_pretrained(path, max_shard_size="200KB")  # several shards + model.safetensors.index.json
            out[name] = (str(path), ref)
        return out

    def _load(self, path: str, load_format: str = "auto"):
        from octavo.config import ModelSettings
        from octavo.core.loader import load_model, resolve_model

        resolved = resolve_model(ModelSettings(model=path, load_format=load_format))
        model = load_model(resolved, model_cls=self.model_cls, dtype=torch.float32, device=self.device)
        return resolved, model

    def _runner(self, model) -> PagedRunner:
        return PagedRunner(model, self.backend_cls, block_size=self.block_size, device=self.device)

    def _prompts(self, vocab_size: int, seed: int = 0) -> list[list[int]]:
        rng = random.Random(seed)
        return [[rng.randrange(vocab_size) for _ in range(n)] for n in self.prompt_lens]

    @staticmethod
    def _reference(ref, tokens: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return ref(torch.tensor([tokens])).logits[0].float()

    def _compare(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        assert got.dtype == torch.float32, f"compute_logits must return float32, got {got.dtype}"
        assert got.shape == want.shape, f"{what}: logits shape {tuple(got.shape)} != {tuple(want.shape)}"
        err = (got - want).abs().max().item()
        lp_err = (torch.log_softmax(got, -1) - torch.log_softmax(want, -1)).abs().max().item()
        assert err <= self.atol and lp_err <= self.atol, (
            f"{what}: max |logit diff| {err:.3g}, max |logprob diff| {lp_err:.3g} > {self.atol} vs transformers")

    # ------------------------------------------------------------------------------- checks
    def test_declares_protocol(self):
        cls = self.model_cls
        assert isinstance(getattr(cls, "packed_modules_mapping", None), dict), \
            "model_cls.packed_modules_mapping must be a dict (may be empty)"
        for method in ("forward", "compute_logits", "load_weights"):
            assert callable(getattr(cls, method, None)), f"model_cls must define {method}"

    def test_registered_under_architecture(self):
        if not self.check_registered:
            pytest.skip("check_registered is off")
        from octavo.registry import resolve

        for name, config in self.configs.items():
            arch = config.architectures[0] if getattr(config, "architectures", None) else None
            assert arch, f"config {name!r} must name its architectures"
            assert resolve("models", arch) is self.model_cls, f"{arch} does not resolve to {self.model_cls}"

    def test_loads_every_parameter(self, checkpoints):
        from octavo.config import ModelSettings
        from octavo.core.loader import iter_weights, resolve_model

        for name, (path, _) in checkpoints.items():
            resolved = resolve_model(ModelSettings(model=path))
            model = self.model_cls(config=resolved.hf_config, prefix="")
            loaded = model.load_weights(iter_weights(resolved))
            expected = {n for n, _ in model.named_parameters(remove_duplicate=False)}
            assert expected <= set(loaded), f"{name}: parameters never loaded: {sorted(expected - set(loaded))}"

    def test_prompt_logits_match_transformers(self, checkpoints):
        """All prompts in one flat batch: every position's logits equal transformers' within ``atol``."""
        for name, (path, ref) in checkpoints.items():
            _, model = self._load(path)
            prompts = self._prompts(ref.config.vocab_size)
            got = self._runner(model).prompts(prompts)
            for i, tokens in enumerate(prompts):
                self._compare(got[i], self._reference(ref, tokens), f"{name}, prompt {i} ({len(tokens)} tokens)")

    def test_chunked_prefill_and_decode_match_transformers(self, checkpoints):
        """Prompts fed in uneven chunks, then token by token, interleaved: same logits as one full pass."""
        for name, (path, ref) in checkpoints.items():
            _, model = self._load(path)
            runner = self._runner(model)
            rng = random.Random(1)
            seqs = [p + [rng.randrange(ref.config.vocab_size) for _ in range(5)]
                    for p in self._prompts(ref.config.vocab_size, seed=1) if p]
            done = [0] * len(seqs)
            got: list[list[torch.Tensor]] = [[] for _ in seqs]
            while any(d < len(s) for d, s in zip(done, seqs)):
                batch = []
                for i, s in enumerate(seqs):
                    if done[i] < len(s):
                        n = 1 if done[i] >= len(s) - 5 else rng.randint(1, 9)  # chunks, then decodes
                        n = min(n, len(s) - done[i])
                        batch.append((i, s[done[i]:done[i] + n]))
                        done[i] += n
                for (i, _), logits in zip(batch, runner.step(batch)):
                    got[i].append(logits)
            for i, s in enumerate(seqs):
                self._compare(torch.cat(got[i]), self._reference(ref, s), f"{name}, chunked sequence {i}")

    def test_dummy_weights_run(self, checkpoints):
        """``load_format="dummy"`` builds the model from the config alone and produces finite logits."""
        name, (path, ref) = next(iter(checkpoints.items()))
        resolved, model = self._load(path, load_format="dummy")
        assert resolved.format == "dummy"
        logits = self._runner(model).prompts([[1, 2, 3]])[0]
        assert logits.shape == (3, ref.config.vocab_size) and torch.isfinite(logits).all()
