"""GGUF files: a fast metadata reader, the Hugging Face config, the tokenizer, and dequantized weights.

The header (metadata, tensor table) is read by ``gguf_header.py`` (``struct`` over an ``mmap``); tensor data
stay memory-mapped and are dequantized one tensor at a time with ``gguf.quants.dequantize``.

Names: llama.cpp's tensor names (``blk.3.attn_q.weight``) map to Hugging Face names
(``model.layers.3.self_attn.q_proj.weight``); for ``general.architecture == "llama"`` llama.cpp's converter
permuted the rows of q and k (rotary pairs interleaved), which :func:`unpermute_qk` undoes.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

from octavo.core.loader.gguf_header import GGUFHeader, GGUFStrings, GGUFTensorInfo, read_header  # noqa: F401

if TYPE_CHECKING:
    import torch

# NOTE: torch is imported inside the weight functions: the front end of `octavo serve` reads the GGUF tokenizer
# through this module and must not pay for torch (docs/loading.md, "Start time").

_PLAIN = {0: np.float32, 1: np.float16}  # ggml types stored as plain values (bf16 = 30 is handled by gguf)


# ----------------------------------------------------------------------------------------- config

# general.architecture -> transformers model_type, where they differ
_MODEL_TYPE = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gemma3": "gemma3_text", "command-r": "cohere"}


def gguf_config_dict(header: GGUFHeader) -> dict[str, Any]:
    """A transformers config dict from GGUF metadata, using transformers' own key mapping."""
    from octavo.core.loader.light_config import gguf_mapping

    arch = header.architecture
    name = str(header.metadata.get("general.name", "")).lower()
    model_type = "mistral" if arch == "llama" and "mistral" in name else _MODEL_TYPE.get(arch, arch)
    mapping = gguf_mapping(model_type)  # transformers' own table, stored (config_tables.json): no import
    if mapping is None:
        from transformers.integrations import GGUF_CONFIG_MAPPING

        mapping = GGUF_CONFIG_MAPPING.get(model_type) or GGUF_CONFIG_MAPPING.get(arch)
    if mapping is None:
        raise ValueError(f"GGUF architecture {arch!r} has no config mapping in transformers; supported: "
                         f"{sorted(k for k in GGUF_CONFIG_MAPPING if k not in ('general', 'tokenizer'))}")
    cfg: dict[str, Any] = {"model_type": model_type}
    for key, value in header.metadata.items():
        if key.startswith(arch + "."):
            hf_key = mapping.get(key[len(arch) + 1:])
            if hf_key not in (None, -1):
                cfg[hf_key] = value
    names = {t.name for t in header.tensors}
    cfg["tie_word_embeddings"] = "output.weight" not in names
    if "vocab_size" not in cfg and "tokenizer.ggml.tokens" in header.metadata:
        cfg["vocab_size"] = len(header.metadata["tokenizer.ggml.tokens"])
    if "rope_theta" in cfg:  # transformers 5.x reads rope_parameters; 4.x reads rope_theta
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    scaling_type = header.metadata.get(f"{arch}.rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        params = {"rope_type": scaling_type, "factor": header.metadata.get(f"{arch}.rope.scaling.factor", 1.0)}
        orig = header.metadata.get(f"{arch}.rope.scaling.original_context_length")
        if orig:
            params["original_max_position_embeddings"] = orig
        cfg.setdefault("rope_parameters", {"rope_theta": 10000.0}).update(params)
        cfg["rope_scaling"] = params
    for src, dst in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                     ("padding_token_id", "pad_token_id")):
        if f"tokenizer.ggml.{src}" in header.metadata:
            cfg[dst] = header.metadata[f"tokenizer.ggml.{src}"]
    # NOTE: transformers maps rope.dimension_count to head_dim; for the llama family they are equal
    return cfg


def gguf_hf_config(path: str):
    """The transformers ``PretrainedConfig`` a GGUF file describes (a ``LightConfig`` for the light families)."""
    from octavo.core.loader.light_config import causal_lm_architecture, light_config, light_config_applies

    cfg = gguf_config_dict(read_header(path))
    if light_config_applies(cfg):
        arch = causal_lm_architecture(cfg["model_type"])
        light = light_config({**cfg, "architectures": [arch]} if arch else cfg)
        if light is not None:
            return light
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = cfg.pop("model_type")
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if arch:
        cfg["architectures"] = [arch]
    return AutoConfig.for_model(model_type, **cfg)


# -------------------------------------------------------------------------------------- tokenizer

def _plain(value):
    """A metadata value as transformers' converter expects it: lists, not :class:`GGUFStrings`."""
    return list(value) if isinstance(value, GGUFStrings) else value


def gguf_tokenizer(path: str):
    """The Hugging Face fast tokenizer and chat template stored in a GGUF file's metadata.

    Built from the parsed metadata with transformers' GGUF converter, so it matches
    ``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` without its slow header walk.
    """
    from transformers import PreTrainedTokenizerFast

    try:  # transformers 5.x
        from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:  # transformers 4.x
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    header = read_header(path)
    meta = header.metadata
    groups = {group: {name: _plain(meta[f"tokenizer.{key}"]) for key, name in renames.items()
                      if f"tokenizer.{key}" in meta}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer_dict, tokenizer_config = groups["tokenizer"], groups["tokenizer_config"]
    if "tokens" not in tokenizer_dict:
        raise ValueError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens); pass --tokenizer")
    if tokenizer_dict.get("tokenizer_type") == "llama":
        tokenizer_config.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece vocabularies
    tokens = tokenizer_dict["tokens"]
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(header.architecture, tokenizer_dict)
    # Some transformers versions (5.17) also return special tokens in ``extra``: one keyword each, the GGUF's
    # own ids winning unless they are absent.
    kwargs = dict(extra)
    kwargs.update({k: v for k, v in tokenizer_config.items() if v is not None or k not in kwargs})
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


# ---------------------------------------------------------------------------------------- weights

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


# Gemma 2/3 ("sandwich" norms): ffn_norm is the norm before the MLP, post_ffw_norm the one after it
_ARCH_LAYER_NAMES = {arch: {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm"} for arch in ("gemma2", "gemma3")}
#: architectures whose llama.cpp converter stored RMSNorm weights as ``1 + w`` (HF keeps ``w``)
_NORM_SHIFT_ARCHS = {"gemma", "gemma2", "gemma3"}


def hf_name(gguf_name: str, arch: str | None = None) -> str | None:
    """The Hugging Face parameter name of a llama-family GGUF tensor, or None if it has none."""
    m = _BLOCK.match(gguf_name)
    if m:
        part = _ARCH_LAYER_NAMES.get(arch, _LAYER_NAMES).get(m.group(2))
        return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
    base, _, suffix = gguf_name.rpartition(".")
    part = _GLOBAL_NAMES.get(base)
    return f"{part}.{suffix}" if part else None


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: per head, rows ``[pairs interleaved] -> [first half | second half]``."""
    rows = w.shape[0]
    # [heads, head_dim // 2, 2, ...] -> [heads, 2, head_dim // 2, ...]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(mm, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor of the file as float32 (or its plain float type), in torch shape."""
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    qtype = GGMLQuantizationType(info.ggml_type)
    block, type_size = GGML_QUANT_SIZES[qtype]
    nbytes = prod(info.shape) // block * type_size
    raw = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=info.offset)
    if info.ggml_type in _PLAIN:
        return torch.from_numpy(raw.view(_PLAIN[info.ggml_type]).reshape(info.shape).copy())
    if info.ggml_type in _TORCH_DEQUANT:
        blocks = torch.from_numpy(raw.reshape(-1, type_size).copy())  # [num_blocks, bytes per block]
        return _TORCH_DEQUANT[info.ggml_type](blocks).reshape(info.shape)
    rows = raw.reshape(-1, info.shape[-1] // block * type_size)  # [rows, bytes per row]
    return torch.from_numpy(gguf_dequantize(rows, qtype).reshape(info.shape))


# The three 32-element block formats of small llama.cpp files, vectorised in torch: ``gguf``'s numpy
# version loops over row groups and is ~10x slower. Other types fall back to ``gguf.quants``.
def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    import torch

    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()  # [num_blocks, 1]


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    import torch

    # byte j holds element j (low nibble) and element j + 16 (high nibble)
    return torch.cat((packed & 0x0F, packed >> 4), dim=1).float()  # [num_blocks, 32]


def _dequant_q4_0(blocks):  # fp16 d, 16 bytes of nibbles: d * (q - 8)
    return _f16(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8)


def _dequant_q4_1(blocks):  # fp16 d, fp16 m, 16 bytes of nibbles: d * q + m
    return _f16(blocks, 0) * _nibbles(blocks[:, 4:]) + _f16(blocks, 2)


def _dequant_q8_0(blocks):  # fp16 d, 32 int8: d * q
    import torch

    return _f16(blocks, 0) * blocks[:, 2:].contiguous().view(torch.int8).float()


_TORCH_DEQUANT = {2: _dequant_q4_0, 3: _dequant_q4_1, 8: _dequant_q8_0}


def raw_blocks(mm, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor's ggml blocks as ``uint8 [rows, bytes per row]`` (a copy; the file stays mapped)."""
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.ggml_type)]
    nbytes = prod(info.shape) // block * type_size
    raw = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=info.offset)
    return torch.from_numpy(raw.reshape(info.shape[0], -1).copy())


def tensor_types(path: str) -> dict[str, int]:
    """Hugging Face module name -> ggml type of every 2-D weight of the file (quantizers read it)."""
    types = {}
    header = read_header(path)
    for info in header.tensors:
        name = hf_name(info.name, header.architecture)
        if name is not None and name.endswith(".weight") and len(info.shape) == 2:
            types[name.removesuffix(".weight")] = info.ggml_type
    return types


def iter_gguf_weights(path: str, hf_config, keep_blocks=None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf name, dequantized tensor)`` for every tensor of the file that has a Hugging Face name.

    Args:
        keep_blocks: optional ``hf name -> bool``; those tensors come as :class:`octavo.quant.GGUFBlocks`
            (raw blocks, q/k row permutation undone) for a quantizer to repack, instead of dequantized.
    """
    from octavo.quant import GGUFBlocks

    header = read_header(path)
    permute = header.architecture == "llama"
    num_heads = hf_config.num_attention_heads
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for info in header.tensors:
            name = hf_name(info.name, header.architecture)
            if name is None:
                continue  # e.g. rope_freqs: recomputed from the config
            raw = keep_blocks is not None and len(info.shape) == 2 and keep_blocks(name)
            tensor = raw_blocks(mm, info) if raw else dequantize(mm, info)
            if permute and ".self_attn.q_proj." in name:  # whole rows move: valid for raw blocks too
                tensor = unpermute_qk(tensor, num_heads)
            elif permute and ".self_attn.k_proj." in name:
                tensor = unpermute_qk(tensor, num_kv_heads)
            if header.architecture in _NORM_SHIFT_ARCHS and name.endswith("norm.weight"):
                tensor = tensor - 1  # llama.cpp stored 1 + w for Gemma's (1 + w) * x RMSNorm
            yield name, (GGUFBlocks(tensor, info.ggml_type, info.shape) if raw else tensor)
            del tensor


def gguf_num_weights(path: str) -> int:
    header = read_header(path)
    return sum(1 for t in header.tensors if hf_name(t.name, header.architecture) is not None)
