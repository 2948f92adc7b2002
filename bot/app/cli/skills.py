"""``roost skills`` (list, show, install, remove, enable, disable, update) and
``roost patterns export``: the work is done by :mod:`plugins.skills.cli`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click

from bot.app.cli.base import EXIT_SETUP, cli, cli_settings, echo, fail


@cli.group()
def skills() -> None:
    """Agent Skills in the global skills directory (skills/ unless configured)."""


def _run(work: Callable[[], str | list[str]]) -> None:
    """Print what ``work()`` says; one line and exit 1 on a skill error."""
    from plugins.skills.cli import SkillError

    try:
        said = work()
    except (SkillError, OSError) as exc:
        fail(str(exc))
        sys.exit(1)
    for line in said if isinstance(said, list) else [said]:
        echo(str(line))


@skills.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def skills_list(ctx: click.Context, as_json: bool) -> None:
    """List the skills with their state (enabled, disabled, broken) and source."""
    from plugins.skills.cli import list_rows

    settings = cli_settings(ctx)

    def rows() -> list[str]:
        found = list_rows(settings)
        if as_json:
            return [json.dumps(found, indent=2)]
        if not found:
            return ["No skills installed."]
        return [f"{r['name']:<32} {r['state']:<9} {r['description'][:100]}" for r in found]

    _run(rows)


def _by_name(command: str, doc: str, function: str) -> None:
    """``roost skills COMMAND NAME``: ``plugins.skills.cli.FUNCTION(settings, NAME)``."""

    @click.argument("name")
    @click.pass_context
    def run(ctx: click.Context, name: str) -> None:
        from plugins.skills import cli as skills_cli

        settings = cli_settings(ctx)
        _run(lambda: getattr(skills_cli, function)(settings, name))

    skills.command(command, help=doc, short_help=doc)(run)


_by_name("show", "Show a skill's front matter, state and source.", "show")
_by_name("remove", "Delete an installed skill.", "remove_skill")
_by_name("enable", "Enable a skill (the running service picks it up within seconds).", "enable")
_by_name("disable", "Disable a skill without deleting it.", "disable")


@skills.command("install")
@click.argument("source")
@click.option("--path", "path", default="", help="The skill's folder inside the source.")
@click.option("--ref", "ref", default="", help="A git branch or tag to install from.")
@click.option("--replace", is_flag=True, help="Replace an installed skill of the same name.")
@click.pass_context
def skills_install(ctx: click.Context, source: str, path: str, ref: str,
                   replace: bool) -> None:
    """Install a skill from a folder, a .zip/.skill archive or a git URL."""
    from plugins.skills.cli import install_skill

    settings = cli_settings(ctx)
    _run(lambda: install_skill(settings, source, path, ref, replace))


@skills.command("update")
@click.argument("names", nargs=-1)
@click.pass_context
def skills_update(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Install skills again from their recorded source (all of them without NAMES)."""
    from plugins.skills.cli import update_skills

    settings = cli_settings(ctx)
    _run(lambda: update_skills(settings, names))


@cli.group()
def patterns() -> None:
    """The pattern library (YAML patterns chosen per message)."""


@patterns.command("export")
@click.argument("pattern_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("skills"),
              show_default=True, help="Where to write the skill's folder.")
def patterns_export(pattern_file: Path, out: Path) -> None:
    """Turn a pattern file into an Agent Skill folder (SKILL.md)."""
    from bot.agents.patterns import PatternError, load_pattern
    from plugins.skills.cli import export_pattern

    try:
        pattern = load_pattern(pattern_file)
    except PatternError as exc:
        fail(f"{pattern_file}: {exc}")
        sys.exit(EXIT_SETUP)
    _run(lambda: "Wrote " + str(export_pattern(
        pattern.name, pattern.description, pattern.instructions, list(pattern.keywords),
        list(pattern.examples), pattern_file.name, out)))
