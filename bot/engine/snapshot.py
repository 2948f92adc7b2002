"""What the enabled plugins offer, as one frozen object swapped whole.

When a plugin is enabled or disabled, :meth:`bot.app.roost.Roost.refresh_plugins`
builds a new :class:`PluginSnapshot` and swaps it into :class:`CurrentPlugins`
in one step. A run captures the snapshot when it starts and uses it to the end
(tools, sanitizers while streaming and at the finish, the guard, judges), so
it never mixes two plugin states.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from bot.contracts.judge import Judge
from bot.contracts.sanitize import Sanitizer
from bot.contracts.tools import Tool
from bot.engine.guard import InputGuard


@dataclass(frozen=True, slots=True)
class PluginSnapshot:
    """The tools, sanitizers, guard and judges of one plugin state."""

    guard: InputGuard
    tools: Mapping[str, Tool] = field(default_factory=lambda: MappingProxyType({}))
    tool_groups: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Tool name -> the plugin that offers it (``group:<plugin>`` in tool policies)."""
    sanitizers: tuple[Sanitizer, ...] = ()
    """In the order they run."""
    judges: Mapping[str, Judge] = field(default_factory=lambda: MappingProxyType({}))
    """Judges plugins offer (``roost_judges``), by name."""

    @classmethod
    def of(cls, guard: InputGuard, tools: Mapping[str, Tool] | None = None,
           tool_groups: Mapping[str, str] | None = None,
           sanitizers: tuple[Sanitizer, ...] | list[Sanitizer] = (),
           judges: Mapping[str, Judge] | None = None) -> PluginSnapshot:
        """A snapshot of copies: later changes to the arguments do not leak in."""
        return cls(guard, MappingProxyType(dict(tools or {})),
                   MappingProxyType(dict(tool_groups or {})),
                   tuple(sorted(sanitizers, key=lambda s: s.order)),
                   MappingProxyType(dict(judges or {})))


class CurrentPlugins:
    """The current :class:`PluginSnapshot`, replaced whole when plugins change.

    Built before the engine and shared with whoever reads the plugin state
    (the engine, the agents' judges, the metrics' tool names).
    """

    def __init__(self, snapshot: PluginSnapshot) -> None:
        self._snapshot = snapshot

    @property
    def now(self) -> PluginSnapshot:
        """The snapshot a run starting now takes."""
        return self._snapshot

    def replace(self, snapshot: PluginSnapshot) -> None:
        """Swap in ``snapshot``: a run sees the old state or the new one, never a mix."""
        self._snapshot = snapshot

    def judges(self) -> Mapping[str, Judge]:
        """The judges plugins offer now, by name."""
        return self._snapshot.judges

    def tool_names(self) -> list[str]:
        """The names of the tools offered now."""
        return list(self._snapshot.tools)
