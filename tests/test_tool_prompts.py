"""A tool's own system-prompt sections (``Tool.prompt``): asked for only in runs the tool is
offered to, once per run however many tools share them, stable ones in the cached system
prompt and volatile ones in the note, and a failing or slow one left out of a run that
goes on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.engine.requests import RunRequest
from bot.testing.app import scripted, settle
from plugins.scripted_provider import ScriptedProvider
from roost import (
    InboundMessage,
    Order,
    PromptContext,
    PromptSection,
    Tool,
    ToolContext,
    ToolPrompt,
    hookimpl,
)
from tests.conftest import AppFactory


async def noop(context: ToolContext, args: Mapping[str, Any]) -> str:
    return "ok"


class Offering:
    """A plugin offering ``tools``: name -> (its prompt callable, its timeout)."""

    def __init__(self, tools: Mapping[str, tuple[ToolPrompt | None, float | None]]) -> None:
        self.tools = tools

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool(name, f"The {name} tool.", {"type": "object"}, noop, timeout=timeout,
                     prompt=prompt) for name, (prompt, timeout) in self.tools.items()]


class Guide:
    """A prompt callable that counts its calls and remembers what each run offered."""

    def __init__(self, text: str, order: int = Order.PLUGIN_DEFAULT) -> None:
        self.text, self.order = text, order
        self.calls: list[Sequence[str]] = []

    async def __call__(self, prompt: PromptContext) -> list[PromptSection]:
        self.calls.append(prompt.tool_names)
        return [PromptSection("guide", self.text, self.order),
                PromptSection("guide_now", f"{self.text} call {len(self.calls)}", volatile=True)]


async def run(app: Roost, provider: ScriptedProvider, *, agent: str = "default",
              tools: Sequence[str] | None = None) -> tuple[str, str]:
    """One run of ``agent``; the system prompt and the note of its request."""
    message = InboundMessage("test", "u1", "direct", "u1", "hello")
    session = await app.store.get(f"{agent}:test:direct:u1")
    result = await app.engine.run(RunRequest(message, session, agent=agent, tools=tools))
    assert result.status == "completed"
    return provider.requests[-1].system, provider.requests[-1].note


async def test_sections_come_only_with_the_offered_tool_per_agent_and_per_run(
        make_app: AppFactory) -> None:
    guide = Guide("## Using alpha\nCall alpha for alphas.")
    provider = scripted({"reply": "ok"}, loop=True)
    app, _, _ = await make_app(provider, Offering({"alpha": (guide, None),
                                                   "beta": (None, None)}),
                               agents={
                                   "narrow": {"tools": {"profile": "coding", "allow": ["beta"]}},
                                   "picked": {"tools": {"profile": "coding", "allow": ["alpha"]}},
                                   "denied": {"tools": {"deny": ["alpha"]}}})
    system, _ = await run(app, provider)
    assert "## Using alpha" in system and len(guide.calls) == 1
    assert "alpha" in guide.calls[0]
    # Agents whose allow-list leaves alpha out, or deny it: not offered, not asked.
    for agent in ("narrow", "denied"):
        system, note = await run(app, provider, agent=agent)
        assert "beta" in {t.name for t in provider.requests[-1].tools}
        assert "Using alpha" not in system and "Using alpha" not in note
        assert len(guide.calls) == 1
    # The agent whose allow-list names it: asked, with the run's tools.
    system, _ = await run(app, provider, agent="picked")
    assert "## Using alpha" in system and len(guide.calls) == 2
    assert "alpha" in guide.calls[1] and "beta" not in guide.calls[1]
    # A run narrowed to other tools (a cron job's, a memory flush's) does not ask either.
    system, _ = await run(app, provider, tools=["beta"])
    assert "## Using alpha" not in system and len(guide.calls) == 2


async def test_a_callable_shared_by_two_tools_is_asked_once_and_shown_once(
        make_app: AppFactory) -> None:
    guide = Guide("## Using the pair")
    provider = scripted({"reply": "ok"}, loop=True)
    app, _, _ = await make_app(provider, Offering({"left": (guide, None),
                                                   "right": (guide, None)}))
    system, note = await run(app, provider)
    assert len(guide.calls) == 1
    assert system.count("## Using the pair") == 1 and note.count("## Using the pair call") == 1
    # Bound methods of one object are one callable too (as the skills plugin's are).

    class Owner:
        def __init__(self) -> None:
            self.guide = Guide("## Owned")

        async def sections(self, prompt: PromptContext) -> list[PromptSection]:
            return await self.guide(prompt)

    owner = Owner()
    provider = scripted({"reply": "ok"}, loop=True)
    app, _, _ = await make_app(provider, Offering({"one": (owner.sections, None),
                                                   "two": (owner.sections, None)}))
    system, _ = await run(app, provider)
    assert len(owner.guide.calls) == 1 and system.count("## Owned") == 1


async def test_stable_sections_stay_in_the_cached_prefix_and_volatile_ones_in_the_note(
        make_app: AppFactory) -> None:
    guide = Guide("## Using alpha", Order.SAFETY + 25)
    provider = scripted({"reply": "ok"}, loop=True)
    app, _, _ = await make_app(provider, Offering({"alpha": (guide, None)}))
    first, first_note = await run(app, provider)
    second, second_note = await run(app, provider)
    assert first == second  # byte-identical from turn to turn: the provider's cache holds
    assert "alpha call 1" in first_note and "alpha call 2" in second_note
    assert "alpha call" not in first
    # Ordered among the plugins' sections like theirs: between safety and workspace.
    assert first.index("## Safety") < first.index("## Using alpha") < first.index("## Workspace")


async def test_a_raising_or_slow_callable_is_logged_and_the_run_goes_on_without_it(
        make_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    cancelled = asyncio.Event()

    async def raising(prompt: PromptContext) -> list[PromptSection]:
        raise ValueError("guide exploded")

    async def slow(prompt: PromptContext) -> list[PromptSection]:
        try:
            await asyncio.Event().wait()  # never set: only the tool's timeout ends it
        finally:
            cancelled.set()
        return []

    async def wrong(prompt: PromptContext) -> Any:
        return ["not a section", PromptSection("fine", "## Still here")]

    good = Guide("## Using good")
    caplog.set_level(logging.ERROR)
    provider = scripted({"reply": "still fine"}, loop=True)
    app, channel, _ = await make_app(provider, Offering({
        "boom": (raising, None), "slow": (slow, 0.05), "wrong": (wrong, None),
        "good": (good, None)}))
    await channel.say("hi")
    await settle(app)
    assert channel.replies == ["still fine"]
    system = provider.requests[-1].system
    assert "## Using good" in system and "## Still here" in system
    assert cancelled.is_set()
    logged = [r.getMessage() for r in caplog.records if r.name == "roost.engine.context"]
    assert len(logged) == 3
    assert "'boom' raised ValueError" in logged[0] and "'slow' raised TimeoutError" in logged[1]
    assert "'wrong' returned str, not a PromptSection" in logged[2]
    # The tools themselves are still offered: only their guidance is left out.
    assert {"boom", "slow", "wrong", "good"} <= {t.name for t in provider.requests[-1].tools}
