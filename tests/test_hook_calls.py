"""Hooks are called through one typed facade (``host.hooks.roost_X``), never by name."""

from __future__ import annotations

import ast
import inspect
import logging
import re
import types
from pathlib import Path
from typing import Any

import pytest

from bot.contracts import hookspecs
from bot.contracts.guard import InputCheck
from bot.contracts.hookspecs import hookimpl
from bot.contracts.prompt import PromptSection
from bot.pluginhost.manager import Hooks, InputChecks, Offers, get_plugin_manager

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted(name for name, value in vars(hookspecs).items()
               if name.startswith("roost_") and hasattr(value, "roost_spec"))
SCANNED = ("bot", "plugins", "roost", "channels", "workspaces", "bench", "examples")
EXEMPT = ("bot/pluginhost/", "bot/contracts/hookspecs.py")
UNUSED: Any = None
"""An argument the implementations under test do not take."""


def _exports(tree: ast.AST) -> set[int]:
    """ids of the string constants listed in ``__all__`` (a module's own names, not calls)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            ids.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return ids


def hook_names_in_strings(path: Path, label: str) -> list[str]:
    """``label:line: 'roost_x'`` for each string constant that is exactly a hook's name."""
    tree = ast.parse(path.read_text(), str(path))
    exports = _exports(tree)
    return [f"{label}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value in SPECS and id(node) not in exports]


def test_no_module_names_a_hook_in_a_string() -> None:
    assert len(SPECS) >= 18  # the scan below must know the hooks it looks for
    found: list[str] = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(EXEMPT) or "/tests/" in f"/{rel}" or ".venv" in rel:
                continue
            found.extend(hook_names_in_strings(path, rel))
    assert not found, "call hooks through host.hooks.<hook>(...), not by name:\n" + "\n".join(found)


def test_the_scan_sees_a_hook_named_in_a_string(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    source = ('__all__ = ["roost_tools"]\n'
              'async def f(host):\n'
              '    return await host.collect("roost_tools", settings=None)\n'
              'HINT = "install a plugin offering roost_tools"\n')
    module.write_text(source)
    assert hook_names_in_strings(module, "probe.py") == ["probe.py:3: 'roost_tools'"]


def test_the_facade_has_one_method_per_hookspec_with_its_arguments_and_item_type() -> None:
    methods = sorted(name for name in vars(Hooks) if name.startswith("roost_"))
    assert methods == SPECS
    for name in SPECS:
        spec = inspect.signature(getattr(hookspecs, name))
        method = inspect.signature(getattr(Hooks, name))
        params = list(method.parameters.values())[1:]  # self
        assert [p.name for p in params] == list(spec.parameters), name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), name
        assert [p.annotation for p in params] == [
            p.annotation for p in spec.parameters.values()], name
        returns = str(spec.return_annotation)
        if returns == "None":
            assert method.return_annotation == "None", name
        elif name == "roost_check_input":
            assert method.return_annotation == "InputChecks"
        else:
            # `list[Tool] | Tool | None` -> Offers[Tool]
            item = re.sub(r"^list\[(.+)\] \| \1 \| None$|^(.+) \| None$", r"\1\2", returns)
            assert method.return_annotation == f"Offers[{item}]", name


async def test_each_method_calls_the_hook_it_is_named_after() -> None:
    called: list[str] = []

    def recorder(hook: str) -> Any:
        def impl() -> None:
            called.append(hook)
        return hookimpl(impl)

    host = get_plugin_manager(load_entry_points=False)
    host.disabled |= {name for name, _ in host.pm.list_name_plugin()}
    host.register(types.SimpleNamespace(**{h: recorder(h) for h in SPECS}), "recorder")
    for hook in SPECS:
        called.clear()
        spec = inspect.signature(getattr(hookspecs, hook))
        await getattr(host.hooks, hook)(**{arg: f"<{arg}>" for arg in spec.parameters})
        assert called == [hook]


async def test_items_of_the_wrong_type_are_logged_with_their_plugin_and_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    section = PromptSection("mine", "be brief")

    class Sections:
        @hookimpl
        def roost_prompt_sections(self, prompt: object) -> list[object]:
            return [section, "not a section", None]

    host = get_plugin_manager(load_entry_points=False)
    host.disabled |= {name for name, _ in host.pm.list_name_plugin()}
    host.register(Sections(), "sections")
    with caplog.at_level(logging.ERROR, "roost.pluginhost.hooks"):
        offered = await host.hooks.roost_prompt_sections(prompt=UNUSED)
    assert isinstance(offered, Offers) and offered == [section]
    assert offered.named == [("sections", section)] and offered.hook == "roost_prompt_sections"
    assert ("plugin 'sections' returned str from roost_prompt_sections, not a PromptSection; "
            "ignored") in caplog.text
    assert "NoneType" not in caplog.text  # None means "nothing", as everywhere


async def test_a_wrong_prompt_section_no_longer_fails_every_run(
    roost_app: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        @hookimpl
        def roost_prompt_sections(self, prompt: object) -> str:
            return "a plain string"

    chat = await roost_app([{"reply": "hello"}], ("broken", Broken()))
    assert await chat.ask("hi") == ["hello"]
    assert "returned str from roost_prompt_sections" in caplog.text


async def test_input_checks_pipe_rewrites_and_stop_at_the_first_refusal() -> None:
    seen: list[str] = []

    class Upper:
        @hookimpl
        def roost_check_input(self, text: str) -> InputCheck:
            seen.append(text)
            return InputCheck(text=text.upper(), note="shouted")

    class Refuse:
        @hookimpl
        async def roost_check_input(self, text: str) -> InputCheck | None:
            seen.append(text)
            return InputCheck(refusal="no") if "STOP" in text else None

    class Never:
        @hookimpl(trylast=True)
        def roost_check_input(self, text: str) -> None:
            seen.append("never " + text)

    host = get_plugin_manager(load_entry_points=False)
    host.disabled |= {name for name, _ in host.pm.list_name_plugin()}
    for name, plugin in (("never", Never()), ("refuse", Refuse()), ("upper", Upper())):
        host.register(plugin, name)
    checks = host.hooks.roost_check_input
    passed = await checks(message=UNUSED, text="go", settings=UNUSED)
    assert passed == InputChecks("GO", ("shouted",), None)
    assert seen == ["go", "GO", "never GO"]
    seen.clear()
    refused = await checks(message=UNUSED, text="stop", settings=UNUSED)
    assert refused == InputChecks("STOP", ("shouted",), "no")
    assert seen == ["stop", "STOP"]


async def test_every_mode_traces_and_records_failures_the_same_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing:
        @hookimpl
        def roost_check_input(self, text: str) -> None:
            raise RuntimeError("check broke")

        @hookimpl
        def roost_commands(self, settings: object) -> None:
            raise RuntimeError("commands broke")

    host = get_plugin_manager(load_entry_points=False, env={"ROOST_TRACE_PLUGINS": "1"})
    host.disabled |= {name for name, _ in host.pm.list_name_plugin()}
    host.register(Failing(), "failing")
    with caplog.at_level(logging.INFO, "roost.pluginhost.manager"):
        await host.hooks.roost_check_input(message=UNUSED, text="x", settings=UNUSED)
    assert host.errors["failing"] == "roost_check_input: RuntimeError: check broke"
    assert "plugin 'failing' raised in roost_check_input; skipped" in caplog.text
    assert re.search(r"hook roost_check_input: 1 implementation\(s\) in [\d.]+ ms "
                     r"\[failing [\d.]+ ms raised\]", caplog.text)
    # One plugin alone (for /plugin info): logged, traced, not recorded over its error.
    host.disabled.add("failing")
    caplog.clear()
    with caplog.at_level(logging.INFO, "roost.pluginhost.manager"):
        assert await host.hooks.only("failing").roost_commands(settings=UNUSED) == []
    assert host.errors["failing"] == "roost_check_input: RuntimeError: check broke"
    assert "plugin 'failing' raised in roost_commands" in caplog.text
    assert "hook roost_commands: 1 implementation(s)" in caplog.text
    # Disabled: the facade over all plugins does not call it.
    assert await host.hooks.roost_commands(settings=UNUSED) == []


def test_implemented_takes_a_hookspec_not_a_name() -> None:
    host = get_plugin_manager(load_entry_points=False)
    assert host.hooks.implemented(hookspecs.roost_tools)
    assert not host.hooks.implemented(hookspecs.roost_run_event)
    with pytest.raises(ValueError, match="not a hookspec"):
        host.hooks.implemented(test_implemented_takes_a_hookspec_not_a_name)
