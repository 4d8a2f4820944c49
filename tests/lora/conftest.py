"""Shared builders for the LoRA tests: a tiny random-weight Llama checkpoint and PEFT adapters made with ``peft``."""

from __future__ import annotations

import torch
import transformers as T

from octavo.testing.model import randomize_

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (rank, alpha, rslora, targets): different ranks, scalings and target sets; the last one also adapts the
# token embedding (PEFT's lora_embedding_A/B, saved with a copy of the base table)
ADAPTERS = [(8, 16, False, ALL), (4, 8, True, ALL), (16, 8, False, ["q_proj", "v_proj"]),
            (2, 4, False, ["o_proj", "down_proj", "up_proj"]), (8, 8, False, ["embed_tokens", "q_proj", "down_proj"])]


def make_base(path: str) -> None:
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(architectures=["LlamaForCausalLM"], **TINY)).float()
    randomize_(model)
    model.save_pretrained(path)


def make_adapter(base_path: str, path: str, rank: int, alpha: int, rslora: bool, targets: list[str],
                 seed: int, std: float = 0.15) -> None:
    """A PEFT LoRA adapter with random A and B (PEFT's default B = 0 would make every adapter a no-op)."""
    from peft import LoraConfig, get_peft_model

    base = T.LlamaForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, use_rslora=rslora, target_modules=targets,
                                            lora_dropout=0.0))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.save_pretrained(path)


def peft_greedy(base_path: str, adapter_path: str | None, prompts: list[list[int]], n: int,
                auto: bool = False) -> list[list[int]]:
    """Greedy tokens from transformers (+ peft when an adapter is given), full forward per token, float32."""
    cls = T.AutoModelForCausalLM if auto else T.LlamaForCausalLM
    model = cls.from_pretrained(base_path, dtype=torch.float32)
    if adapter_path is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    model.eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(n):
                logits = model(torch.tensor([ids])).logits[0, -1]
                ids.append(int(logits.argmax()))
            out.append(ids[len(p):])
    return out
