"""Where settings come from besides the environment: ``roost.toml`` and ``.env``.

:func:`bot.config.settings.load_settings` parses ``roost.toml`` and hands it to
:class:`TomlSource` through :data:`toml_data` for one construction; :class:`KnownNames`
keeps only Roost's own names from ``.env``.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

from pydantic import AliasChoices
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
)

from bot.config.moved import SERVICE_ENV, relocate

toml_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "roost_toml_data", default=None
)
"""The parsed ``roost.toml`` while :func:`bot.config.settings.load_settings` builds settings."""


class TomlSource(PydanticBaseSettingsSource):
    """``roost.toml``, below the environment and ``.env``."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return relocate(toml_data.get() or {}, replace=False)


class Filtered(PydanticBaseSettingsSource):
    """A source that passes on what another source (``inner``) reads, filtered."""

    def __init__(self, settings_cls: type[BaseSettings],
                 inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False


class KnownNames(Filtered):
    """``.env`` entries that are Roost's: its fields, their aliases (``TELEGRAM_BOT_TOKEN``)
    and every ``ROOST_*`` name (a misspelt one is still reported). Other names
    (``OTEL_*``, a plugin's or an MCP server's ``${VAR}``) are not settings; the
    command line puts them into the environment instead."""

    def __call__(self) -> dict[str, Any]:
        if isinstance(self.inner, DotEnvSettingsSource) and not self.inner.env_vars:
            return {}  # no .env file, or an empty one
        known = set()
        for name, field in self.settings_cls.model_fields.items():
            known.add(name)
            if isinstance(field.validation_alias, AliasChoices):
                known.update(str(c).lower() for c in field.validation_alias.choices)
        # An empty value (``NAME=`` as .env.example has it) means unset, not "".
        data = self.inner()
        kept = {k: v for k, v in data.items() if v not in ("", None)
                and k.upper() not in SERVICE_ENV
                and (k.lower() in known or k.lower().startswith("roost_"))}
        # The services' own variables of moved settings (BRAVE_API_KEY): their tables.
        service = {k.upper(): v for k, v in data.items()
                   if k.upper() in SERVICE_ENV and v not in ("", None)}
        if service:
            tables = kept.setdefault("plugins", {})
            for name, value in service.items():
                plugin, key = SERVICE_ENV[name]
                tables.setdefault(plugin, {}).setdefault(key, value)
        return kept


class ListedEnv(Filtered):
    """The environment, read by pydantic-settings' own source only when one of its
    variables names a field: otherwise that source walks every field's names and types
    to find nothing, which was most of the cost of building settings."""

    def __call__(self) -> dict[str, Any]:
        if isinstance(self.inner, EnvSettingsSource) and not self.inner.env_nested_delimiter:
            names = env_names(self.settings_cls)
            if not any(name in names for name in self.inner.env_vars):
                return {}
        return self.inner()


@functools.cache
def env_names(settings_cls: type[BaseSettings]) -> frozenset[str]:
    """Every environment variable name (as the environment source compares them) that
    sets a field of ``settings_cls``."""
    source = EnvSettingsSource(settings_cls)
    return frozenset(env_name for name, field in settings_cls.model_fields.items()
                     for _, env_name, _ in source._extract_field_info(field, name))
