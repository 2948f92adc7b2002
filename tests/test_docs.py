"""Every code snippet in the README, the documentation site and the hook reference works.

Each fenced block is checked by its language: Python is executed (a plugin example is
registered with Roost's plugin manager, which validates its hook implementations), TOML
is loaded as a ``roost.toml`` or, for packaging snippets, installed by
``tests/test_plugin_packaging.py``, YAML scripts are loaded by the scripted provider, and
every ``roost`` command line is parsed by the real CLI. The tool-trial recipe of Getting
started runs for real. A block in a language this file does not know fails the test.
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import shlex
import subprocess
import sys
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from bot.app.cli.base import cli
from bot.config.settings import load_settings
from bot.pluginhost.manager import get_plugin_manager
from plugins.scripted_provider import load_script

ROOT = Path(__file__).resolve().parent.parent
HOOKSPECS = ROOT / "bot" / "contracts" / "hookspecs.py"
FENCE = re.compile(r"(?m)^(?P<indent> *)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.S)

# Programs a shell snippet may run besides `roost`, each documented elsewhere: package and
# container tools, the shell's own, and this repository's scripts.
OTHER_PROGRAMS = {"python3", "pip", "docker", "cp", "export", "scripts/check", "apt-get",
                  "chown", "systemctl", "mkdocs"}


@dataclass(frozen=True)
class Snippet:
    """One fenced block: where it is, its language and its text."""

    where: str
    lang: str
    text: str


def _dedent(body: str, indent: str) -> str:
    return "\n".join(line[len(indent):] if line.startswith(indent) else line
                     for line in body.splitlines()) + "\n"


def _blocks(text: str, where: str) -> list[Snippet]:
    return [Snippet(f"{where}:{text[:m.start()].count(chr(10)) + 1}", m["lang"],
                    _dedent(m["body"], m["indent"])) for m in FENCE.finditer(text)]


def snippets() -> list[Snippet]:
    """Every fenced block of the README, docs/ and the hookspec docstrings."""
    found = _blocks((ROOT / "README.md").read_text(encoding="utf-8"), "README.md")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        found += _blocks(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))
    for node in ast.parse(HOOKSPECS.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and (doc := ast.get_docstring(node)):
            found += _blocks(doc, f"hookspecs.py:{node.name}")
    return found


ALL = snippets()


def _of(lang: str) -> list[Snippet]:
    return [s for s in ALL if s.lang == lang]


def test_every_snippet_has_a_language_this_test_checks() -> None:
    unknown = [f"{s.where} ({s.lang or 'no language'})" for s in ALL
               if s.lang not in {"python", "toml", "yaml", "sh", "text"}]
    assert not unknown
    assert len(_of("python")) >= 17 and _of("toml") and _of("sh")


def my_plugin() -> types.ModuleType:
    """``my_plugin`` of the plugin guide's test example: the word_count tool and its prompt
    section, as the hook reference shows them."""
    module = types.ModuleType("my_plugin")
    for hook in ("roost_tools", "roost_prompt_sections"):
        (example,) = [s for s in _of("python") if s.where.startswith(f"hookspecs.py:{hook}:")]
        exec(compile(example.text, example.where, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("snippet", _of("python"), ids=lambda s: s.where)
def test_python_snippets_run_and_plugins_register(snippet: Snippet,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "my_plugin", my_plugin())
    assert not re.search(r"^from (bot|plugins|channels)\b", snippet.text, re.M), (
        "documentation examples import from roost, as plugin authors must")
    namespace: dict[str, object] = {"__name__": f"snippet_{abs(hash(snippet.where))}"}
    exec(compile(snippet.text, snippet.where, "exec"), namespace)
    hooks = [name for name in namespace if name.startswith("roost_")]
    if hooks:
        manager = get_plugin_manager(load_entry_points=False)
        plugin = type("Snippet", (), {n: staticmethod(namespace[n]) for n in hooks})  # type: ignore[arg-type]
        manager.register(plugin, name=snippet.where)
        manager.pm.check_pending()  # raises for a misnamed hook or an argument it does not have


def _is_packaging(text: str) -> bool:
    return bool(re.search(r"^\[(project|build-system|tool)\b", text, re.M))


@pytest.mark.parametrize("snippet", [s for s in _of("toml") if not _is_packaging(s.text)],
                         ids=lambda s: s.where)
def test_toml_snippets_are_valid_roost_configuration(snippet: Snippet, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    for name in list(os.environ):
        if name.startswith("ROOST_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    data = tomllib.loads(snippet.text)
    (tmp_path / "roost.toml").write_text(snippet.text, encoding="utf-8")
    for agent in data.get("agents", {}).values():  # directories an agent names must exist
        for key in ("bootstrap_dir",):
            if key in agent:
                (tmp_path / agent[key]).mkdir(parents=True, exist_ok=True)
    settings = load_settings(tmp_path / "roost.toml")
    # Built-in plugins' tables too (a bad one raises), and no deprecated name in the docs.
    asyncio.run(get_plugin_manager(load_entry_points=False).validate_configs(settings.plugins))
    assert not [r for r in caplog.records if "is now [plugins." in r.getMessage()]


def test_packaging_snippets_are_left_to_the_install_test() -> None:
    packaging = [s for s in _of("toml") if _is_packaging(s.text)]
    assert packaging, "the plugin guide shows how to package a plugin"
    for snippet in packaging:
        tomllib.loads(snippet.text)


@pytest.mark.parametrize("snippet", _of("yaml"), ids=lambda s: s.where)
def test_yaml_snippets_are_scripts_the_scripted_provider_loads(snippet: Snippet,
                                                               tmp_path: Path) -> None:
    data = yaml.safe_load(snippet.text)
    if isinstance(data, dict) and "turns" in data:
        script = tmp_path / "script.yaml"
        script.write_text(snippet.text, encoding="utf-8")
        turns, _ = load_script(script)
        assert turns
    else:  # compose files and the like: valid YAML, checked by test_deploy_files.py
        assert isinstance(data, dict)


def _commands(text: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s*(?:&&|\|\||;)\s*", line):
            words = shlex.split(part)
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                words = words[1:]
            if words:
                commands.append(words)
    return commands


@pytest.mark.parametrize("snippet", _of("sh"), ids=lambda s: s.where)
def test_shell_snippets_name_real_roost_commands_and_options(snippet: Snippet) -> None:
    runner = CliRunner()
    for words in _commands(snippet.text):
        program = words[0].removeprefix(".venv/bin/")
        if program == "roost":
            result = runner.invoke(cli, [*words[1:], "--help"])
            assert result.exit_code == 0, f"{snippet.where}: {shlex.join(words)}: {result.output}"
        else:
            assert program in OTHER_PROGRAMS, f"{snippet.where}: unknown program {program}"


def test_the_tool_trial_recipe_works_as_written(tmp_path: Path) -> None:
    """Getting started: try a tool with the scripted provider, no API key."""
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = page.split("## Try a tool without an API key", 1)[1].split("\n## ", 1)[0]
    blocks = _blocks(section, "getting-started.md")
    script = next(b for b in blocks if b.lang == "yaml")
    command = next(b for b in blocks if b.lang == "sh")
    (tmp_path / "trial.yaml").write_text(script.text, encoding="utf-8")
    (words,) = _commands(command.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOST_", "ANTHROPIC_"))}
    for assignment in shlex.split(command.text.split(".venv/bin/roost", 1)[0]):
        name, _, value = assignment.partition("=")
        env[name] = value
    roost = Path(sys.executable).parent / "roost"
    result = subprocess.run([str(roost), *words[1:]], cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "The tool said:" in result.stdout
    assert "USER.md" in result.stdout  # list_files really ran in the new workspace


async def test_the_plugin_guides_test_example_passes(roost_app: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin guide's example test, run as written against the documented plugin."""
    monkeypatch.setitem(sys.modules, "my_plugin", my_plugin())
    (example,) = [s for s in _of("python") if "async def test_" in s.text]
    namespace: dict[str, Any] = {}
    exec(compile(example.text, example.where, "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        await test(roost_app)
