"""Which skills a run sees: the libraries of the global directory, the agent's directories
and (when the agent allows it) the user's workspace, filtered by the agent's settings."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from plugins.skills.library import Entry, Scan, SkillLibrary
from roost import AgentConfig, GuardPattern, Settings

USER_DIR = "skills"
"""A user's own skills folder, below their workspace."""
MAX_USER_LIBRARIES = 1024
"""User skill directories kept open-listed at once (least recently used dropped)."""


def pattern_scan(patterns: Sequence[GuardPattern]) -> Scan:
    """A scan with ``patterns`` compiled once (case-insensitive; a bad one skipped)."""
    compiled = []
    for p in patterns:
        try:
            compiled.append((p.name, re.compile(p.pattern, re.IGNORECASE)))
        except re.error:
            continue

    def scan(text: str) -> list[str]:
        return [name for name, rx in compiled if rx.search(text)]

    return scan


@dataclass(frozen=True, slots=True)
class Available:
    """A usable skill and the library it comes from."""

    entry: Entry
    library: SkillLibrary

    @property
    def name(self) -> str:
        return self.entry.folder


class Catalog:
    """The skill libraries of one process, each created once per directory.

    ``scan`` is the input guard, asked when a library (re)loads a skill.
    """

    def __init__(self, scan: Scan, *, check_interval: Callable[[], float]) -> None:
        self.scan = scan
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._libraries: OrderedDict[tuple[str, tuple[str, ...]], SkillLibrary] = OrderedDict()

    def library(self, root: Path, sub: tuple[str, ...] = ()) -> SkillLibrary:
        """The library of ``root`` / ``sub`` (made on first use)."""
        key = (str(Path(root).absolute()), sub)
        with self._lock:
            lib = self._libraries.get(key)
            if lib is None:
                lib = self._libraries[key] = SkillLibrary(
                    Path(key[0]), sub, scan=self.scan, check_interval=self.check_interval())
                while len(self._libraries) > MAX_USER_LIBRARIES:
                    self._libraries.popitem(last=False)
            else:
                self._libraries.move_to_end(key)
            return lib

    def libraries(self, global_dir: Path, agent: AgentConfig | None,
                  workspace: Path | None) -> list[SkillLibrary]:
        """The libraries an agent's run sees, in precedence order: the agent's own
        directories, the global one, then the user's (never shadowing the others)."""
        libs = [self.library(d) for d in (agent.skills if agent else ())]
        libs.append(self.library(global_dir))
        if agent is not None and agent.user_skills and workspace is not None:
            libs.append(self.library(workspace, (USER_DIR,)))
        return libs

    def available(self, global_dir: Path, agent: AgentConfig | None,
                  workspace: Path | None) -> dict[str, Available]:
        """The usable skills of a run by name, sorted, after the agent's filters."""
        only = set(agent.skills_only) if agent and agent.skills_only is not None else None
        off = set(agent.skills_disabled) if agent else set()
        found: dict[str, Available] = {}
        for lib in self.libraries(global_dir, agent, workspace):
            for entry in lib.entries():
                name = entry.folder
                if not entry.usable or name in found or name in off:
                    continue
                if only is not None and name not in only:
                    continue
                found[name] = Available(entry, lib)
        return dict(sorted(found.items()))


def agent_config(settings: Settings, agent: str) -> AgentConfig | None:
    """Agent ``agent``'s configuration, ``None`` when it has no table."""
    return settings.agents.get(agent)
