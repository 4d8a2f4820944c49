"""vLLM examples/offline_inference/simple_profiling.py, import swapped: profile a generate call with the torch
profiler (VLLM_TORCH_PROFILER_DIR is honored as octavo's OCTAVO_TORCH_PROFILER_DIR)."""
import os
import tempfile
import time

from octavo import LLM, SamplingParams

os.environ.setdefault("VLLM_TORCH_PROFILER_DIR", os.path.join(tempfile.gettempdir(), "vllm_profile"))
prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16)


def main():
    llm = LLM(tensor_parallel_size=1)
    llm.start_profile()
    outputs = llm.generate(prompts, sampling_params)
    llm.stop_profile()
    for output in outputs:
        print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")
    time.sleep(1)
    traces = os.listdir(os.environ["VLLM_TORCH_PROFILER_DIR"])
    print(f"traces in {os.environ['VLLM_TORCH_PROFILER_DIR']}: {traces}")
    assert traces


if __name__ == "__main__":
    main()
