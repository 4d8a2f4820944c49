"""vLLM examples/offline_inference/async_llm_streaming.py, import swapped: AsyncLLM.from_engine_args and a
DELTA stream, printed token by token."""
import asyncio

from octavo import AsyncEngineArgs, AsyncLLM, SamplingParams
from octavo.sampling_params import RequestOutputKind


async def stream_response(engine: AsyncLLM, prompt: str, request_id: str) -> str:
    print(f"\n🚀 Prompt: {prompt!r}\n💬 Response: ", end="", flush=True)
    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=42,
                            output_kind=RequestOutputKind.DELTA)
    text = ""
    async for output in engine.generate(request_id=request_id, prompt=prompt, sampling_params=params):
        for completion in output.outputs:
            print(completion.text, end="", flush=True)
            text += completion.text
        if output.finished:
            print("\n✅ Request completed")
            break
    return text


async def main():
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(enforce_eager=True))
    try:
        for i, prompt in enumerate(["The future of artificial intelligence is", "In a galaxy far, far away",
                                    "The best way to learn programming is"]):
            assert await stream_response(engine, prompt, f"stream-example-{i}")
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
