"""Plugin control: enable/disable live and persisted, config validation, loading filters,
tracing, the admin chat commands and the CLI."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from bot.app.roost import Roost
from bot.contracts.commands import Command, CommandContext
from bot.contracts.guard import GuardPattern
from bot.contracts.hookspecs import hookimpl
from bot.contracts.jobs import JobSpec
from bot.contracts.llm import Sanitizer
from bot.contracts.prompt import PromptContext, PromptSection
from bot.contracts.services import Services
from bot.contracts.tools import Tool, ToolContext
from bot.pluginhost import commands as plugin_commands
from bot.pluginhost.install import run_streaming
from bot.pluginhost.manager import get_plugin_manager
from bot.testing.app import ChatChannel, scripted, settle, without_summary
from tests.cli_forks import run_roost
from tests.conftest import AppFactory
from tests.test_cli import clean_env
from tests.test_plugins import GOOD, make_dist

ADMIN = "test:boss"
PLUGIN = "test-plugin-0"


class Shouter:
    """A plugin with one of everything that can be switched live."""

    def __init__(self) -> None:
        self.ran = 0
        self.services: Services | None = None

    @hookimpl
    def roost_tools(self, services: Services) -> list[Tool]:
        self.services = services

        async def shout(ctx: ToolContext, args: Mapping[str, Any]) -> str:
            self.ran += 1
            return "LOUD"

        return [Tool("shout", "Shout.", {"type": "object", "properties": {}}, shout)]

    @hookimpl
    def roost_commands(self) -> Command:
        async def hey(ctx: CommandContext) -> str:
            return "hey there"

        return Command("hey", "say hey", hey)

    @hookimpl
    def roost_output_sanitizers(self) -> Sanitizer:
        return Sanitizer("no-secret", lambda t: t.replace("SECRET", "[gone]"))

    @hookimpl
    def roost_guard_patterns(self) -> GuardPattern:
        return GuardPattern("banana", r"banana split")

    @hookimpl
    def roost_prompt_sections(self, prompt: PromptContext) -> PromptSection:
        return PromptSection("shouter", "SHOUTER SECTION")

    @hookimpl
    def roost_scheduled_jobs(self) -> JobSpec:
        async def tick(app: Roost) -> None:
            return None

        return JobSpec("shouter-tick", "every 1h", tick)


class WeatherConfig(BaseModel):
    api_key: str
    units: str = "metric"


class Weather:
    @hookimpl
    def roost_plugin_config_model(self) -> type[BaseModel]:
        return WeatherConfig

    @hookimpl
    def roost_tools(self) -> Tool:
        async def weather(ctx: ToolContext, args: Mapping[str, Any]) -> str:
            return "sunny"

        return Tool("weather", "Weather.", {"type": "object", "properties": {}}, weather)


def offered(provider: Any, index: int = -1) -> set[str]:
    return {t.name for t in provider.requests[index].tools}


async def test_disable_and_enable_take_effect_at_once_for_everything(
        make_app: AppFactory) -> None:
    shouter = Shouter()
    turn = {"steps": [{"tool_calls": [{"name": "shout", "arguments": {}}]},
                      {"reply": "said SECRET"}]}
    provider = scripted(turn, loop=True)
    app, channel, _ = await make_app(provider, shouter, admins=[ADMIN], guard_mode="block")
    scheduler = app.services.scheduler
    assert scheduler is not None
    assert "system:shouter-tick" in {v.job.id for v in await scheduler.all_jobs()}

    await channel.say("go")
    await settle(app)
    assert "shout" in offered(provider) and shouter.ran == 1
    assert "SHOUTER SECTION" in (provider.requests[-1].system or "")
    assert channel.replies[-1] == "said [gone]"

    reply = await app.set_plugin_enabled(PLUGIN, False)
    assert reply == f"{PLUGIN} is now disabled."
    await channel.say("go")
    await settle(app)
    assert "shout" not in offered(provider, -2) and "shout" not in offered(provider)
    assert shouter.ran == 1  # the model asked for it anyway; it did not run
    tool_result = [m for m in provider.requests[-1].messages if m.role == "tool"][-1]
    assert "Unknown tool 'shout'" in without_summary(tool_result.content)
    assert "SHOUTER SECTION" not in (provider.requests[-1].system or "")
    assert channel.replies[-1] == "said SECRET"  # sanitizer gone
    await channel.say("/hey")
    await settle(app)
    assert channel.replies[-1].startswith("I don't know /hey")
    await channel.say("a banana split please")
    await settle(app)
    assert channel.replies[-1] == "said SECRET"  # guard pattern gone: not refused
    assert "system:shouter-tick" not in {v.job.id for v in await scheduler.all_jobs()}

    assert await app.set_plugin_enabled(PLUGIN, True) == f"{PLUGIN} is now enabled."
    await channel.say("/hey")
    await settle(app)
    assert channel.replies[-1] == "hey there"
    requests_before = len(provider.requests)
    await channel.say("a banana split please")
    await settle(app)
    assert len(provider.requests) == requests_before  # refused by the guard again
    await channel.say("go")
    await settle(app)
    assert "shout" in offered(provider) and shouter.ran == 2
    assert channel.replies[-1] == "said [gone]"
    assert "system:shouter-tick" in {v.job.id for v in await scheduler.all_jobs()}


async def test_disabled_state_survives_a_restart(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}), Shouter())
    await app.set_plugin_enabled(PLUGIN, False)
    await app.set_plugin_enabled("plugins.sql_tool", False)
    await app.close()
    again, _, _ = await make_app(scripted({"reply": "ok"}), Shouter())
    assert {PLUGIN, "plugins.sql_tool"} <= again.host.disabled
    assert "shout" not in again.engine.tools and "hey" not in again.commands
    assert await again.set_plugin_enabled(PLUGIN, True) == f"{PLUGIN} is now enabled."
    await again.close()
    third, _, _ = await make_app(scripted({"reply": "ok"}), Shouter())
    assert PLUGIN not in third.host.disabled and "shout" in third.engine.tools
    assert "plugins.sql_tool" in third.host.disabled


async def test_essential_plugins_cannot_be_disabled(make_app: AppFactory) -> None:
    app, _, _ = await make_app(scripted({"reply": "ok"}))
    for name in ("plugins.core_commands", "plugins.providers", "channels.builtin"):
        reply = await app.set_plugin_enabled(name, False)
        assert "essential" in reply and "cannot be disabled" in reply
        assert name not in app.host.disabled
    assert "help" in app.commands
    assert "No plugin named 'nope'" in await app.set_plugin_enabled("nope", False)


async def test_restart_only_hooks_are_named(make_app: AppFactory) -> None:
    class Chan:
        @hookimpl
        def roost_channels(self) -> list[Any]:
            return []

    app, _, _ = await make_app(scripted({"reply": "ok"}), Chan())
    reply = await app.set_plugin_enabled(PLUGIN, False)
    assert "channels change only after a restart" in reply


async def test_invalid_config_disables_only_that_plugin(
        make_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "roost.pluginhost.manager")
    app, _, _ = await make_app(scripted({"reply": "ok"}), Weather(), Shouter(),
                               plugins={"test-plugin-0": {"units": 3}})
    assert PLUGIN in app.host.disabled and PLUGIN in app.host.bad_config
    error = app.host.errors[PLUGIN]
    assert "[plugins.test-plugin-0]" in error and "api_key" in error and "units" in error
    assert any("test-plugin-0" in r.getMessage() and "api_key" in r.getMessage()
               for r in caplog.records)
    assert "weather" not in app.engine.tools and "shout" in app.engine.tools
    assert "Fix its configuration" in await app.set_plugin_enabled(PLUGIN, True)


async def test_valid_config_reaches_the_plugin(make_app: AppFactory) -> None:
    shouter = Shouter()
    app, _, _ = await make_app(scripted({"reply": "ok"}), Weather(), shouter,
                               plugins={"test-plugin-0": {"api_key": "k"}})
    config = app.plugin_config(PLUGIN)
    assert isinstance(config, WeatherConfig) and config.api_key == "k"
    assert shouter.services is not None and shouter.services.plugin_config(PLUGIN) is config
    assert app.plugin_config("test-plugin-1") is None and "weather" in app.engine.tools


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    make_dist(site, "roost-hello", "roost_hello", GOOD, "hello")
    make_dist(site, "roost-other", "roost_other", GOOD.replace('"hello"', '"other"'), "other")
    monkeypatch.syspath_prepend(str(site))
    return site


def test_load_plugins_restricts_external_plugins(site: Path) -> None:
    assert {"hello", "other"} <= set(get_plugin_manager(env={}).info)
    only = get_plugin_manager(env={"ROOST_LOAD_PLUGINS": "Roost_Hello, "})
    assert "hello" in only.info and "other" not in only.info
    assert "plugins.core_commands" in only.info  # built-ins always load
    none = get_plugin_manager(env={"ROOST_LOAD_PLUGINS": ""})
    assert "hello" not in none.info and "other" not in none.info
    off = get_plugin_manager(env={"ROOST_LOAD_PLUGINS": "roost-hello",
                                  "ROOST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "hello" not in off.info


async def test_trace_logs_every_hook_call(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "roost.pluginhost.manager")
    host = get_plugin_manager(load_entry_points=False, env={"ROOST_TRACE_PLUGINS": "1"})
    await host.call("roost_commands", settings=None)
    line = next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("hook roost_commands"))
    assert "plugins.core_commands" in line and " ms" in line
    caplog.clear()
    quiet = get_plugin_manager(load_entry_points=False, env={})
    await quiet.call("roost_commands", settings=None)
    assert not [r for r in caplog.records if r.getMessage().startswith("hook ")]


# -- chat commands --------------------------------------------------------------------------


async def ask(app: Roost, channel: ChatChannel, text: str, sender: str = "boss") -> str:
    await channel.say(text, sender=sender)
    await settle(app)
    return channel.replies[-1]


@pytest.mark.parametrize("text", ["/plugins", "/plugin disable test-plugin-0",
                                  "/plugin enable test-plugin-0", "/plugin info test-plugin-0",
                                  "/plugin install roost-hello"])
async def test_plugin_commands_are_admin_only(make_app: AppFactory, text: str) -> None:
    app, channel, _ = await make_app(scripted({"reply": "ok"}), Shouter(), admins=[ADMIN],
                                     plugins_chat_install=True,
                                     plugins_install_allowlist=["roost-hello"])
    reply = await ask(app, channel, text, sender="mallory")
    assert "for admins only" in reply
    assert PLUGIN not in app.host.disabled


async def test_admin_lists_disables_enables_and_inspects(make_app: AppFactory) -> None:
    app, channel, _ = await make_app(scripted({"reply": "ok"}), Shouter(), Weather(),
                                     admins=[ADMIN], plugins={"test-plugin-1": {"api_key": "k"}})
    listing = await ask(app, channel, "/plugins")
    assert f"{PLUGIN} (" in listing and "plugins.core_commands (built-in): enabled, essential" \
        in listing
    assert await ask(app, channel, f"/plugin disable {PLUGIN}") == f"{PLUGIN} is now disabled."
    assert f"{PLUGIN} (" in await ask(app, channel, "/plugins")
    assert ": disabled" in await ask(app, channel, "/plugins")
    assert "already disabled" in await ask(app, channel, f"/plugin disable {PLUGIN}")
    info = await ask(app, channel, f"/plugin info {PLUGIN}")
    assert "disabled" in info and "roost_tools" in info
    assert "Tools: shout" in info and "Commands: /hey" in info
    assert "Configuration: none declared" in info
    assert await ask(app, channel, f"/plugin enable {PLUGIN}") == f"{PLUGIN} is now enabled."
    weather = await ask(app, channel, "/plugin info test-plugin-1")
    assert "api_key" in weather and "Tools: weather" in weather
    assert "essential" in await ask(app, channel, "/plugin disable plugins.providers")
    assert "Usage" in await ask(app, channel, "/plugin frobnicate x")


async def test_chat_install_is_off_by_default_and_allowlisted(
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def install(name: str) -> list[str]:
        ran.append(name)
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(plugin_commands, "install_command", install)
    app, channel, _ = await make_app(scripted({"reply": "ok"}), admins=[ADMIN])
    assert "is off" in await ask(app, channel, "/plugin install roost-hello")
    app.settings.plugins_chat_install = True
    assert "(which is empty)" in await ask(app, channel, "/plugin install roost-hello")
    app.settings.plugins_install_allowlist = ["roost-hello"]
    assert "not in plugins_install_allowlist" in await ask(app, channel,
                                                           "/plugin install roost-evil")
    assert "not a package name" in await ask(app, channel,
                                             "/plugin install --index-url=http://x")
    assert ran == []


async def wait_for_text(channel: ChatChannel, check: Any, limit: float = 10.0) -> str:
    return (await channel.wait_for_message(lambda m: check(m.text), limit)).text


async def test_chat_install_runs_in_the_background_and_reports(
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = ("import os, sys, time\nprint('Collecting roost-hello', flush=True)\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
              "print('Successfully installed roost-hello-1.0')\n")
    monkeypatch.setattr(plugin_commands, "install_command",
                        lambda name: [sys.executable, "-c", script])
    monkeypatch.setattr(plugin_commands, "PROGRESS_INTERVAL", 0.0)
    app, channel, _ = await make_app(scripted({"reply": "chatting"}), admins=[ADMIN],
                                     plugins_chat_install=True,
                                     plugins_install_allowlist=["Roost_Hello"])
    assert "in the background" in await ask(app, channel, "/plugin install roost-hello")
    await wait_for_text(channel, lambda t: t == "roost-hello: Collecting roost-hello")
    # pip is still running; other chats are not blocked, and a second install is refused.
    await channel.say("hello", sender="someone")
    await settle(app)
    assert [m.text for m in channel.sent if m.chat_id == "someone"] == ["chatting"]
    assert "already being installed" in await ask(app, channel, "/plugin install roost-hello")
    assert not any(t.startswith("Installed") for t in channel.replies)
    go.write_text("")
    done = await wait_for_text(channel, lambda t: t.startswith("Installed roost-hello: "))
    assert "Restart Roost" in done
    assert channel.sent[-1].chat_id == "boss"


async def test_chat_install_failure_is_reported(
        make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin_commands, "install_command", lambda name: [
        sys.executable, "-c", "print('ERROR: No matching distribution'); raise SystemExit(1)"])
    app, channel, _ = await make_app(scripted({"reply": "ok"}), admins=[ADMIN],
                                     plugins_chat_install=True,
                                     plugins_install_allowlist=["roost-hello"])
    await ask(app, channel, "/plugin install roost-hello")
    failure = await wait_for_text(channel, lambda t: "failed" in t)
    assert "exit code 1" in failure and "No matching distribution" in failure


async def test_run_streaming_passes_lines_and_exit_code() -> None:
    seen: list[str] = []

    async def on_line(line: str) -> None:
        seen.append(line)

    code, lines = await run_streaming(
        [sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], on_line)
    assert code == 3 and lines == seen == ["a", "b"]


# -- CLI ------------------------------------------------------------------------------------


def roost_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``roost *args`` as a process of its own (:mod:`tests.cli_forks`)."""
    return run_roost(list(args), cwd=cwd, env=clean_env(**env), timeout=60)


@pytest.mark.slow
def test_cli_enable_disable_persist_and_list(site: Path, tmp_path: Path) -> None:
    path = str(site)
    listing = roost_cli("plugins", "list", "--json", cwd=tmp_path, PYTHONPATH=path)
    assert listing.returncode == 0, listing.stderr
    assert '"hello"' in listing.stdout and "plugins.core_commands" not in listing.stdout
    assert "plugins.core_commands" in roost_cli("plugins", "list", "--json", "--all",
                                                cwd=tmp_path, PYTHONPATH=path).stdout
    off = roost_cli("plugins", "disable", "hello", cwd=tmp_path, PYTHONPATH=path)
    assert off.returncode == 0, off.stderr
    table = roost_cli("plugins", "list", cwd=tmp_path, PYTHONPATH=path).stdout
    assert any(line.startswith("hello") and "disabled" in line for line in table.splitlines())
    refused = roost_cli("plugins", "disable", "channels.builtin", cwd=tmp_path)
    assert refused.returncode == 1 and "essential" in refused.stderr
    unknown = roost_cli("plugins", "enable", "nope", cwd=tmp_path)
    assert unknown.returncode == 1 and "no plugin named 'nope'" in unknown.stderr
    assert roost_cli("plugins", "enable", "hello", cwd=tmp_path, PYTHONPATH=path).returncode == 0
    table = roost_cli("plugins", "list", cwd=tmp_path, PYTHONPATH=path).stdout
    assert any(line.startswith("hello") and "enabled" in line for line in table.splitlines())


@pytest.mark.parametrize("action", ["install", "uninstall"])
def test_cli_install_and_uninstall_run_pip_in_roosts_environment(
        monkeypatch: pytest.MonkeyPatch, action: str) -> None:

    from click.testing import CliRunner

    from bot.app.cli import cli
    from bot.pluginhost import install as plugin_install

    calls: list[list[str]] = []

    def call(cmd: list[str]) -> int:
        calls.append(cmd)
        return 0

    monkeypatch.setattr("bot.app.cli.plugins.run_pip", call)
    states = iter([{"old": "roost-old"}, {"new": "roost-new"}])
    monkeypatch.setattr(plugin_install, "plugin_entry_points", lambda: next(states))
    result = CliRunner().invoke(cli, ["plugins", action, "roost-new", "roost-x"], obj={})
    assert result.exit_code == 0, result.output
    extra = ["-y"] if action == "uninstall" else []
    assert calls == [[sys.executable, "-m", "pip", action, *extra, "roost-new", "roost-x"]]
    assert "new plugins: new (roost-new); removed plugins: old (roost-old)" in result.output

    monkeypatch.setattr("bot.app.cli.plugins.run_pip", lambda cmd: 1)
    monkeypatch.setattr(plugin_install, "plugin_entry_points", dict)
    failed = CliRunner().invoke(cli, ["plugins", action, "roost-new"], obj={})
    assert failed.exit_code == 1 and f"pip {action} failed" in failed.output


async def test_pips_lines_reach_the_chat_with_credentials_masked() -> None:
    """``/plugin install`` streams pip's lines into the chat: pip redacts an index URL's
    password but not a token in its query, so every line goes through the masking."""
    shown: list[str] = []

    async def show(line: str) -> None:
        shown.append(line)

    url = "https://pip:PW-S3CRET@index.example/simple?token=TOK-S3CRET"
    code, lines = await run_streaming(
        [sys.executable, "-c", f"print('Looking in indexes: {url}')"], show)
    assert code == 0 and lines == shown
    assert shown == ["Looking in indexes: https://pip:********@index.example/simple"
                     "?token=********"]
