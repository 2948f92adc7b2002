"""Which tools a run may use: a profile, plus explicit allow and deny lists.

A :class:`ToolPolicy` filters the registered tools once per run. The result is
both what the model is offered *and* what the executor is given, so a model
that calls a hidden tool anyway gets the ordinary unknown-tool error
(``UNKNOWN_TOOL``) rather than a run of the tool.

Entries of ``allow`` and ``deny`` are tool names (``"write_file"``) or plugin
groups written ``"group:<plugin name>"`` (``"group:file_tools"``); the caller
supplies the mapping tool name → plugin name. A built-in plugin may be named
by its module's last part (``group:file_tools`` for ``plugins.file_tools``). A
tool may name a group of its own in ``Tool.meta["group"]`` (``mcp:github``);
``group:mcp`` then covers every ``mcp:<server>`` group.
Resolution:

1. start from the profile (:data:`PROFILES`; ``full`` means every tool), leaving
   out opt-in tools (``Tool.meta[OPT_IN]``, e.g. ``exec``): no profile offers them;
2. add every tool named by ``allow`` (the only way to offer an opt-in tool);
3. remove every tool named by ``deny`` — deny wins over allow and the profile.

``approve`` names the offered tools whose calls wait for a person's decision
(:mod:`bot.engine.approvals`); unset, it is ``["exec"]``. A tool marking itself
``Tool.meta[NEEDS_APPROVAL]`` (an MCP tool its server calls destructive) needs
approval whatever ``approve`` says.

Names that match no registered tool (or groups that match no plugin) are
ignored and logged, so a policy written for a larger install still loads.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bot.config.agents import FULL, PROFILES
from bot.contracts.tools import Tool

log = logging.getLogger("roost.agents.tool_policy")

GROUP_PREFIX = "group:"

OPT_IN = "opt_in"
"""``Tool.meta`` key: a tool with ``meta={OPT_IN: True}`` is offered only where an agent's
``allow`` names it (or its plugin group), never by a profile: ``exec`` runs commands."""

NEEDS_APPROVAL = "needs_approval"
"""``Tool.meta`` key: a tool with ``meta={NEEDS_APPROVAL: True}`` always waits for approval."""
DEFAULT_APPROVE = ("exec",)
"""What ``approve`` is when unset: running commands is asked about wherever it is offered."""


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """A profile plus allow/deny lists of tool names and ``group:<plugin>`` entries."""

    profile: str = FULL
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    approve: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise ValueError(f"unknown tool profile {self.profile!r} (known: {known})")
        # Accept any iterable (a list from config) but store tuples.
        object.__setattr__(self, "allow", tuple(self.allow))
        object.__setattr__(self, "deny", tuple(self.deny))

    def filter(self, tools: Mapping[str, Tool], groups: Mapping[str, str]) -> dict[str, Tool]:
        """The tools the model may be offered and the executor may run.

        ``groups`` maps tool name → the plugin that provides it (for
        ``group:<plugin>`` entries). Keeps the order of ``tools``.
        """
        base = PROFILES[self.profile]
        allowed = {name for name, tool in tools.items()
                   if not tool.meta.get(OPT_IN) and (base is None or name in base)}
        allowed |= _resolve(self.allow, tools, groups, "allow")
        allowed -= _resolve(self.deny, tools, groups, "deny")
        return {name: tool for name, tool in tools.items() if name in allowed}

    def needing_approval(self, offered: Mapping[str, Tool],
                         groups: Mapping[str, str]) -> frozenset[str]:
        """Which of the ``offered`` tools (:meth:`filter`'s result) wait for approval."""
        if self.approve is None:
            named = {name for name in DEFAULT_APPROVE if name in offered}
        else:
            named = _resolve(self.approve, offered, groups, "approve")
        return frozenset(named | {name for name, tool in offered.items()
                                  if tool.meta.get(NEEDS_APPROVAL)})


def _in_group(owner: str, group: str) -> bool:
    """Whether plugin ``owner`` is ``group``: its full name, or a built-in's module name
    (``group:file_tools`` for ``plugins.file_tools``), or a group it is a part of
    (``group:mcp`` covers ``mcp:github``, a tool's own group in ``Tool.meta``)."""
    return (owner == group or owner.rsplit(".", 1)[-1] == group
            or owner.startswith(group + ":"))


def _resolve(entries: Iterable[str], tools: Mapping[str, Tool], groups: Mapping[str, str],
             which: str) -> set[str]:
    """The registered tool names that ``entries`` refer to; unknown ones are logged."""
    names: set[str] = set()
    for entry in entries:
        if entry.startswith(GROUP_PREFIX):
            plugin = entry[len(GROUP_PREFIX):]
            members = {name for name in tools if _in_group(groups.get(name, ""), plugin)}
            if not members:
                log.warning("tool policy %s: no tools from plugin group %r; ignored",
                            which, plugin)
            names |= members
        elif entry in tools:
            names.add(entry)
        else:
            log.warning("tool policy %s: unknown tool %r; ignored", which, entry)
    return names
