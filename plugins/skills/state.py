"""``.roost-skills.json`` in a skills directory: which skills are disabled, which an admin
enabled although the input guard flags them, where each installed one came from (for
``roost skills update``).

Written by ``roost skills`` and the ``/skills`` command, read by the library when the
directory changes; a broken or missing file reads as "nothing disabled, no sources".
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from roost import read_fd, write_atomic

log = logging.getLogger("roost.plugins.skills")

STATE_FILE = ".roost-skills.json"
MAX_STATE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SkillState:
    """Disabled skill names and each installed skill's source record."""

    disabled: frozenset[str] = frozenset()
    sources: dict[str, dict[str, str]] = field(default_factory=dict)
    trusted: dict[str, str] = field(default_factory=dict)
    """Skill name -> the digest of the SKILL.md an admin enabled although the input guard
    flags it; a changed SKILL.md is scanned again."""

    def to_json(self) -> bytes:
        """The file's bytes."""
        return (json.dumps({"disabled": sorted(self.disabled), "sources": self.sources,
                            "trusted": self.trusted}, indent=2, sort_keys=True)
                + "\n").encode()


def read_state(directory_fd: int) -> SkillState:
    """The state file below ``directory_fd`` (empty when absent or unreadable)."""
    try:
        fd = os.open(STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=directory_fd)
    except FileNotFoundError:
        return SkillState()
    except OSError as exc:
        log.warning("skills: cannot read %s: %s", STATE_FILE, exc.strerror)
        return SkillState()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return SkillState()
        raw = read_fd(fd, MAX_STATE_BYTES)
    finally:
        os.close(fd)
    try:
        data: Any = json.loads(raw)
        disabled = frozenset(str(n) for n in data.get("disabled", []))
        sources = {str(k): {str(a): str(b) for a, b in v.items()}
                   for k, v in dict(data.get("sources", {})).items() if isinstance(v, dict)}
        trusted = {str(k): str(v) for k, v in dict(data.get("trusted", {})).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("skills: %s is not valid (%s); read as empty", STATE_FILE, exc)
        return SkillState()
    return SkillState(disabled, sources, trusted)


def write_state(directory_fd: int, state: SkillState) -> None:
    """Replace the state file below ``directory_fd`` atomically."""
    write_atomic(directory_fd, STATE_FILE, state.to_json(), 0o644)
