"""Agents: config, bindings and routing, the router's cache, the resolver's fallbacks,
per-agent sessions, workspaces, personas, tool policies and models, and the admin commands."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.agents.router import AgentError, AgentResolver, AgentRouter, route
from bot.app.roost import Roost
from bot.config.agents import Binding
from bot.config.settings import ConfigError, Settings, load_settings
from bot.contracts.llm import LLMProvider
from bot.contracts.messages import ChatType, InboundMessage
from bot.pluginhost.manager import get_plugin_manager
from bot.testing.app import scripted, settle
from bot.testing.openai import FakeOpenAI
from tests.conftest import AppFactory, make_chat

ADMIN = "test:boss"


def message(chat: str = "u1", chat_type: ChatType = "direct", channel: str = "test",
            sender: str = "u1", group_id: str | None = None) -> InboundMessage:
    return InboundMessage(channel, chat, chat_type, sender, "hi", group_id=group_id)


def script(path: Path, *turns: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"turns": list(turns)}), encoding="utf-8")
    return path


# -- config and routing ---------------------------------------------------------


BINDINGS = [
    Binding(agent="by-server", group_id="S1"),
    Binding(agent="by-channel", channel="test"),
    Binding(agent="by-type", chat_type="group"),
    Binding(agent="by-channel-and-type", channel="test", chat_type="group"),
    Binding(agent="by-chat", chat_id="g1"),
    Binding(agent="by-chat-later", chat_id="g1"),
]


@pytest.mark.parametrize(("msg", "agent"), [
    (message(), "by-channel"),                                   # channel (2)
    (message("g2", "group"), "by-channel-and-type"),             # channel + type (3)
    (message("g2", "group", channel="slack"), "by-type"),        # type only (1)
    (message("g1", "group"), "by-chat"),                         # chat id (4), first listed
    (message("u9", channel="slack"), "default"),                 # nothing matches
    (message("c5", "group", group_id="S1"), "by-server"),         # server (4) over channel
    (message("g1", "group", group_id="S1"), "by-chat"),           # chat id (8) over server
])
def test_the_most_specific_binding_wins_and_unbound_chats_get_the_default(
        msg: InboundMessage, agent: str) -> None:
    assert route(BINDINGS, msg) == agent


def test_roost_toml_declares_agents_and_bindings(tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text("""
[agents.support]
model = "claude-haiku-5"
max_iterations = 5
tools = { profile = "messaging", deny = ["cron"] }

[agents.support.judge]
strategy = "min"
judges = [{ type = "llm", model = "claude-opus-5" }]

[[bindings]]
agent = "support"
channel = "slack"
chat_type = "group"
""", encoding="utf-8")
    settings = load_settings(config)
    support = settings.agents["support"]
    assert (support.model, support.max_iterations, support.tools.profile,
            support.tools.deny) == ("claude-haiku-5", 5, "messaging", ("cron",))
    assert support.judge is not None and support.judge.strategy == "min"
    assert support.judge.threshold == 0.7 and support.judge.max_retries == 3
    assert settings.bindings == [Binding(agent="support", channel="slack", chat_type="group")]
    assert settings.config_file == config


@pytest.mark.parametrize(("toml", "complaint"), [
    ('[[bindings]]\nagent = "ghost"\nchannel = "slack"', "unknown agent 'ghost'"),
    ('[[bindings]]\nagent = "default"', "needs channel, chat_id, group_id or chat_type"),
    ('[agents.p]\ntype = "predefined"', "needs bootstrap_dir"),
    ('[agents."a:b"]\nmodel = "x"', "must be 1-32 letters"),
    ('[agents.a]\ntools = { profile = "everything" }', "unknown tool profile"),
    ('[agents.a.judge]\nmax_retries = 11', "max_retries"),
    ('[agents.a.judge]\nstrategy = "mode"', "strategy"),
    ('[agents.a]\ncontext_window = 500', "at least 1000"),
])
def test_bad_agent_config_is_refused_naming_the_key(tmp_path: Path, toml: str,
                                                    complaint: str) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(toml, encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid config") as info:
        load_settings(config)
    assert complaint in str(info.value)


# -- router cache ---------------------------------------------------------------


async def test_router_resolves_lazily_caches_for_the_ttl_and_re_resolves_after_it(
        tmp_path: Path) -> None:
    now = [100.0]
    settings = Settings(data_dir=tmp_path, agents={"support": {"model": "m"}})
    provider = scripted({"reply": "x"})
    router = AgentRouter(AgentResolver(settings, get_plugin_manager(load_entry_points=False),
                                       provider, dict), ttl=60, clock=lambda: now[0])
    assert router.resolutions == 0 and router.peek("support") is None  # lazy
    first = await router.get("support")
    assert router.resolutions == 1 and first.settings.model == "m"
    now[0] += 59
    assert await router.get("support") is first and router.resolutions == 1
    now[0] += 2  # past the TTL
    second = await router.get("support")
    assert second is not first and router.resolutions == 2
    assert await router.get("support") is second


async def test_invalidate_makes_the_next_get_resolve_again_with_the_new_config(
        tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, agents={"support": {"model": "old"}})
    provider = scripted({"reply": "x"})
    router = AgentRouter(AgentResolver(settings, get_plugin_manager(load_entry_points=False),
                                       provider, dict), ttl=3600)
    assert (await router.get("support")).settings.model == "old"
    settings.agents = Settings(agents={"support": {"model": "new"}}).agents
    assert (await router.get("support")).settings.model == "old"  # still cached
    assert router.invalidate("support") is True
    assert router.invalidate("support") is False
    assert (await router.get("support")).settings.model == "new"
    with pytest.raises(AgentError, match="no agent named 'ghost'"):
        await router.get("ghost")


# -- resolver fallbacks -----------------------------------------------------------


async def test_resolver_fallbacks_unknown_provider_window_and_iterations(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(data_dir=tmp_path, agents={
        "odd": {"provider": "no-such-provider", "context_window": 0, "max_iterations": -3},
        "zero": {"max_iterations": 0, "context_window": -1},
    })
    host = get_plugin_manager(load_entry_points=False)
    provider = scripted({"reply": "x"})
    router = AgentRouter(AgentResolver(settings, host, provider, dict))
    with caplog.at_level(logging.WARNING, logger="roost.agents.router"):
        odd = await router.get("odd")
    # The first registered provider is the built-in anthropic one: the service's own.
    first = next(s.name for s in await host.collect("roost_providers", settings=settings))
    assert first == "anthropic" and odd.settings.provider == first
    assert "unknown provider 'no-such-provider'; falling back to 'anthropic'" in caplog.text
    assert odd.settings.context_window == 200_000 and odd.settings.max_iterations == 20
    zero = await router.get("zero")
    assert zero.settings.context_window == 200_000 and zero.settings.max_iterations == 20


async def test_fallback_iteration_cap_of_20_ends_a_looping_run(make_app: AppFactory) -> None:
    call = {"tool_calls": [{"name": "list_files", "arguments": {}}]}
    looping = scripted({"steps": [call] * 25})
    app, channel, _ = await make_app(looping, agents={"default": {"max_iterations": 0}})
    await channel.say("go")
    await settle(app, 30)
    assert channel.replies == ["I stopped after 20 steps without finishing. Tell me how to "
                               "continue, or ask for something smaller."]
    assert len(looping.requests) == 20


async def test_an_agent_whose_provider_cannot_run_fails_its_runs_with_the_reason(
        make_app: AppFactory) -> None:
    app, channel, _ = await make_app(
        scripted({"reply": "x"}), agents={"ops": {"provider": "openai"}},
        bindings=[{"agent": "ops", "channel": "test"}])
    await channel.say("hello")
    await settle(app)
    assert len(channel.sent) == 1
    assert "agent ops: the openai provider needs OPENAI_BASE_URL" in channel.sent[0].text


# -- agents at work: sessions, workspaces, models, personas -------------------------


async def test_bound_chats_get_their_agents_provider_model_session_and_workspace(
        make_app: AppFactory, fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    default = scripted({"reply": "from the default agent"})
    fake_openai.reply_text("from the local model")
    app, channel, _ = await make_app(
        default, openai_base_url=fake_openai.base_url, openai_api_key="k", admins=[ADMIN],
        agents={"local": {"provider": "openai", "model": "qwen-local", "max_tokens": 321}},
        bindings=[{"agent": "local", "chat_type": "group"}])
    await channel.say("in the group", group="g1")
    await channel.say("direct")
    await settle(app)
    assert sorted(channel.replies) == ["from the default agent", "from the local model"]
    body = fake_openai.requests[0].body
    assert body["model"] == "qwen-local" and body["max_tokens"] == 321
    assert len(default.requests) == 1 and default.requests[0].model == app.settings.model
    group = await app.store.get("local:test:group:g1")
    direct = await app.store.get("default:test:direct:u1")
    assert [m.content for m in group.messages] == ["in the group", "from the local model"]
    assert [m.content for m in direct.messages] == ["direct", "from the default agent"]
    workspaces = app.settings.workspaces_dir
    assert (workspaces / "@agents" / "local" / "test" / "u1" / "USER.md").is_file()
    assert (workspaces / "test" / "u1" / "USER.md").is_file()
    # /status in the group names the group's agent and model.
    await channel.say("/status", group="g1")
    await settle(app)
    status = channel.replies[-1]
    assert "Agent: local" in status and "Model: qwen-local via openai" in status


async def test_predefined_agent_reads_its_own_persona_and_seeds_only_user_md(
        make_app: AppFactory, tmp_path: Path) -> None:
    persona = tmp_path / "pip"
    persona.mkdir()
    (persona / "SOUL.md").write_text("You are Pip, the support bot of Acme.", encoding="utf-8")
    (persona / "AGENTS.md").write_text("Escalate refunds to a human.", encoding="utf-8")
    (persona / "USER.md").write_text("# Customer\nPlan: unknown", encoding="utf-8")
    llm = scripted({"reply": "hello"}, loop=True)
    app, channel, _ = await make_app(
        llm, agents={"pip": {"type": "predefined", "bootstrap_dir": str(persona)},
                     "default": {"bootstrap_dir": str(persona)}},
        bindings=[{"agent": "pip", "chat_id": "shop"}])
    await channel.say("hi", group="shop", sender="c1")
    await channel.say("hi", sender="u2")
    await settle(app)
    pip_system, open_system = (r.system for r in llm.requests)
    assert "You are Pip, the support bot of Acme." in pip_system
    assert "Escalate refunds to a human." in pip_system
    assert "Plan: unknown" in pip_system  # the user's own USER.md, seeded from the template
    ws = app.settings.workspaces_dir / "@agents" / "pip" / "test" / "c1"
    assert sorted(p.name for p in ws.iterdir()) == ["USER.md", "memory"]
    # An open agent with a bootstrap_dir seeds every user's workspace from it.
    own = app.settings.workspaces_dir / "test" / "u2"
    assert (own / "SOUL.md").read_text(encoding="utf-8") == (persona / "SOUL.md").read_text(
        encoding="utf-8")
    assert (own / "BOOTSTRAP.md").is_file()
    assert "You are Pip" in open_system


# -- tool policy ------------------------------------------------------------------


async def test_policy_hides_tools_from_the_model_and_refuses_them_when_called_anyway(
        make_app: AppFactory) -> None:
    llm = scripted({"steps": [
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "x.md", "content": "sneaky"}}]},
        {"reply": "done"},
    ]})
    app, channel, _ = await make_app(llm, agents={"default": {"tools": {
        "profile": "minimal", "allow": ["group:file_tools", "sql"],
        "deny": ["write_file", "edit_file"]}}})
    await channel.say("write it")
    await settle(app)
    offered = {t.name for t in llm.requests[0].tools}
    assert offered == {"get_error_detail", "get_tool_result", "read_file", "list_files", "sql"}
    result = llm.requests[1].messages[-1]
    assert result.role == "tool" and result.is_error
    assert "Unknown tool 'write_file'" in result.content
    assert not (app.settings.workspaces_dir / "test" / "u1" / "x.md").exists()
    assert channel.replies == ["done"]


# -- admin commands -----------------------------------------------------------------


async def test_agents_command_lists_agents_and_bindings_for_admins_only(
        make_app: AppFactory) -> None:
    app, channel, _ = await make_app(
        scripted({"reply": "x"}), admins=[ADMIN],
        agents={"support": {"model": "claude-haiku-5", "tools": {"profile": "messaging"},
                            "judge": {"strategy": "vote"}}},
        bindings=[{"agent": "support", "channel": "test", "chat_type": "group"}])
    await channel.say("/agents", sender="u1")
    await channel.say("/agents", sender="boss")
    await settle(app)
    refused, listing = channel.replies
    assert refused == "/agents is for admins only."
    assert "- default: anthropic/claude-sonnet-5-5, open, tools full" in listing
    assert ("- support: anthropic/claude-haiku-5, open, tools messaging, 1 judge(s), vote >= "
            "0.70, up to 3 attempts, not resolved yet") in listing
    assert "1. channel=test chat_type=group -> support" in listing
    assert "This chat -> default." in listing


async def test_agent_reload_rereads_roost_toml_and_applies_the_edit(
        tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text('[agents.support]\nmodel = "model-one"\n\n[[bindings]]\n'
                      'agent = "support"\nchannel = "test"\n', encoding="utf-8")
    settings = load_settings(config, data_dir=tmp_path / "data", merge_window_ms=0,
                             admins=ADMIN, dm_policy="open")
    llm = scripted({"reply": "ok"}, loop=True)
    host = get_plugin_manager(load_entry_points=False)
    app = await Roost.create(settings, host=host, provider=llm)
    channel = make_chat()
    await app.add_channel(channel)
    try:
        await channel.say("one")
        await settle(app)
        config.write_text(config.read_text(encoding="utf-8").replace("model-one", "model-two"),
                          encoding="utf-8")
        await channel.say("two")
        await settle(app)
        assert [r.model for r in llm.requests] == ["model-one", "model-one"]  # cached
        await channel.say("/agent reload support", sender="u1")
        await settle(app)
        assert channel.replies[-1] == "/agent is for admins only."
        await channel.say("/agent reload support", sender="boss")
        await settle(app)
        assert channel.replies[-1].startswith("Reloaded agent support (re-read ")
        await channel.say("three")
        await settle(app)
        assert llm.requests[-1].model == "model-two"
        config.write_text("[agents.support\n", encoding="utf-8")
        await channel.say("/agent reload support", sender="boss")
        await settle(app)
        assert "has errors; nothing changed" in channel.replies[-1]
        await channel.say("four")
        await settle(app)
        assert llm.requests[-1].model == "model-two" and channel.replies[-1] == "ok"
        config.write_text('[agents.support]\nmodel = "model-two"\n', encoding="utf-8")
        await channel.say("/agent reload nobody", sender="boss")
        await channel.say("/agent", sender="boss")
        await settle(app)
        assert "No agent named 'nobody'" in channel.replies[-2]
        # The edit dropped the binding: this chat is the default agent's again.
        assert channel.replies[-1].startswith("This chat is served by agent default.")
    finally:
        await app.close()


async def test_router_providers_are_closed_with_the_app(make_app: AppFactory,
                                                        tmp_path: Path) -> None:
    closed: list[str] = []
    own = script(tmp_path / "own.yaml", {"reply": "from my own script"})
    app, channel, _ = await make_app(
        scripted({"reply": "x"}), agents={"demo": {"provider": "scripted", "script": str(own)}},
        bindings=[{"agent": "demo", "channel": "test"}])
    await channel.say("hi")
    await settle(app)
    assert channel.replies == ["from my own script"]
    agent = await app.router.get("demo")
    provider: LLMProvider | None = agent.provider
    assert provider is not None and provider is not app.provider

    async def aclose() -> None:
        closed.append(provider.name)

    provider.aclose = aclose  # type: ignore[method-assign]
    await app.close()
    assert closed == ["scripted"]
