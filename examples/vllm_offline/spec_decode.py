"""vLLM examples/offline_inference/spec_decode.py with method "ngram" (its draft-model methods need hub weights),
import swapped: speculative_config, then the acceptance counters from llm.get_metrics()."""
from octavo import LLM, SamplingParams
from octavo.metrics import Counter, Vector


def main():
    prompts = ["Repeat after me: one two three four, one two three four, one two three four,",
               "The capital of France is Paris. The capital of France is"]
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5,
                                  "prompt_lookup_min": 2}, max_model_len=512)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    for o in outputs:
        print(f"Prompt: {o.prompt!r}\nGenerated text: {o.outputs[0].text!r}\n" + "-" * 50)
    found = {}
    for metric in llm.get_metrics():
        if metric.name.endswith(("spec_decode_num_drafts", "spec_decode_num_draft_tokens",
                                 "spec_decode_num_accepted_tokens")) and isinstance(metric, Counter):
            found[metric.name.split(":")[-1]] = metric.value
        elif metric.name.endswith("spec_decode_num_accepted_tokens_per_pos") and isinstance(metric, Vector):
            found["per_pos"] = metric.values
    print(found)
    assert found.get("spec_decode_num_drafts", 0) > 0


if __name__ == "__main__":
    main()
