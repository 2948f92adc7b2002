"""The Agent Skills format: a folder with a ``SKILL.md`` (YAML front matter, then Markdown).

:func:`parse_skill` validates the front matter as the specification
(agentskills.io/specification) says: ``name`` (1-64 lowercase letters, digits and
hyphens, no hyphen first, last or doubled, equal to the folder's name),
``description`` (1-1,024 characters), and the optional ``license``,
``compatibility`` (at most 500 characters), ``metadata`` (strings to strings) and
``allowed-tools`` (space-separated). Anything else raises :class:`SkillError` with
one line saying why.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MAX_NAME = 64
MAX_DESCRIPTION = 1_024
MAX_COMPATIBILITY = 500
SKILL_FILE = "SKILL.md"
KNOWN_KEYS = frozenset({"name", "description", "license", "compatibility", "metadata",
                        "allowed-tools"})


class SkillError(ValueError):
    """A skill that cannot be used, with one line saying why."""


@dataclass(frozen=True, slots=True)
class Skill:
    """One validated skill: its front matter and its Markdown body."""

    name: str
    description: str
    body: str
    license: str = ""
    compatibility: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    allowed_tools: tuple[str, ...] = ()


def check_name(name: object) -> str:
    """``name`` if it is a valid skill name, else :class:`SkillError`."""
    if not isinstance(name, str) or not name:
        raise SkillError("'name' is missing or not text")
    if len(name) > MAX_NAME:
        raise SkillError(f"'name' is longer than {MAX_NAME} characters")
    if not NAME_RE.match(name):
        raise SkillError(f"'name' {name[:80]!r} must be lowercase letters, digits and single "
                         "hyphens, not starting or ending with a hyphen")
    return name


def split_front_matter(text: str) -> tuple[str, str]:
    """``(front matter, body)`` of a ``SKILL.md``; :class:`SkillError` without front matter."""
    text = text.removeprefix("\ufeff")
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        raise SkillError("SKILL.md does not start with '---' (YAML front matter)")
    for i, line in enumerate(lines[1:], start=1):
        if line.rstrip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1:]).strip()
    raise SkillError("SKILL.md's front matter has no closing '---'")


def _text(data: Mapping[str, object], key: str, limit: int | None) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SkillError(f"'{key}' must be text")
    value = value.strip()
    if limit is not None and len(value) > limit:
        raise SkillError(f"'{key}' is longer than {limit} characters")
    return value


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SkillError("'metadata' must be a mapping of strings to strings")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or isinstance(item, Mapping | list):
            raise SkillError("'metadata' must be a mapping of strings to strings")
        out[key] = "" if item is None else str(item)
    return out


def _allowed_tools(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v.strip() for v in value if v.strip())  # written as a list by some
    raise SkillError("'allowed-tools' must be a space-separated string of tool names")


def parse_skill(text: str, folder: str) -> Skill:
    """The skill ``text`` (a ``SKILL.md``) describes, checked against its ``folder`` name."""
    import yaml  # only where skills are used

    front, body = split_front_matter(text)
    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(front, Loader=loader)
    except yaml.YAMLError as exc:
        raise SkillError(f"invalid YAML front matter: {exc}".replace("\n", " ")) from None
    if not isinstance(data, Mapping):
        raise SkillError("the front matter must be a YAML mapping")
    name = check_name(data.get("name"))
    if name != folder:
        raise SkillError(f"'name' {name!r} does not match its folder {folder!r}")
    description = _text(data, "description", MAX_DESCRIPTION)
    if not description:
        raise SkillError("'description' is missing or empty")
    return Skill(
        name=name, description=description, body=body,
        license=_text(data, "license", None)[:200],
        compatibility=_text(data, "compatibility", MAX_COMPATIBILITY),
        metadata=_metadata(data.get("metadata")),
        allowed_tools=_allowed_tools(data.get("allowed-tools")),
    )


def digest(text: str) -> str:
    """The digest an admin's trust in a ``SKILL.md`` is recorded with."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
