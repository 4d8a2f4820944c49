"""vLLM examples/offline_inference/basic/basic.py, import swapped: sample 4 prompts, print each completion."""
from octavo import LLM, SamplingParams

prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    llm = LLM()  # vLLM's example names facebook/opt-125m (a hub download); octavo's embedded model instead
    outputs = llm.generate(prompts, sampling_params)
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output in outputs:
        print(f"Prompt:    {output.prompt!r}\nOutput:    {output.outputs[0].text!r}\n" + "-" * 60)
        assert output.outputs[0].token_ids


if __name__ == "__main__":
    main()
