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

The hook list is kept in one place: this module. A registry kind is any ``octavo_register_<kind>`` spec whose
only argument is ``register`` (:func:`registry_kinds`); the lifecycle group of each hook follows from its
name (:data:`HOOK_GROUPS`). Adding a kind is adding one spec here -- nothing else in core changes.
"""

from __future__ import annotations

import inspect
import sys
from typing import TYPE_CHECKING, Any

from octavo.hooks import Register, hookspec

if TYPE_CHECKING:  # annotations only: importing this module stays light
    import argparse
    from collections.abc import Callable

    import torch
    from fastapi import FastAPI

    from octavo.async_llm import AsyncLLM
    from octavo.config import OctavoSettings
    from octavo.platform import Platform

# ---------------------------------------------------------------------------------------------------------
# 1. Registration: fill a registry with lazy "module:Class" targets. Runs once per process when the plugin
#    manager loads (front end, engine core and every worker). Must not import heavy modules or touch a device.
# ---------------------------------------------------------------------------------------------------------


@hookspec
def octavo_register_platforms(register: Register) -> None:
    """Register hardware platforms.

    When: once per process, when the plugin manager loads. Process: every one (front end, engine core,
    workers). Contract: call ``register(name, "module:Class")`` for each :class:`octavo.Platform` subclass;
    the target is imported only when the platform is resolved. Built-ins use ``trylast``; a third-party
    plugin registering the same name shadows the built-in; two third-party plugins on one name is an error.
    """


@hookspec
def octavo_register_attention_backends(register: Register) -> None:
    """Register paged-attention backends.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(name, "module:Class")`` for each :class:`octavo.AttentionBackend` subclass (lazy target;
    importing the plugin module must not import the kernel library). Shadowing as for platforms.
    """


@hookspec
def octavo_register_models(register: Register) -> None:
    """Register model architectures.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(architecture, "module:Class")`` where ``architecture`` is the Hugging Face ``architectures``
    entry (e.g. ``"LlamaForCausalLM"``) and the class follows :class:`octavo.ModelProtocol`.
    """


@hookspec
def octavo_register_quantizers(register: Register) -> None:
    """Register quantization schemes.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(quant_method, "module:Class")`` where ``quant_method`` is the checkpoint's
    ``quantization_config.quant_method`` and the class is an :class:`octavo.Quantizer`.
    """


@hookspec
def octavo_register_speculators(register: Register) -> None:
    """Register speculative-decoding proposers.

    When: once per process, when the plugin manager loads. Process: every one. Contract: call
    ``register(method, "module:Class")`` for each :class:`octavo.Speculator` (``method`` is what a user
    names in the speculative config, e.g. ``"ngram"``).
    """


@hookspec
def octavo_register_structured_output_backends(register: Register) -> None:
    """Register grammar libraries for structured outputs (JSON schema, regex, choice, grammar).

    When: once per process, when the plugin manager loads. Process: every one (the front end validates
    grammars with the class, the engine core compiles them). Contract: call ``register(name,
    "module:Class")`` for each :class:`octavo.structured_outputs.StructuredOutputBackend` (``name`` is what
    ``--structured-outputs-backend`` takes, e.g. ``"xgrammar"``).
    """


@hookspec
def octavo_register_tool_parsers(register: Register) -> None:
    """Register parsers that turn a model's text into OpenAI ``tool_calls``.

    When: once per process, when the plugin manager loads. Process: every one (used by the API server).
    Contract: call ``register(name, "module:Class")`` for each :class:`octavo.parsers.ToolParser` (``name``
    is what ``--tool-call-parser`` takes, e.g. ``"hermes"``).
    """


@hookspec
def octavo_register_reasoning_parsers(register: Register) -> None:
    """Register parsers that split a model's reasoning (``<think>...</think>``) from its answer.

    When: once per process, when the plugin manager loads. Process: every one (the server splits the text,
    the engine core starts structured output after the reasoning ends). Contract: call ``register(name,
    "module:Class")`` for each :class:`octavo.parsers.ReasoningParser` (``name`` is what
    ``--reasoning-parser`` takes, e.g. ``"deepseek_r1"``).
    """


@hookspec
def octavo_register_executors(register: Register) -> None:
    """Register executors: how the engine core runs steps on its workers (in-process, processes, hosts).

    When: once per process, when the plugin manager loads. Process: every one (the engine core builds the
    one named by ``distributed_executor_backend``). Contract: call ``register(name, "module:Class")`` for
    each :class:`octavo.executor.Executor` (``name`` is what ``--distributed-executor-backend`` takes,
    e.g. ``"mp"``); it moves :mod:`octavo.step` data only.
    """


@hookspec
def octavo_register_modality_processors(register: Register) -> None:
    """Register multimodal input processors, one per model architecture that takes images (or audio, ...).

    When: once per process, when the plugin manager loads. Process: the front end (it turns a prompt's
    ``multi_modal_data`` into model tensors and placeholder tokens). Contract: call
    ``register(architecture, "module:Class")``; the class declares ``modalities`` (e.g. ``("image",)``) and
    is built as ``Class(hf_config, model_path)`` (see plugins/multimodal/ and docs/multimodal.md).
    """


# ---------------------------------------------------------------------------------------------------------
# 2. Selection: firstresult hooks; the first non-None answer wins, an explicit setting beats every hook.
# ---------------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def octavo_select_platform(settings: OctavoSettings | None) -> str | None:
    """Choose the platform when ``settings.device.device`` is not set.

    When: while the engine is built. Process: the engine core (and each worker). Contract: return a
    registered platform name, or ``None`` to pass. The first non-None answer wins. The built-in answer is a
    ``trylast`` implementation (so any plugin outranks it): the available platform with the highest
    ``Platform.priority`` (``cpu`` is lowest).
    """


@hookspec(firstresult=True)
def octavo_select_attention_backend(
    settings: OctavoSettings | None,
    platform: Platform,
    dtype: torch.dtype,
    head_size: int,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    block_size: int,
) -> str | None:
    """Choose the attention backend when ``settings.device.attention_backend`` is not set.

    When: once per model, while the worker is built (one backend serves every paged layer; the arguments
    describe the first layer, ``sliding_window`` the largest window of any layer). Process: each worker (the
    process that owns the device). Contract: return a registered backend name, or ``None`` to pass. The
    chosen backend must still pass ``is_available()`` and ``supports(...)``, else the engine fails at start
    with the reason. The built-in answer is a ``trylast`` implementation: the platform's
    ``preferred_attention_backends()``, then every backend by its ``platform_priority`` for this platform,
    ``torch_sdpa`` last, the first that is available and supports the shape.
    """


# ---------------------------------------------------------------------------------------------------------
# 3. Extension: add to the CLI, the server and the statistics observers.
# ---------------------------------------------------------------------------------------------------------


@hookspec
def octavo_add_cli_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add subcommands to the ``octavo`` CLI.

    When: each time the CLI parser is built (``octavo ...``). Process: the CLI process. Contract: call
    ``subparsers.add_parser(name, help=...)`` (an ``argparse`` sub-parsers action), add arguments, and set
    ``func=callable(args) -> int`` with ``parser.set_defaults``. Do the heavy work inside ``func``.
    """


@hookspec
def octavo_add_routes(app: FastAPI, engine: AsyncLLM) -> None:
    """Add HTTP routes to the OpenAI-compatible server.

    When: once, while the server's FastAPI app is built, before it starts serving. Process: the API server
    process. Contract: add routes to ``app`` (``app.get(...)``, ``app.include_router(...)``); ``engine`` is
    the server's ``AsyncLLM`` client. Routes share the server's auth and lifespan.
    """


@hookspec
def octavo_register_stat_loggers(register: Callable[[Any], None], settings: OctavoSettings) -> None:
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
def octavo_on_engine_start(
    settings: OctavoSettings,
    platform: str,
    attention_backend: str | None,
    dtype: str,
    quantization: str | None,
    num_kv_blocks: int,
    block_size: int,
) -> None:
    """Called once after the engine is built (model loaded, KV cache allocated), before the first step.

    Process: the process that built the engine (the engine core). Contract: observe or set up side
    resources (metrics exporters, warm caches); do not change ``settings``. The other arguments say what was
    chosen: the platform name, the attention backend name (``None`` for a model without paged attention),
    the compute dtype (``"bfloat16"``), the quantization method (``None`` when unquantized) and the KV cache
    size (``num_kv_blocks`` blocks of ``block_size`` tokens). The same facts are logged at start.
    """


@hookspec
def octavo_on_engine_shutdown(settings: OctavoSettings) -> None:
    """Called once when the engine shuts down cleanly (``shutdown()``), after the last step.

    Process: the engine-core process. Contract: release what ``octavo_on_engine_start`` set up; must not
    raise, so that shutdown always completes.
    """


def _specs() -> dict[str, Any]:
    """Every hookspec of this module, by name, in definition order."""
    module = sys.modules[__name__]
    return {name: fn for name, fn in vars(module).items() if name.startswith("octavo_") and
            hasattr(fn, "octavo_spec")}


def _group(name: str, fn: Any) -> str:
    params = list(inspect.signature(fn).parameters)
    if name.startswith("octavo_register_"):
        return "registration" if params == ["register"] else "extension"
    for prefix, group in (("octavo_select_", "selection"), ("octavo_add_", "extension"), ("octavo_on_", "notification")):
        if name.startswith(prefix):
            return group
    raise TypeError(f"hookspec {name!r} fits no lifecycle group; name it octavo_register_/select_/add_/on_...")


def registry_kinds() -> dict[str, str]:
    """Registry kind -> the hook that fills it: every ``octavo_register_<kind>(register)`` spec.

    A register hook that takes more than ``register`` (``octavo_register_stat_loggers(register, settings)``)
    registers live objects, not names, and is an extension hook instead.
    """
    return {name.removeprefix("octavo_register_"): name for name, fn in _specs().items()
            if _group(name, fn) == "registration"}


def hook_groups() -> dict[str, str]:
    """Hook name -> lifecycle group, for ``octavo plugins --hooks`` and the docs test (derived from the names)."""
    return {name: _group(name, fn) for name, fn in _specs().items()}


def __getattr__(name: str) -> Any:
    # HOOK_GROUPS is computed on access, so a spec defined anywhere in this file is included.
    if name == "HOOK_GROUPS":
        return hook_groups()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
