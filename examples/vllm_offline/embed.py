"""vLLM examples/offline_inference/basic/embed.py, import swapped: task="embed", one vector per prompt.
(vLLM's example names intfloat/e5-small; octavo pools the embedded decoder's last token instead.)"""
from octavo import LLM


def main():
    prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is",
               "The future of AI is"]
    llm = LLM(task="embed", enforce_eager=True)
    outputs = llm.embed(prompts)
    for prompt, output in zip(prompts, outputs):
        embeds = output.outputs.embedding
        trimmed = str(embeds[:16])[:-1] + ", ...]" if len(embeds) > 16 else embeds
        print(f"Prompt: {prompt!r} \nEmbeddings: {trimmed} (size={len(embeds)})\n" + "-" * 60)


if __name__ == "__main__":
    main()
