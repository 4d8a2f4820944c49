"""The hook specifications of project ``octavo``: every seam a plugin can fill, grouped by lifecycle.

A plugin is a module (or object) named by an entry point of group ``octavo``; it implements any subset of
these hooks with ``@octavo.hookimpl``, and each implementation may accept any subset of a hook's arguments,
so specs can grow without breaking plugins. All hooks run while something is being built (the plugin
manager, the engine, the CLI parser, the server app) -- never inside ``step()`` or ``forward()``.

Lifecycle, in the order hooks fire::

    1. registration   octavo_register_{platforms, attention_backends, models, quantizers, speculators}
                      (once per process, when the plugin manager loads: every process, workers included)
    2. selection      octavo_select_platform, octavo_select_attention_backend   (firstresult)
                      (while the engine core is built, in the engine-core / worker process)
    3. extension      octavo_add_cli_commands (CLI parser), octavo_add_routes (server app),
                      octavo_register_stat_loggers (engine build)
    4. notification   octavo_on_engine_start, octavo_on_engine_shutdown

Every hook is documented, with an example, in ``docs/plugins.md``; a test fails when one is not.
"""

from __future__ import annotations

from typing import Any

from octavo.hooks import hookspec

# ---------------------------------------------------------------------------------------------------------
# 1. Registration: fill a registry with lazy "module:Class" targets. Runs once per process when the plugin
#    manager loads (front end, engine core and every worker). Must not import heavy modules or touch a device.
# ---------------------------------------------------------------------------------------------------------


@hookspec
def octavo_register_platforms(register: Any) -> None:
    """Register hardware platforms.

    When: once per process, when the plugin manager loads. Process: every one (front end, engine core,
    workers). Contract: call ``register(name, "module:Class")`` for each :class:`octavo.Platform` subclass;
    the target is imported only when the platform is resolved. Built-ins use ``trylast``; a third-party
    plugin registering the same name shadows the built-in; two third-party plugins on one name is an error.
    """


@hookspec
def octavo_register_attention_backends(register: Any) -> None:
    """Register paged-attention backends.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(name, "module:Class")`` for each :class:`octavo.AttentionBackend` subclass (lazy target;
    importing the plugin module must not import the kernel library). Shadowing as for platforms.
    """


@hookspec
def octavo_register_models(register: Any) -> None:
    """Register model architectures.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(architecture, "module:Class")`` where ``architecture`` is the Hugging Face ``architectures``
    entry (e.g. ``"LlamaForCausalLM"``) and the class follows :class:`octavo.ModelProtocol`.
    """


@hookspec
def octavo_register_quantizers(register: Any) -> None:
    """Register quantization schemes.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(quant_method, "module:Class")`` where ``quant_method`` is the checkpoint's
    ``quantization_config.quant_method`` and the class is an :class:`octavo.Quantizer`.
    """


@hookspec
def octavo_register_speculators(register: Any) -> None:
    """Register speculative-decoding proposers.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(method, "module:Class")`` for each :class:`octavo.Speculator` (``method`` is what a user
    names in the speculative config, e.g. ``"ngram"``).
    """


# ---------------------------------------------------------------------------------------------------------
# 2. Selection: firstresult hooks; the first non-None answer wins, an explicit setting beats every hook.
# ---------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def octavo_select_platform(settings: Any) -> str | None:
    """Choose the platform when ``settings.device.device`` is not set.

    When: while the engine is built (``PluginManager.select_platform``). Process: the engine core (and each
    worker). Contract: return a registered platform name, or ``None`` to pass. The first non-None answer
    wins; without one, the first available platform in built-in preference order is used, ``cpu`` last.
    """


@hookspec(firstresult=True)
def octavo_select_attention_backend(
    settings: Any,
    platform: Any,
    dtype: Any,
    head_size: int,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    block_size: int,
) -> str | None:
    """Choose the attention backend when ``settings.device.attention_backend`` is not set.

    When: while the model runner is built, once per distinct layer shape. Process: the engine core / worker
    that owns the device. Contract: return a registered backend name, or ``None`` to pass. The chosen
    backend must still pass ``is_available()`` and ``supports(...)``, else the engine fails at start with
    the reason. Without an answer, ``platform.preferred_attention_backends()`` decides, ``torch_sdpa`` last.
    """


# ---------------------------------------------------------------------------------------------------------
# 3. Extension: add to the CLI, the server and the statistics observers.
# ---------------------------------------------------------------------------------------------------------


@hookspec
def octavo_add_cli_commands(subparsers: Any) -> None:
    """Add subcommands to the ``octavo`` CLI.

    When: each time the CLI parser is built (``octavo ...``). Process: the CLI process. Contract: call
    ``subparsers.add_parser(name, help=...)`` (an ``argparse`` sub-parsers action), add arguments, and set
    ``func=callable(args) -> int`` with ``parser.set_defaults``. Do the heavy work inside ``func``.
    """


@hookspec
def octavo_add_routes(app: Any, engine: Any) -> None:
    """Add HTTP routes to the OpenAI-compatible server.

    When: once, while the server's FastAPI app is built, before it starts serving. Process: the API server
    process. Contract: add routes to ``app`` (``app.get(...)``, ``app.include_router(...)``); ``engine`` is
    the server's ``AsyncLLM`` client. Routes share the server's auth and lifespan.
    """


@hookspec
def octavo_register_stat_loggers(register: Any, settings: Any) -> None:
    """Register observers of per-step and per-request statistics.

    When: once, while the engine is built. Process: the engine core (where ``step()`` runs). Contract: call
    ``register(obj)`` with an object that has ``record(stats: SchedulerStats, outputs)`` (``outputs``: the
    step's list of ``EngineCoreOutput``); the engine resolves the list once and then calls ``record``
    directly after every step (no hook dispatch per step), so ``record`` must be cheap and must not raise.
    """


# ---------------------------------------------------------------------------------------------------------
# 4. Notifications: no return value; exceptions propagate (a plugin that cannot start stops the engine).
# ---------------------------------------------------------------------------------------------------------


@hookspec
def octavo_on_engine_start(settings: Any) -> None:
    """Called once after the engine is built (model loaded, KV cache allocated), before the first step.

    Process: the process that built the engine (the engine core). Contract: observe or set up side
    resources (metrics exporters, warm caches); do not change ``settings``.
    """


@hookspec
def octavo_on_engine_shutdown(settings: Any) -> None:
    """Called once when the engine shuts down cleanly (``shutdown()``), after the last step.

    Process: the engine-core process. Contract: release what ``octavo_on_engine_start`` set up; must not
    raise, so that shutdown always completes.
    """


#: hook name -> lifecycle group, for ``octavo plugins`` and the docs test.
HOOK_GROUPS: dict[str, str] = {
    "octavo_register_platforms": "registration",
    "octavo_register_attention_backends": "registration",
    "octavo_register_models": "registration",
    "octavo_register_quantizers": "registration",
    "octavo_register_speculators": "registration",
    "octavo_select_platform": "selection",
    "octavo_select_attention_backend": "selection",
    "octavo_add_cli_commands": "extension",
    "octavo_add_routes": "extension",
    "octavo_register_stat_loggers": "extension",
    "octavo_on_engine_start": "notification",
    "octavo_on_engine_shutdown": "notification",
}
