"""`octavo generate` and `octavo chat` as a user runs them: real subprocesses on the embedded model."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

OCTAVO = [sys.executable, "-m", "octavo.cli.main"]


def run(args, stdin=None, timeout=600):
    return subprocess.run(OCTAVO + args, input=stdin, capture_output=True, text=True, timeout=timeout)


def test_generate_matches_the_sdk_and_chat_answers():
    from octavo import LLM, SamplingParams

    r = run(["generate", "The capital of France is", "--max-tokens", "8", "--max-model-len", "256"])
    assert r.returncode == 0, r.stderr
    llm = LLM(max_model_len=256)
    want = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert r.stdout.strip() == want[0].outputs[0].text.strip()

    chat = run(["chat", "--max-tokens", "16", "--max-model-len", "512"], stdin="What is 2+2?\n/exit\n")
    assert chat.returncode == 0, chat.stderr
    reply = llm.chat([{"role": "user", "content": "What is 2+2?"}], SamplingParams(temperature=0, max_tokens=16),
                     use_tqdm=False)
    assert chat.stdout.strip() == reply[0].outputs[0].text.strip()


def test_generate_bad_flag_value_names_the_field():
    r = run(["generate", "hi", "--block-size", "3"])
    assert r.returncode != 0
    assert "block_size" in r.stderr and "power of two" in r.stderr
