"""The effective configuration as ``roost config show`` prints it, secrets masked.

One rendering for the command and the Control UI's ``/ui/config``: the settings'
:meth:`~bot.config.settings.Settings.masked` form with every plugin's table as it
takes effect (defaults included), one ``key = json`` line per top-level key.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from bot.config.masking import SECRET_MASK, mask_tree, mask_urls
from bot.config.settings import Settings

if TYPE_CHECKING:
    from bot.pluginhost.manager import PluginHost


def plugin_tables(settings: Settings, host: PluginHost) -> dict[str, Any]:
    """Every plugin's table as it takes effect, secrets masked (``host``'s configs validated)."""
    tables = {name: mask_tree(table) for name, table in settings.plugins.items()}
    for name, config in host.config.items():
        table = config.model_dump(mode="json")
        for key, value in config:
            if isinstance(value, SecretStr):
                table[key] = SECRET_MASK if value.get_secret_value() else None
        tables[name] = mask_tree(table)
    return {name: mask_urls(table) for name, table in sorted(tables.items())}


def config_lines(settings: Settings, host: PluginHost) -> list[tuple[str, str]]:
    """``(key, line)`` for each top-level setting, as ``roost config show`` prints them."""
    shown = settings.masked()
    shown["plugins"] = plugin_tables(settings, host)
    lines = []
    for key, value in shown.items():
        if value is None:
            lines.append((key, f"# {key} = (unset)"))
            continue
        line = f"{key} = {json.dumps(value)}"
        if SECRET_MASK in line:
            # Roost refuses the mask as a value, so a pasted-back line fails loudly.
            line += "  # masked: not the real value"
        lines.append((key, line))
    return lines
