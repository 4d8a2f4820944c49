"""vLLM examples/offline_inference/metrics.py, import swapped: generate, then read llm.get_metrics()
(Counter / Gauge / Vector / Histogram values with their names)."""
from octavo import LLM, SamplingParams
from octavo.metrics import Counter, Gauge, Vector

prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16)


def main():
    llm = LLM(disable_log_stats=False)
    llm.generate(prompts, sampling_params)
    for metric in llm.get_metrics():
        if isinstance(metric, Gauge):
            print(f"{metric.name} (gauge) = {metric.value}")
        elif isinstance(metric, Counter):
            print(f"{metric.name} (counter) = {metric.value}")
        elif isinstance(metric, Vector):
            print(f"{metric.name} (vector) = {metric.values}")
        else:
            print(f"{metric.name} = {getattr(metric, 'count', '?')} observations")


if __name__ == "__main__":
    main()
