"""Where each top-level setting's value came from: ``env``, ``.env``, ``file`` or ``default``.

The sources are looked at in the order :class:`bot.config.settings.Settings` reads
them (the environment, then ``.env`` of the working directory, then
``roost.toml``), by the names each field answers to (``ROOST_X``, and aliases such
as ``ANTHROPIC_API_KEY``). Only names are compared; no value is read or shown.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import AliasChoices
from pydantic_settings import BaseSettings

ORIGINS = ("env", ".env", "file", "default")


def env_names(settings_cls: type[BaseSettings], field: str) -> set[str]:
    """The environment variable names (upper case) that set ``field``."""
    info = settings_cls.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return {str(choice).upper() for choice in alias.choices}
    return {f"ROOST_{field.upper()}"}


def _dotenv(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    from dotenv import dotenv_values

    return {name.upper() for name, value in dotenv_values(path).items() if value}


def _toml(path: Path | None) -> set[str]:
    if path is None or not path.is_file():
        return set()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return set()
    return {str(key).lower() for key in data}


def origins(settings: BaseSettings, *, environ: Mapping[str, str] | None = None,
            dotenv: Path = Path(".env"), config_file: Path | None = None) -> dict[str, str]:
    """Each field of ``settings`` mapped to where its value came from (:data:`ORIGINS`)."""
    environ = os.environ if environ is None else environ
    env = {name.upper() for name, value in environ.items() if value}
    dotenv_names = _dotenv(dotenv)
    in_file = _toml(config_file if config_file is not None
                    else getattr(settings, "config_file", None))
    found: dict[str, str] = {}
    cls = type(settings)
    for field in cls.model_fields:
        names = env_names(cls, field)
        if names & env:
            where = "env"
        elif names & dotenv_names:
            where = ".env"
        elif field in in_file:
            where = "file"
        else:
            where = "default"
        found[field] = where
    return found
