"""vLLM examples/offline_inference/context_extension.py, import swapped: extend the context with YaRN through
hf_overrides (rope_scaling) and a larger max_model_len, then chat."""
from octavo import LLM, SamplingParams


def main():
    rope_theta, factor, original = 100000, 2.0, 8192  # 16k: the KV cache below must hold one request
    hf_overrides = {"rope_theta": rope_theta, "rope_scaling": {"rope_type": "yarn", "factor": factor,
                                                               "original_max_position_embeddings": original},
                    "max_position_embeddings": int(original * factor)}
    llm = LLM(hf_overrides=hf_overrides, max_model_len=int(original * factor), kv_cache_memory_bytes=1 << 30)
    conversation = [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"}]
    outputs = llm.chat(conversation, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32), use_tqdm=False)
    print(f"Prompt: {outputs[0].prompt!r}\nGenerated text: {outputs[0].outputs[0].text!r}")
    assert llm.llm_engine.model_info.max_model_len == int(original * factor)


if __name__ == "__main__":
    main()
