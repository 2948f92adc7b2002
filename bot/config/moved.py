"""Settings that moved from the top level into a built-in plugin's ``[plugins.<name>]`` table.

Each old name keeps working wherever it is given — a top-level key in ``roost.toml``,
its ``ROOST_*`` variable (environment or ``.env``), a keyword of ``Settings`` — and
is put into the plugin's table at load time, with one deprecation line naming the
new place; an old variable beats the file, as any variable does. The variables of
secrets (``BRAVE_API_KEY``, ``TAVILY_API_KEY``, ``ROOST_TRANSCRIBE_API_KEY``) stay
ordinary overrides without a warning: a secret belongs in the environment.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

log = logging.getLogger("roost.config")

_EXEC = "plugins.exec_tool"
_WEB = "plugins.web"
_HEARTBEAT = "plugins.heartbeat"
_MEMORY = "plugins.memory"
_TRANSCRIBE = "plugins.transcribe"
_CRON = "plugins.cron"
_FILES = "plugins.file_tools"
_WHATSAPP = "plugins.whatsapp"

MOVED: dict[str, tuple[str, str]] = {
    **{f"exec_{key}": (_EXEC, key) for key in (
        "bwrap", "timeout", "max_timeout", "cpu_seconds", "memory_mb", "max_processes",
        "max_file_mb", "max_output_bytes", "network_agents", "uid")},
    **{f"web_{key}": (_WEB, key) for key in (
        "allow_private", "fetch_max_bytes", "fetch_timeout", "max_redirects", "search_backend")},
    **{key: (_WEB, key) for key in (
        "searxng_url", "brave_api_key", "brave_api_base", "tavily_api_key", "tavily_api_base")},
    "heartbeat": (_HEARTBEAT, "enabled"),
    **{f"heartbeat_{key}": (_HEARTBEAT, key) for key in (
        "interval_minutes", "active_hours", "owner", "chat")},
    **{f"memory_{key}": (_MEMORY, key) for key in (
        "flush_every_hours", "flush_idle_minutes", "flush_min_messages")},
    **{f"transcribe_{key}": (_TRANSCRIBE, key) for key in ("base_url", "model", "api_key")},
    **{f"cron_{key}": (_CRON, key) for key in ("max_jobs_per_user", "min_interval_seconds")},
    "max_file_bytes": (_FILES, "max_file_bytes"),
}
"""Old top-level name → (plugin, key in its ``[plugins.<plugin>]`` table)."""

ALSO: dict[str, tuple[str, str]] = {
    "max_file_bytes": (_MEMORY, "max_file_bytes"),
}
"""Old names two plugins read → the second place their value goes (the first: :data:`MOVED`)."""

SERVICE_ENV: dict[str, tuple[str, str]] = {
    "BRAVE_API_KEY": (_WEB, "brave_api_key"),
    "TAVILY_API_KEY": (_WEB, "tavily_api_key"),
    # A secret belongs in the environment, and this is its only variable.
    "ROOST_TRANSCRIBE_API_KEY": (_TRANSCRIBE, "api_key"),
    # The WhatsApp channel's settings, under the names its documentation uses.
    **{f"WHATSAPP_{key.upper()}": (_WHATSAPP, key) for key in (
        "phone_number_id", "access_token", "app_secret", "verify_token", "api_base")},
    # The Matrix channel's account (plugins/matrix): its SDK's usual names.
    **{f"MATRIX_{key.upper()}": ("plugins.matrix", key) for key in (
        "homeserver", "user_id", "access_token", "password")},
}
"""Variables of moved secrets that stay ordinary overrides → (plugin, key); no warning."""

EMAIL_ENV: dict[str, tuple[str, str]] = {
    f"EMAIL_{key.upper()}": ("plugins.mail", key)
    for key in ("imap_url", "smtp_url", "address", "username", "password")}
"""The email channel's variables → its table's keys (``roost init`` lists them)."""
SERVICE_ENV.update(EMAIL_ENV)

CREDENTIALS: tuple[str, ...] = ("brave_api_key", "tavily_api_key", "transcribe_api_key")
"""Moved names that hold secrets: ``.env.example`` lists their variables."""


def new_place(old: str) -> str:
    """Where ``old`` lives now, as a ``roost.toml`` reader finds it."""
    return " and ".join(f'[plugins."{plugin}"] {key}' for plugin, key in places(old))


def places(old: str) -> list[tuple[str, str]]:
    """Every (plugin, key) the value of ``old`` goes to."""
    return [MOVED[old], *([ALSO[old]] if old in ALSO else [])]


def _deprecated(old: str, given_as: str) -> None:
    log.warning("%s is now %s (the old name still works)", given_as, new_place(old))


def _put(tables: dict[str, Any], plugin: str, key: str, value: Any, *, replace: bool) -> None:
    table = tables.setdefault(plugin, {})
    if not isinstance(table, dict):
        return  # not a table: the plugins field reports it
    if replace or key not in table:
        table[key] = value


def relocate(data: Mapping[str, Any], *, replace: bool) -> dict[str, Any]:
    """``data`` with every moved top-level name (or its ``roost_`` form) put into its table.

    ``replace``: the old name wins over a key already in the table (it came from a
    source of higher precedence); else the table's key wins.
    """
    out = dict(data)
    moved = [(k, k.lower().removeprefix("roost_")) for k in data
             if k.lower().removeprefix("roost_") in MOVED]
    if not moved:
        return out
    given_tables = out.get("plugins", {})
    if not isinstance(given_tables, dict):
        return out  # the plugins field reports it
    tables = {k: dict(v) if isinstance(v, dict) else v for k, v in given_tables.items()}
    for given, old in moved:
        _deprecated(old, given.upper() if given.lower().startswith("roost_") else given)
        value = out.pop(given)
        for plugin, key in places(old):
            _put(tables, plugin, key, value, replace=replace)
    out["plugins"] = tables
    return out


class MovedEnv(PydanticBaseSettingsSource):
    """The environment's variables of moved settings, as ``plugins`` table entries."""

    def __init__(self, settings_cls: type[BaseSettings],
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        self.environ = os.environ if environ is None else environ

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        tables: dict[str, Any] = {}
        for name, value in self.environ.items():
            upper = name.upper()
            if value == "":
                continue  # an env file's blank line: unset
            if upper in SERVICE_ENV:
                plugin, key = SERVICE_ENV[upper]
                _put(tables, plugin, key, value, replace=False)
            elif upper.startswith("ROOST_") and upper[6:].lower() in MOVED:
                old = upper[6:].lower()
                _deprecated(old, upper)
                for plugin, key in places(old):
                    _put(tables, plugin, key, value, replace=True)
        return {"plugins": tables} if tables else {}
