"""A third-party model plugin (tests/fixtures/octavo-fixture-model: GPT-NeoX, which octavo does not ship),
pip-installed for this module: discovered through its entry point, passes its own ModelContract suite, and
``octavo serve`` serves a GPT-NeoX checkpoint with it — greedy tokens equal transformers'. Uninstalled after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "octavo-fixture-model"
DIST, ARCH = "octavo-fixture-model", "GPTNeoXForCausalLM"

pytestmark = pytest.mark.slow


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OCTAVO_PLUGINS", "OCTAVO_DISABLE_PLUGINS")}


@pytest.fixture(scope="module", autouse=True)
def installed():
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "-q", "--no-deps", "--no-build-isolation", "-e", str(FIXTURE)], check=True)
    try:
        yield
    finally:
        subprocess.run(pip + ["uninstall", "-y", "-q", DIST], check=True)


def test_discovered_by_octavo_plugins():
    proc = subprocess.run([sys.executable, "-m", "octavo.cli.main", "plugins", "--json"], capture_output=True,
                          text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    plugin = {p["name"]: p for p in json.loads(proc.stdout)}["fixture_model"]
    assert (plugin["distribution"], plugin["error"]) == (DIST, None)
    regs = {r["name"]: r for r in plugin["registrations"]}
    assert regs[ARCH]["target"] == "octavo_fixture_model.gpt_neox:GPTNeoXForCausalLM"


def test_passes_its_own_model_contract():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=FIXTURE,
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "error" not in summary


def test_octavo_serve_runs_the_plugin_model(tmp_path):
    import openai
    import transformers as T

    from octavo.server.launch import ServerProcess
    from octavo.testing.model import randomize_
    from tests.plugins.test_model_contracts import save_word_tokenizer

    config = T.GPTNeoXConfig(architectures=[ARCH], vocab_size=256, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    ref = randomize_(T.AutoModelForCausalLM.from_config(config, dtype=torch.float32)).eval()
    ref.save_pretrained(tmp_path)
    save_word_tokenizer(str(tmp_path))
    prompt = [5, 77, 31, 200, 9, 14, 150, 3, 42, 99, 18]
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            seq.append(int(ref(torch.tensor([seq])).logits[0, -1].argmax()))
    args = [str(tmp_path), "--dtype", "float32", "--max-model-len", "128", "--uvicorn-log-level", "warning"]
    with ServerProcess(args, env=_env()) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        resp = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
        assert resp.choices[0].model_extra["token_ids"] == seq[len(prompt):]
