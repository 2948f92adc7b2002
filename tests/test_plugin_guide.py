"""The hook reference (generated from bot/contracts/hookspecs.py) is complete, and every hook
is exercised.

* every hookspec's docstring says when it is called, its arguments, what it returns, and
  shows an example (run by tests/test_docs.py);
* the docs name no hook that does not exist;
* a plugin implementing every hookspec sees each of them called by a running app
  (a new hookspec fails here until it is added to ``AllHooks`` below and
  documented);
* every hook has an implementation in some test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bot.app.offers import provider_specs
from bot.app.roost import Roost
from bot.config.settings import Settings
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import ReactionEvent
from bot.contracts.providers import ProviderSpec
from bot.contracts.runtime import Runtime
from bot.engine.media import transcriber_of
from bot.pluginhost.manager import get_plugin_manager
from bot.testing.app import ChatChannel, scripted_provider

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "plugins.md"
SPECS = ROOT / "bot" / "contracts" / "hookspecs.py"


def hookspecs() -> dict[str, str]:
    """Hook name -> its signature as one line, ``def name(args) -> returns``."""
    specs = {}
    for node in ast.parse(SPECS.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "hookspec" for d in node.decorator_list
        ):
            returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
            specs[node.name] = f"def {node.name}({ast.unparse(node.args)}){returns}"
    return specs


def test_hookspecs_are_found() -> None:
    assert {"roost_tools", "roost_startup", "roost_shutdown"} <= set(hookspecs())


def hookspec_docs() -> dict[str, str]:
    """Hook name -> its docstring, the hook reference's text for it."""
    return {node.name: ast.get_docstring(node) or ""
            for node in ast.parse(SPECS.read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef) and node.name in hookspecs()}


def test_every_hookspec_documents_its_contract_and_shows_an_example() -> None:
    for name, doc in hookspec_docs().items():
        for heading in ("**Called:**", "**Arguments:**", "**Returns:**"):
            assert heading in doc, f"{name}: the docstring lacks {heading}"
        assert f"def {name}(" in doc.split("```python", 1)[-1], f"{name}: needs an example"


def test_the_guide_names_only_hooks_that_exist() -> None:
    pages = [GUIDE, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    named = {hook for page in pages
             for hook in re.findall(r"\b(roost_[a-z_]+)\(", page.read_text(encoding="utf-8"))}
    not_hooks = {"roost_app", "roost_weather", "roost_plugin_example"}
    assert named - not_hooks <= set(hookspecs()), named - not_hooks - set(hookspecs())
    assert "::: bot.contracts.hookspecs" in (ROOT / "docs" / "reference" / "hooks.md").read_text()


class AllHooks:
    """Implements every hookspec and records which were called."""

    def __init__(self) -> None:
        self.called: set[str] = set()

    @hookimpl
    def roost_tools(self) -> None:
        self.called.add("roost_tools")

    @hookimpl
    def roost_output_sanitizers(self) -> None:
        self.called.add("roost_output_sanitizers")

    @hookimpl
    def roost_guard_patterns(self) -> None:
        self.called.add("roost_guard_patterns")

    @hookimpl
    def roost_check_input(self) -> None:
        self.called.add("roost_check_input")

    @hookimpl
    def roost_commands(self) -> None:
        self.called.add("roost_commands")

    @hookimpl
    def roost_channels(self) -> None:
        self.called.add("roost_channels")

    @hookimpl
    def roost_providers(self) -> None:
        self.called.add("roost_providers")

    @hookimpl
    def roost_prompt_sections(self) -> None:
        self.called.add("roost_prompt_sections")

    @hookimpl
    def roost_judges(self) -> None:
        self.called.add("roost_judges")

    @hookimpl
    def roost_scheduled_jobs(self) -> None:
        self.called.add("roost_scheduled_jobs")

    @hookimpl
    def roost_run_event(self) -> None:
        self.called.add("roost_run_event")

    @hookimpl
    def roost_plugin_config_model(self) -> type[BaseModel] | None:
        self.called.add("roost_plugin_config_model")
        return None

    @hookimpl
    def roost_search_backends(self) -> None:
        self.called.add("roost_search_backends")

    @hookimpl
    def roost_migrations(self) -> None:
        self.called.add("roost_migrations")

    @hookimpl
    def roost_transcriber(self) -> None:
        self.called.add("roost_transcriber")

    @hookimpl
    def roost_startup(self) -> None:
        self.called.add("roost_startup")

    @hookimpl
    def roost_health(self) -> None:
        self.called.add("roost_health")

    @hookimpl
    def roost_shutdown(self) -> None:
        self.called.add("roost_shutdown")

    @hookimpl
    def roost_reaction(self) -> None:
        self.called.add("roost_reaction")

    @hookimpl
    def roost_status(self) -> None:
        self.called.add("roost_status")


async def test_a_running_app_calls_every_hook(roost_app: Any) -> None:
    plugin = AllHooks()
    chat = await roost_app([{"reply": "hi"}], ("all-hooks", plugin))
    assert await chat.ask("hello") == ["hi"]
    # The chat channel keeps no message ids: the reply is given the one a platform would.
    async with chat.app.store.lock:
        await chat.app.store.db.execute("UPDATE outbox SET platform_id = 'r1'")
    await chat.hand_in(ReactionEvent(channel=chat.name, chat_id="user", message_id="r1",
                                     user_id="user", emoji="👍", added=True))
    await chat.ask("/status")  # what /readyz asks too
    await provider_specs(chat.app.settings, chat.app.host)  # what `roost run` does first
    await transcriber_of(chat.app.host, chat.app.settings)  # what a voice note does
    await chat.app.close()
    assert plugin.called == set(hookspecs())


async def test_a_plugin_provider_serves_and_startup_and_shutdown_see_the_runtime(
    tmp_path: Path,
) -> None:
    """The hooks no other test names: roost_providers, roost_startup, roost_shutdown."""
    seen: list[tuple[str, Runtime]] = []

    class Mine:
        @hookimpl
        def roost_providers(self, settings: Settings) -> ProviderSpec:
            return ProviderSpec("mine", lambda s: scripted_provider([{"reply": "from mine"}]),
                                lambda s: None)

        @hookimpl
        async def roost_startup(self, app: Runtime) -> None:
            seen.append(("startup", app))

        @hookimpl
        def roost_shutdown(self, app: Runtime) -> None:
            seen.append(("shutdown", app))

    host = get_plugin_manager(load_entry_points=False)
    host.register(Mine(), "mine")
    app = await Roost.create(Settings(provider="mine", data_dir=tmp_path, merge_window_ms=0,
                                      dm_policy="open"), host=host)
    try:
        assert seen == [("startup", app.runtime)]
        chat = ChatChannel()
        chat.app = app
        await app.add_channel(chat)
        assert await chat.ask("hello") == ["from mine"]
    finally:
        await app.close()
    assert seen == [("startup", app.runtime), ("shutdown", app.runtime)]


def test_every_hook_is_named_in_some_test() -> None:
    texts = [p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("*.py")]
    unnamed = [h for h in hookspecs() if not any(f"def {h}(" in t for t in texts)]
    assert not unnamed, f"no test implements {unnamed}"
