"""How the contracts refer to the service's settings.

The settings model (``roost.Settings``) lives above this layer, in ``bot.config``;
the contracts name it structurally, as :data:`SettingsModel`. Plugins annotate the
settings they receive with ``roost.Settings``.
"""

from __future__ import annotations

from typing import Any, TypeAlias

SettingsModel: TypeAlias = Any
"""The service's settings (a ``roost.Settings``), as hooks, specs and the runtime pass it."""
