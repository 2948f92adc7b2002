"""What ``roost skills`` and ``roost patterns export`` do, as functions returning text.

The command line (``bot/app/cli/skills.py``) parses arguments and prints; everything
about skills is here. Errors are :class:`plugins.skills.format.SkillError` (one line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from plugins.guard_patterns import PATTERNS
from plugins.skills import skills_config
from plugins.skills.catalog import pattern_scan
from plugins.skills.format import MAX_DESCRIPTION, MAX_NAME, SKILL_FILE, SkillError, parse_skill
from plugins.skills.library import SkillLibrary
from plugins.skills.manage import install, remove, set_enabled, update
from roost import Settings

__all__ = ["SkillError", "disable", "enable", "export_pattern", "install_skill", "list_rows",
           "remove_skill", "show", "update_skills"]


def _dir(settings: Settings) -> Path:
    return skills_config(settings).dir


def _library(settings: Settings) -> SkillLibrary:
    return SkillLibrary(_dir(settings), scan=pattern_scan(PATTERNS), check_interval=0)


def list_rows(settings: Settings) -> list[dict[str, str]]:
    """One row per folder of the global skills directory."""
    lib = _library(settings)
    entries = lib.entries()
    if lib.error:
        raise SkillError(lib.error)
    rows = []
    for e in entries:
        state = "broken" if e.problem else "disabled" if e.disabled else "enabled"
        source = lib.state.sources.get(e.folder, {})
        rows.append({"name": e.folder, "state": state,
                     "description": e.problem or (e.skill.description if e.skill else ""),
                     "source": source.get("source", "")})
    return rows


def show(settings: Settings, name: str) -> str:
    """A skill's front matter, state, source and files."""
    lib = _library(settings)
    entry = next((e for e in lib.entries() if e.folder == name), None)
    if entry is None:
        raise SkillError(f"there is no skill {name!r} in {_dir(settings)}")
    lines = [f"name: {name}", f"folder: {_dir(settings) / name}"]
    if entry.problem:
        lines.append(f"state: broken: {entry.problem}")
    else:
        lines.append(f"state: {'disabled' if entry.disabled else 'enabled'}")
    skill = entry.skill
    if skill is not None:
        lines.append(f"description: {skill.description}")
        for label, value in (("license", skill.license), ("compatibility", skill.compatibility),
                             ("allowed-tools", " ".join(skill.allowed_tools))):
            if value:
                lines.append(f"{label}: {value}")
        lines += [f"metadata.{k}: {v}" for k, v in sorted(skill.metadata.items())]
    source = lib.state.sources.get(name)
    if source:
        lines.append("source: " + ", ".join(f"{k}={v}" for k, v in sorted(source.items()) if v))
    return "\n".join(lines)


def install_skill(settings: Settings, source: str, path: str = "", ref: str = "",
                  replace: bool = False) -> str:
    """Install from a folder, an archive or a git URL; what was done."""
    done = install(source, _dir(settings), path=path, ref=ref, replace=replace)
    verb = "Replaced" if done.replaced else "Installed"
    return f"{verb} skill {done.name} in {_dir(settings) / done.name}"


def remove_skill(settings: Settings, name: str) -> str:
    """Delete an installed skill."""
    remove(_dir(settings), name)
    return f"Removed skill {name}"


def enable(settings: Settings, name: str) -> str:
    """Enable a skill of the global directory."""
    return set_enabled(_dir(settings), name, True)


def disable(settings: Settings, name: str) -> str:
    """Disable a skill of the global directory."""
    return set_enabled(_dir(settings), name, False)


def update_skills(settings: Settings, names: Sequence[str]) -> list[str]:
    """Re-install ``names`` (every skill with a recorded source when empty)."""
    lib = _library(settings)
    lib.entries()
    targets = list(names) or sorted(lib.state.sources)
    said = []
    for name in targets:
        done = update(_dir(settings), name)
        said.append(f"Updated skill {done.name}")
    return said or ["No installed skill has a recorded source."]


def skill_name(text: str) -> str:
    """``text`` made a valid skill name (lowercase, single hyphens, at most 64)."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:MAX_NAME].strip("-")
    if not slug:
        raise SkillError(f"cannot make a skill name out of {text!r}")
    return slug


def export_pattern(name: str, description: str, instructions: str, keywords: Sequence[str],
                   examples: Sequence[str], source: str, out: Path) -> Path:
    """Write a pattern as a skill folder below ``out``; the folder written."""
    slug = skill_name(name)
    desc = description or f"Roost pattern {name}"
    if keywords:
        desc += " Use when the request is about: " + ", ".join(keywords) + "."
    if len(desc) > MAX_DESCRIPTION:
        desc = desc[:MAX_DESCRIPTION - 3].rstrip() + "..."
    front = {"name": slug, "description": desc,
             "metadata": {"roost-pattern": name, "roost-source": source,
                          **({"roost-keywords": ", ".join(keywords)} if keywords else {})}}
    body = [f"# {name}", "", instructions.strip()]
    if examples:
        body += ["", "## Requests this is for", *[f"- {e}" for e in examples]]
    text = ("---\n" + yaml.safe_dump(front, sort_keys=False, allow_unicode=True, width=1000)
            + "---\n\n" + "\n".join(body) + "\n")
    parse_skill(text, slug)  # what is written must load
    folder = out / slug
    if folder.exists():
        raise SkillError(f"{folder} exists already")
    folder.mkdir(parents=True)
    (folder / SKILL_FILE).write_text(text, encoding="utf-8")
    return folder
