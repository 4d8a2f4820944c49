"""``octavo serve [MODEL]``: the OpenAI-compatible server on one model (default: the embedded SmolLM2).

    octavo serve                                   embedded default model on http://127.0.0.1:8000
    octavo serve ./model.gguf --port 8080 --api-key secret --max-queue-len 64

Every engine setting is a flag (``--max-model-len``, ``--max-num-seqs``, ``--chat-template FILE``,
``--disable-frontend-multiprocessing``, ...). The engine core runs in its own process; SIGTERM or
Ctrl-C answers new requests 503, gives running ones ``--shutdown-timeout`` seconds (default 30) to
finish, ends the rest with an error event or JSON error, stops the core and exits 0. If the core
dies the server answers 503 for a moment, then exits with status 1 so a supervisor restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

GRACEFUL_SHUTDOWN_S = 5  # running requests get this long to finish after SIGTERM
DEAD_EXIT_DELAY_S = 2.0  # after the core dies, /health answers 503 this long before the server exits

logger = logging.getLogger("octavo.serve")


def add_parser(subparsers) -> None:
    from octavo.cli.flags import add_settings_arguments

    parser = subparsers.add_parser("serve", help="Start the OpenAI-compatible HTTP server.", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_tag", nargs="?", metavar="MODEL", default=None,
                        help="Model path, .gguf file or hub id (same as --model). Default: the embedded model.")
    add_settings_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    from octavo.start_timing import process_age_s

    age = process_age_s()  # the interpreter's start and the CLI's imports, before this function
    t_start -= age or 0.0
    from octavo.cli.flags import settings_from_args

    if args.model_tag is not None:
        if getattr(args, "model", None) not in (None, args.model_tag):
            print("octavo serve: error: give the model once, as MODEL or --model, not both.", file=sys.stderr)
            return 2
        args.model = args.model_tag
    settings = settings_from_args(args)
    # octavo's own startup lines always show; --uvicorn-log-level only quiets the HTTP server.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(settings, t_start=t_start)


def serve(settings, *, t_start: float | None = None) -> int:
    """Load the model, serve until SIGTERM/Ctrl-C (exit 0) or until the engine core dies (exit 1)."""
    from octavo.async_llm import AsyncLLM
    from octavo.errors import EngineStartError

    t_start = t_start or time.perf_counter()
    srv = settings.server
    own_work_done = []  # perf_counter when the front end's own start work ended (the start log's timeline)

    def while_loading() -> None:
        # The engine core is already loading the model in its own process: import the HTTP server (FastAPI,
        # uvicorn: ~1-2 s) now rather than before starting it, and check the TLS files before the model is ready.
        from octavo.server import structured

        # the grammar library (xgrammar imports torch: ~1 s of CPU) is imported once the server answers, not
        # while the core loads (it competed with the tokenizer and HTTP imports for this process's GIL and CPU)
        structured.DEFER_WARM = []
        from octavo.server.vllm_server import check_server_settings

        try:
            check_server_settings(settings)
        except ValueError as e:
            raise _BadServerSettings(str(e)) from None
        import uvicorn  # noqa: F401

        _import_app_modules()
        own_work_done.append(time.perf_counter())

    in_process = srv.disable_frontend_multiprocessing  # the core loads in this thread: check first
    try:
        if in_process:
            from octavo.core import engine_prestart

            engine_prestart.discard()  # a core process spawned before the settings said "in-process"
            while_loading()
        try:
            engine = AsyncLLM.from_settings(settings, while_loading=None if in_process else while_loading)
        finally:  # the front end's start-up imports are done (or failed): collect garbage again (core/start_gc.py)
            from octavo.core.start_gc import resume_gc

            resume_gc()
    except _BadServerSettings as e:
        print(f"octavo serve: error: {e}", file=sys.stderr)
        return 2
    except EngineStartError as e:
        print(f"octavo serve: error: {e}", file=sys.stderr)
        return 1
    import uvicorn

    from octavo.server import build_app
    from octavo.server.vllm_server import uvicorn_ssl_kwargs

    t_ready = time.perf_counter()
    try:
        info = engine.get_model_info()
        app = build_app(engine, settings)
        mode = "in-process core" if srv.disable_frontend_multiprocessing else \
            f"core process pid {engine._client.proc.pid}"
        logger.info("loaded %s (%s, %s on %s, %d KV blocks of %d tokens, max_model_len %d) in %.1f s; %s",
                    info.model, info.architecture, info.dtype, info.device, info.num_kv_blocks, info.block_size,
                    info.max_model_len, engine.load_time_s, mode)
        config = uvicorn.Config(app, host=srv.host, port=srv.port, log_level=srv.uvicorn_log_level.lower(),
                                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, lifespan="off",
                                access_log=srv.uvicorn_log_level.lower() in ("debug", "trace"),
                                **uvicorn_ssl_kwargs(settings))  # the access log: octavo.server.vllm_server
        from octavo.server.shutdown import GracefulServer

        # SIGTERM/SIGINT: 503 for new requests, running ones get --shutdown-timeout, the rest end with an error.
        server = GracefulServer(config, engine=engine, state=app.state.server_state, timeout_s=srv.shutdown_timeout)
        dead = []

        def on_dead(reason: str) -> None:
            dead.append(reason)
            logger.error("engine core died; answering 503 and exiting in %.0f s", DEAD_EXIT_DELAY_S)
            asyncio.get_running_loop().call_later(DEAD_EXIT_DELAY_S, setattr, server, "should_exit", True)

        engine.dead_observers.append(on_dead)

        async def main() -> None:
            task = asyncio.ensure_future(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.02)
            if server.started:
                # read the core's outputs (and watch its process sentinel) from now on, not from the first
                # request: a core that dies while the server is idle must turn /health 503 and end the server
                engine._ensure_output_task()
                from octavo.server.structured import start_deferred_warm

                start_deferred_warm()
                key = " (API key required)" if srv.api_key else ""
                now = time.perf_counter()
                logger.info("serving model %r on %s://%s:%d%s, %.1f s after start; POST /v1/chat/completions",
                            app.state.model_name, "https" if srv.ssl_certfile else "http", srv.host,
                            _bound_port(server, srv.port), key, now - t_start)
                from octavo.core.engine_prestart import spawned_at_s

                # which process the start waited on: compare with the core's ready time (spawned at + its "engine
                # start took"); when the front end's own work ends later, the front end is the path
                own = f"; front end's own work (tokenizer + server imports) done at {own_work_done[0] - t_start:.2f} " \
                      "s" if own_work_done else ""
                logger.info("start: %sbefore the engine (interpreter + imports + settings) %.2f s; engine (core "
                            "process start to ready, tokenizer + HTTP server imports meanwhile, the core logs its "
                            "own phases) %.2f s; app + HTTP server %.2f s%s",
                            "" if spawned_at_s is None else f"core process spawned at {spawned_at_s:.2f} s; ",
                            t_ready - engine.load_time_s - t_start, engine.load_time_s, now - t_ready, own)
            await task
            logger.info("HTTP server stopped")

        # uvicorn re-raises the signal that stopped it once it is done: make that a no-op here so the
        # cleanup below runs and the exit status is ours.
        stopped_by = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: stopped_by.append(s))
        asyncio.run(main())
    finally:
        t_stop = time.perf_counter()
        engine.shutdown()
        logger.info("engine core stopped in %.1f s", time.perf_counter() - t_stop)
    if dead:
        print(f"octavo serve: the engine core died: {dead[0].strip().splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def _import_app_modules() -> None:
    """Import what ``build_app`` and uvicorn's start import, while the core still loads: the route modules,
    FastAPI's ``pydantic.v1`` check at its first route, uvicorn's protocol and lifespan classes. After the core was
    ready they cost ~0.15 s of CPU on the path to the first 200 (issue 18 start-up, session 9). A module that
    fails to import here is left for the same import after ready to raise, where it always did."""
    import importlib
    import warnings

    from uvicorn import config as uvicorn_config

    names = ["octavo.lora.serving", "octavo.registry", "octavo.generation_config", "octavo.server.embeddings",
             "octavo.server.pooling_routes", "octavo.server.vllm_routes", "octavo.server.lora_routes",
             "octavo.server.responses", "octavo.server.shutdown"]
    tables = [(getattr(uvicorn_config, table, None) or {}).get(key) for table, key in
              (("HTTP_PROTOCOLS", "auto"), ("WS_PROTOCOLS", "auto"), ("LIFESPAN", "off"))]  # as octavo configures it
    names += [target.split(":")[0] for target in tables if isinstance(target, str)]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    with warnings.catch_warnings():  # as FastAPI imports it (fastapi/_compat/shared.py)
        warnings.simplefilter("ignore", UserWarning)
        try:
            from pydantic import v1  # noqa: F401
        except ImportError:
            pass


class _BadServerSettings(Exception):
    """A server setting (TLS files) that cannot work: exit 2 with its message, after stopping the core."""


def _bound_port(server, default: int) -> int:
    try:
        return server.servers[0].sockets[0].getsockname()[1]
    except (AttributeError, IndexError):
        return default
