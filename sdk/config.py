"""One settings object for the whole engine, with a few nested sections.

Field names follow vLLM's engine arguments (``max_num_seqs``, ``block_size``, ...) and are unique across
sections, so they can be given flat everywhere a vLLM user would: ``LLM(model=..., max_num_seqs=8)``,
``--max-num-seqs 8``, ``OCTAVO_MAX_NUM_SEQS=8``, or ``max_num_seqs: 8`` in a YAML/JSON config file.
Precedence: explicit arguments > environment > config file > defaults. The CLI flags are generated from
these fields (see ``octavo.cli.flags``), so each field's description is its ``--help`` text.

Here: :class:`OctavoSettings` (the sources' precedence, the checks across sections, the flat constructor) and
its error messages. Beside it: the sections' fields (``config_sections.py``) and the environment / config-file
sources (``config_sources.py``); every name still imports from ``octavo.config``.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from octavo.config_sections import (  # noqa: F401 - re-exported
    FIELD_SECTION,
    SECTIONS,
    CacheSettings,
    DeviceSettings,
    LoRASettings,
    ModelSettings,
    ParallelSettings,
    SchedulerSettings,
    ServerSettings,
)
from octavo.config_sources import (  # noqa: F401 - re-exported
    ENV_PREFIX,
    _ConfigFileSource,
    _FlatEnvSource,
    load_config_file,
    nest,
)
from octavo.errors import ConfigError  # public home: octavo.errors


class OctavoSettings(BaseSettings):
    """Every setting of one engine, grouped in sections. Build it with :meth:`from_kwargs`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid")

    model: ModelSettings = Field(default_factory=ModelSettings)
    device: DeviceSettings = Field(default_factory=DeviceSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    parallel: ParallelSettings = Field(default_factory=ParallelSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    lora: LoRASettings = Field(default_factory=LoRASettings)

    _config_file: str | None = None

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        path = os.environ.get(ENV_PREFIX + "CONFIG")
        # NOTE: pydantic-settings' own env source is left out on purpose: it reads OCTAVO_MODEL and
        # OCTAVO_DEVICE as whole *sections* (JSON), which collides with the flat fields ``model`` and
        # ``device``. Field names are unique across sections, so the flat source covers every setting.
        return (init_settings, _FlatEnvSource(settings_cls), _ConfigFileSource(settings_cls, path))

    @model_validator(mode="after")
    def _check_combinations(self) -> OctavoSettings:
        s, m = self.scheduler, self.model
        if (not s.enable_chunked_prefill and s.max_num_batched_tokens is not None and m.max_model_len is not None
                and s.max_num_batched_tokens < m.max_model_len):
            raise ValueError(
                f"max_num_batched_tokens={s.max_num_batched_tokens} is smaller than max_model_len="
                f"{m.max_model_len} with chunked prefill disabled, so a long prompt could never be scheduled. "
                "Raise max_num_batched_tokens, lower max_model_len, or enable chunked prefill.")
        if self.parallel.tensor_parallel_size > 1 and self.parallel.distributed_executor_backend == "uni":
            raise ValueError("tensor_parallel_size > 1 needs distributed_executor_backend 'mp' or 'ray', not 'uni'.")
        if self.lora.enable_lora or self.lora.lora_modules:
            from octavo.lora.settings import check_lora_settings

            check_lora_settings(self)
        return self

    @classmethod
    def from_kwargs(cls, config_file: str | None = None, **flat: Any) -> OctavoSettings:
        """Build from flat vLLM-style names (``max_num_seqs=8``); ``None`` values mean "not given"."""
        given = {k: v for k, v in flat.items() if v is not None}
        nested = nest(given, "arguments")
        if config_file:
            os.environ[ENV_PREFIX + "CONFIG"] = config_file
        try:
            return cls(**nested)
        except ValidationError as e:
            raise ConfigError(_explain(e)) from None
        finally:
            if config_file:
                os.environ.pop(ENV_PREFIX + "CONFIG", None)

    def flat(self) -> dict[str, Any]:
        """All fields as one flat ``name: value`` dict (for logs and the engine-core handshake)."""
        return {k: v for section in SECTIONS for k, v in getattr(self, section).model_dump().items()}


def _explain(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"] if str(x) not in SECTIONS]
        name = ".".join(loc) or "settings"
        flag = "--" + name.replace("_", "-") if loc else ""
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        where = f" Fix {flag} / OCTAVO_{name.upper()}." if flag else ""
        lines.append(f"Invalid setting {name}{got}: {err['msg']}.{where}")
    return " ".join(lines)
