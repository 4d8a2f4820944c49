"""An engine-core process started before ``octavo serve`` has parsed its settings (issue 18: start-up).

Why: the core's critical path is its interpreter start plus ``import torch`` and the engine modules (~1.5-2 s
on a 2-vCPU machine), and before this the front end spent ~0.5 s (its CLI imports, the settings' pydantic
models, argument parsing) before it even spawned the core. ``octavo serve`` now spawns the core first thing
(``prestart``): the child imports torch and the engine while the front end parses, then blocks on a pipe for
``run_engine_core``'s arguments, which ``MPEngineCoreClient`` sends (``take``) once it has the settings and its
sockets. On Linux the child is forked (session 8: nothing heavy is imported yet and no thread runs, so it skips
a second interpreter and spawn's bootstrap), elsewhere spawned. The child starts hashing the GGUF file the command
line names (the weights cache key) before its imports too; a wrong guess only costs that thread.

A front end that does not use it (bad arguments, ``--help``, an in-process core) closes the pipe (``discard``,
or its exit does): the child reads EOF and exits 0. ``OCTAVO_PRESTART_CORE=0`` turns this off.

Session 9: the cyclic GC is paused for both processes' start-up imports (core/start_gc.py): the front end pauses it
before the fork, the child resumes after its imports, ``discard`` resumes it in the front end.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from typing import Any

_pending: list[tuple[Any, Any]] = []  # (process, sending end of its pipe), at most one
spawned_at_s: float | None = None  # this process's age when it spawned the core (`octavo serve` logs it)


def _model_hint(argv: list[str]) -> str | None:
    """The GGUF file ``octavo serve ARGV`` loads, when the arguments say so plainly: a ``.gguf`` path among
    them, or the embedded model when no model-like argument is given (None: unknown)."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--model=") else \
            argv[i + 1] if arg == "--model" and i + 1 < len(argv) else arg
        if value.endswith(".gguf"):
            return os.path.abspath(value)
    if "--model" in argv or any(a.startswith(("--model=", "--config")) for a in argv):
        return None
    # a positional MODEL (a directory, a hub id "org/name") looks like a path; option values (ports, levels) don't
    if any("/" in a or os.path.exists(a) for a in argv if not a.startswith("-")):
        return None
    return ""  # the embedded model


def wanted(argv: list[str]) -> bool:
    """True for a plain ``octavo serve ...`` whose core runs in its own process."""
    from octavo.env_flags import env_switch

    if not argv or argv[0] != "serve" or not env_switch("OCTAVO_PRESTART_CORE", True):
        return False
    return not any(a in ("-h", "--help", "--disable-frontend-multiprocessing") for a in argv)


def prestart(argv: list[str]) -> None:
    """Spawn the engine-core process now (see the module docstring)."""
    global spawned_at_s
    if _pending:
        return
    # fork on Linux: nothing but the octavo package and multiprocessing is imported yet and no thread runs, and a
    # forked child skips a new interpreter, site, the spawn bootstrap and spawn's resource-tracker process
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    recv_end, send_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=prestarted_core_main, args=(recv_end, _model_hint(argv[1:]), send_end),
                       name="octavo-engine-core", daemon=True)
    main = sys.modules.get("__main__")
    saved = {k: v for k, v in vars(main).items() if k in ("__spec__", "__file__")} if main is not None else {}
    try:  # spawn re-runs the parent's __main__ (the CLI) in the child unless it has no spec or file: the child
        # runs a function of this module and needs none of it (it cost the core ~0.1-0.4 s before its own imports)
        for k in saved:
            setattr(main, k, None)
        proc.start()
    finally:
        for k, v in saved.items():
            setattr(main, k, v)
    recv_end.close()
    _pending.append((proc, send_end))
    from octavo.start_timing import process_age_s

    spawned_at_s = process_age_s()


def take(args: tuple) -> Any | None:
    """Hand ``run_engine_core``'s ``args`` to the pre-started process and return it (None: there is none, or
    it died: the caller spawns one as before)."""
    while _pending:
        proc, conn = _pending.pop()
        try:
            if not proc.is_alive():
                raise OSError("the pre-started engine core exited")
            conn.send(args)
            import logging

            logging.getLogger("octavo.engine_client").info(
                "engine core: process pid %d, started before the settings were parsed", proc.pid)
            return proc
        except OSError:
            proc.join(0.1)
        finally:
            conn.close()
    return None


def discard() -> None:
    """Let an unused pre-started process go (it exits on the closed pipe); this process collects again."""
    from octavo.core.start_gc import resume_gc

    resume_gc()
    while _pending:
        proc, conn = _pending.pop()
        conn.close()
        proc.join(5.0)
        if proc.is_alive():
            proc.terminate()


def prestarted_core_main(conn: Any, model_hint: str | None, parent_end: Any = None) -> None:
    """The child: hash the GGUF, import the engine, wait for the arguments, run the core. ``parent_end``: the
    front end's sending end, which a forked child inherits and closes (or it would never read EOF)."""
    if parent_end is not None:
        parent_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C while the front end parses: it decides
    from octavo.core.loader.weights_cache_key import prefetch_for_model

    if model_hint is not None:
        prefetch_for_model(model_hint or None)
    import octavo.config  # noqa: F401 - what run_engine_core imports first, now, while the front end parses
    import octavo.core.engine_core  # noqa: F401
    from octavo.core.engine_core_proc import run_engine_core
    from octavo.core.engine_start import note_imports_done

    note_imports_done()
    from octavo.core.start_gc import resume_gc

    resume_gc()  # before the settings and the model: loading may make cyclic garbage that must be collected
    try:
        args = conn.recv()
    except (EOFError, OSError):  # the front end did not need us
        sys.stdout.flush()
        os._exit(0)
    conn.close()
    run_engine_core(*args)
