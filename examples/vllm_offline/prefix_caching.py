"""vLLM examples/offline_inference/prefix_caching.py, import swapped: the same long prefix without and with
prefix caching; the outputs must match."""
from octavo import LLM, SamplingParams

prefix = ("You are an expert school principal, skilled in effectively managing faculty and staff. Draft 10-15 "
          "questions for a potential first grade Head Teacher for my K-12, all-girls', independent school that "
          "emphasizes community, joyful discovery, and life-long learning. The candidate is coming in for a first-"
          "round panel interview for a 8th grade Math teaching role. They have 5 years of previous teaching "
          "experience as an assistant teacher at a co-ed, public school with experience in middle school math "
          "teaching. Based on these information, fulfill the following paragraph: ")
prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
generating_prompts = [prefix + p for p in prompts]
sampling_params = SamplingParams(temperature=0.0)


def main():
    regular_llm = LLM(enable_prefix_caching=False)
    outputs = regular_llm.generate(generating_prompts, sampling_params)
    regular = [o.outputs[0].text for o in outputs]
    del regular_llm
    prefix_cached_llm = LLM(enable_prefix_caching=True)
    prefix_cached_llm.generate(generating_prompts[0], sampling_params)  # warm up: caches the prefix
    outputs = prefix_cached_llm.generate(generating_prompts, sampling_params)
    cached = [o.outputs[0].text for o in outputs]
    print(f"Generated answers are the same: {regular == cached}")
    assert regular == cached


if __name__ == "__main__":
    main()
