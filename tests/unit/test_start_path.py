"""The start path (issues 17/18): what ``octavo serve`` imports before it starts the engine core, the calloc'd
KV cache, the start-phase log, and the TLS check that now runs while the core loads."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from octavo.core.lazy_zeros import zeros


def test_cli_parser_imports_nothing_heavy():
    """``octavo serve`` builds every command's parser before it starts the core: no torch, transformers, FastAPI."""
    code = ("from octavo.cli.main import build_parser; build_parser(); import sys; "
            "print(sorted(m for m in ('torch', 'transformers', 'fastapi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_spawn_happens_before_heavy_imports_and_the_core_skips_main(tmp_path):
    """``octavo serve`` starts its core right after ``import octavo``: nothing before it loads pluggy or
    importlib.metadata (~0.1-0.4 s), and the child does not re-run the front end's ``__main__`` (multiprocessing's
    spawn does so for any ``__main__`` with a file or spec): the marker below prints once, from the parent."""
    script = tmp_path / "front.py"
    script.write_text(
        "import sys\nprint('MAIN RAN', flush=True)\n"
        "if __name__ == '__main__':\n"
        "    import octavo.cli.main\n    from octavo.core import engine_prestart\n"
        "    print(sorted(m for m in ('pluggy', 'importlib.metadata') if m in sys.modules), flush=True)\n"
        "    engine_prestart.prestart(['serve', '--model', 'org/not-a-file'])\n"
        "    import psutil\n    print('children', len(psutil.Process().children()), flush=True)\n"
        "    proc, conn = engine_prestart._pending.pop()\n    conn.close()\n    proc.join(280)\n"
        "    print('exit', proc.exitcode, flush=True)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # the child imported the engine, read EOF on its pipe and exited 0; the marker printed once (the parent)
    assert out.stdout.count("MAIN RAN") == 1 and "[]" in out.stdout and "exit 0" in out.stdout, out.stdout
    if sys.platform == "linux":  # forked: the core is the only child (spawn adds a resource-tracker process)
        assert "children 1" in out.stdout, out.stdout


def test_front_end_tokenizer_and_server_import_no_torch():
    """The front end's whole start path (GGUF tokenizer, FastAPI app) runs without torch: the core imports it."""
    code = ("import sys; from octavo.config import OctavoSettings; from octavo.core.loader import load_tokenizer; "
            "load_tokenizer(OctavoSettings.from_kwargs().model); import octavo.server, octavo.frontend, uvicorn; "
            "import octavo.lora.serving; from octavo.cli.serve import _import_app_modules; _import_app_modules(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
def test_lazy_zeros_are_zeros(dtype):
    shape = (2, 300, 16, 3, 64)  # > 1 MiB: the calloc path
    t = zeros(shape, dtype, "cpu")
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.data_ptr() % 64 == 0
    assert not t.view(torch.uint8).any()
    t[1, 299].fill_(1)  # writable, and the memory is the tensor's own
    assert t.view(torch.uint8).count_nonzero() > 0
    small = zeros((3, 4), dtype, "cpu")
    assert small.shape == (3, 4) and not small.view(torch.uint8).any()


def test_engine_start_logs_its_phases(tmp_path, caplog):
    from octavo import LLM

    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=256)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.INFO, logger="octavo.engine"):
        llm = LLM(str(tmp_path), load_format="dummy", skip_tokenizer_init=True, max_model_len=128,
                  kv_cache_memory_bytes=1 << 22)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine start took")]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    for phase in ("resolve model and config", "KV cache allocation",
                  "platform set-up", "engine core set-up", "build model + load weights"):
        assert phase in lines[0], lines[0]
    del llm


def test_serve_bad_tls_file_fails_while_the_core_loads(tmp_path):
    """The TLS check moved after the core's start (it runs while the model loads): same message, exit 2."""
    missing = str(tmp_path / "missing.pem")
    p = subprocess.run([sys.executable, "-m", "octavo.cli.main", "serve", "--port", "0", "--max-model-len", "256",
                        "--ssl-keyfile", missing, "--ssl-certfile", missing], capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "no such file" in p.stderr and "ssl-keyfile" in p.stderr


def test_start_gc_pause_ends_frozen_and_enabled():
    """``octavo serve`` pauses the cyclic collector for its start-up imports (core/start_gc.py): the pause
    ends with the collector on and the start-up objects frozen, also when the pre-started core is not used."""
    import gc

    from octavo.core import engine_prestart
    from octavo.core import start_gc as ep

    assert gc.isenabled()
    try:
        ep.pause_gc()
        ep.pause_gc()  # once only
        assert not gc.isenabled()
        ep.resume_gc()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        ep.resume_gc()  # idempotent
        assert gc.isenabled()
        gc.unfreeze()
        ep.pause_gc()
        engine_prestart.discard()  # an in-process core, bad arguments: this process collects again
        assert gc.isenabled()
        # the core's serving loop: the start-up freeze is handed back, then the whole heap is frozen there
        from octavo.core.gc_heap import enabled, frozen_heap

        gc.unfreeze()
        ep._startup_frozen.clear()
        startup = [0]  # an object of the start-up
        ep.pause_gc()
        ep.resume_gc()
        later = [[i] for i in range(50_000)]  # objects made after the start-up (the model, the engine)
        ep.end_startup_freeze()
        assert gc.get_freeze_count() == 0
        with frozen_heap():
            # both are frozen, i.e. out of the collector's generations: checked on the objects, not by a count
            # compared with the start-up's (a thread an earlier test left running may free frozen objects meanwhile)
            targets = {id(startup), id(later[0]), id(later[-1])}
            assert not enabled() or not any(id(o) in targets for o in gc.get_objects())
        del later
    finally:
        gc.unfreeze()
        gc.enable()
