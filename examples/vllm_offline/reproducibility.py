"""vLLM examples/offline_inference/reproducibility.py, import swapped: with a global seed, sampled outputs are
the same from run to run (two engines here)."""
import random

from octavo import LLM, SamplingParams

SEED = 42
prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16)


def run() -> list[str]:
    llm = LLM(seed=SEED)
    texts = [o.outputs[0].text for o in llm.generate(prompts, sampling_params)]
    llm.llm_engine.shutdown()
    return texts


def main():
    first = run()
    for p, t in zip(prompts, first):
        print(f"Prompt: {p!r}\nGenerated text: {t!r}\n" + "-" * 50)
    print(random.randint(0, 100))  # the example also shows Python's RNG is not touched by the engine
    assert run() == first, "the same seed gave different outputs"


if __name__ == "__main__":
    main()
