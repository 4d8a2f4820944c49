"""vLLM examples/offline_inference/basic/chat.py, import swapped: one conversation, then a batch of ten, then
a custom chat template."""
from octavo import LLM, SamplingParams


def main():
    llm = LLM()
    sampling_params = SamplingParams(max_tokens=32, temperature=0)

    def show(outputs):
        for o in outputs:
            print(f"Prompt: {o.prompt!r}\nGenerated text: {o.outputs[0].text!r}\n" + "-" * 80)

    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    show(llm.chat(conversation, sampling_params, use_tqdm=False))
    show(llm.chat([conversation for _ in range(10)], sampling_params, use_tqdm=True))
    template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    show(llm.chat(conversation, sampling_params, use_tqdm=False, chat_template=template))


if __name__ == "__main__":
    main()
