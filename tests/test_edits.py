"""Edits and deletions of people's messages, applied to their runs (bot.dispatch.corrections):
a queued message takes the new text, a run that has not acted starts again on it, a run
that acted (or was answered) gets the edit as a correction (or ignores it), a mention
removed or a deletion withdraws a queued message; what the model is asked afterwards
never carries a replaced text. Here through the in-process chat channel and on two
replicas sharing PostgreSQL; tests/test_edits_platforms.py drives the real SDKs."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.contracts.llm import LLMRequest
from bot.contracts.messages import InboundMessage, MessageDeletion, MessageEdit
from bot.contracts.tools import Tool, ToolContext, ToolResult
from bot.testing.app import ChatChannel, replica_chats, scripted
from plugins.scripted_provider import ScriptedProvider
from plugins.web.search import web_search_tool
from plugins.web.searxng import SearxngBackend
from tests.conftest import AppFactory
from tests.test_approvals import APPROVE_TOUCH, Touch, is_prompt, press, touching
from tests.test_durability import crash, restart

SCHEMA = {"type": "object", "properties": {}}


class Gate:
    """Two tools that wait until :meth:`release`: ``peek`` (read-only) and ``poke`` (with
    side effects). ``entered`` is set when a call is waiting."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()
        self.calls: list[str] = []

    async def _wait(self, name: str) -> ToolResult:
        self.calls.append(name)
        self.entered.set()
        await self.open.wait()
        return ToolResult(f"{name} done")

    async def _peek(self, context: ToolContext, args: dict[str, Any]) -> ToolResult:
        return await self._wait("peek")

    async def _poke(self, context: ToolContext, args: dict[str, Any]) -> ToolResult:
        return await self._wait("poke")

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool("peek", "looks", SCHEMA, self._peek, read_only=True),
                Tool("poke", "changes", SCHEMA, self._poke)]

    async def waiting(self) -> None:
        await asyncio.wait_for(self.entered.wait(), 10)
        self.entered.clear()

    def release(self) -> None:
        self.open.set()


def calling(tool: str, match: str) -> dict[str, Any]:
    """A turn for messages matching ``match``: the model calls ``tool``, then answers
    ``ok: <the message>``."""
    return {"match": match, "steps": [{"tool_calls": [{"name": tool, "arguments": {}}]},
                                      {"reply": "ok: {message}"}]}


ANSWER = {"reply": "ok: {message}"}


def said(requests: list[LLMRequest], text: str) -> list[int]:
    """Indexes of the requests whose messages carry ``text``."""
    return [i for i, r in enumerate(requests)
            if any(text in m.content for m in r.messages)]


def edit_of(chat: ChatChannel, message_id: str, text: str, *, event: str = "",
            group: str | None = None, mentioned: bool = True) -> MessageEdit:
    sender = chat.sender
    return MessageEdit(InboundMessage(
        channel=chat.name, chat_id=group or sender, chat_type="group" if group else "direct",
        sender_id=sender, text=text, message_id=message_id, mentioned=mentioned,
        event_id=event))


async def history(app: Roost, key: str) -> list[str]:
    session = await app.store.get(key)
    return [m.content for m in session.messages]


async def test_a_queued_message_is_answered_once_with_its_edited_text(
        roost_app: Any) -> None:
    gate = Gate()
    chat = await roost_app([calling("peek", "first"), ANSWER], gate)
    await chat.say("first")
    await gate.waiting()
    await chat.say("the total is 41")  # queued behind the first run
    await chat.hand_in(edit_of(chat, "2", "the total is 42", event="e1"))
    gate.release()
    await chat.settle()
    assert chat.replies == ["ok: first", "ok: the total is 42"]
    assert said(chat.requests, "41") == []
    assert "the total is 41" not in await history(chat.app, "default:console:direct:user")
    # Durably: the inbox row holds the new text.
    entry = await chat.app.inbox.original("console", "user", "2")
    assert entry is not None and entry.message.text == "the total is 42"


async def test_a_run_that_did_not_act_starts_again_on_the_edited_text(
        roost_app: Any) -> None:
    gate = Gate()
    chat = await roost_app([calling("peek", "total")], gate, loop=True)
    await chat.say("the total is 41")
    await gate.waiting()  # the model read something: no side effect yet
    asked = len(chat.requests)
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))
    await gate.waiting()  # the new run's call
    gate.release()
    await chat.settle()
    assert chat.replies == ["ok: the total is 42"]
    assert said(chat.requests[asked:], "41") == []
    assert gate.calls == ["peek", "peek"]
    assert "the total is 41" not in await history(chat.app, "default:console:direct:user")


@pytest.mark.parametrize("policy", ["correct", "ignore"])
async def test_a_run_that_acted_gets_the_edit_as_a_correction_or_ignores_it(
        roost_app: Any, policy: str) -> None:
    gate = Gate()
    chat = await roost_app([calling("poke", "^the total"), ANSWER], gate,
                           agents={"default": {"edit_policy": policy}})
    await chat.say("the total is 41")
    await gate.waiting()  # poke may have changed something
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))  # redelivered
    gate.release()
    await chat.settle()
    assert gate.calls == ["poke"]  # never run again
    entry = await chat.app.inbox.original("console", "user", "1")
    assert entry is not None and entry.message.text == "the total is 42"  # its newest text
    if policy == "ignore":
        assert chat.replies == ["ok: the total is 41"]
        return
    assert len(chat.replies) == 2 and chat.replies[0] == "ok: the total is 41"
    last = chat.requests[-1].messages[-1].content
    assert "[Correction" in last and "the total is 41" in last and "the total is 42" in last
    # The history keeps what the model saw: the first text as answered, then the correction.
    kept = await history(chat.app, "default:console:direct:user")
    assert kept[0].endswith("the total is 41") and "[Correction" in kept[-2]


async def test_only_tools_that_change_nothing_are_read_only(roost_app: Any) -> None:
    chat = await roost_app([ANSWER])
    tools = dict(chat.app.engine.plugins.tools)
    # Offered only with a search backend configured.
    tools["web_search"] = web_search_tool(SearxngBackend("http://127.0.0.1:9"), timeout=1)
    assert sorted(name for name, tool in tools.items() if tool.read_only) == [
        "get_error_detail", "get_tool_result", "list_files", "memory_get", "memory_search",
        "read_file", "web_fetch", "web_search"]
    assert not any(tools[name].read_only for name in ("write_file", "edit_file", "sql",
                                                       "send_file", "cron"))


async def test_an_edit_while_a_call_waits_for_approval_withdraws_the_question(
        roost_app: Any) -> None:
    touch = Touch()
    turn = {**touching("/srv/x", "ok: {message}"), "match": "total"}
    chat = await roost_app([turn], touch, agents=APPROVE_TOUCH, loop=True)
    await chat.say("the total is 41")
    first = await chat.wait_for_message(is_prompt)
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))
    second = await chat.wait_for_message(lambda m: is_prompt(m) and m is not first)
    await chat.hand_in(press(chat, second, "Approve", "user"))
    await chat.settle()
    assert touch.ran == ["/srv/x"] and chat.replies[-1] == "ok: the total is 42"
    rows = await chat.app.approvals.store.recent()
    assert sorted((r.state, r.decided_by) for r in rows) == [
        ("approved", "user"), ("cancelled", "an edit of the message")]


async def test_an_answered_message_edited_twice_and_an_unknown_one(roost_app: Any) -> None:
    chat = await roost_app([ANSWER], loop=True)
    await chat.say("the total is 41")
    await chat.settle()
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))
    await chat.settle()
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e2"))  # no change
    await chat.hand_in(edit_of(chat, "99", "never received", event="e3"))
    await chat.hand_in(MessageDeletion(channel=chat.name, chat_id="user", message_ids=("1",)))
    await chat.settle()
    assert len(chat.replies) == 2
    assert "[Correction" in chat.requests[-1].messages[-1].content
    assert said(chat.requests, "never received") == []


async def test_a_mention_removed_or_a_deletion_withdraws_a_queued_message(
        roost_app: Any) -> None:
    gate = Gate()
    chat = await roost_app([calling("peek", "first"), ANSWER], gate, loop=True,
                           group_max_concurrent=1)
    await chat.say("first", group="g")
    await gate.waiting()
    await chat.say("@bot second", group="g")
    await chat.say("@bot third", group="g")
    await chat.say("@bot fourth", group="g")
    await chat.hand_in(edit_of(chat, "2", "second", group="g", mentioned=False, event="e"))
    await chat.hand_in(MessageDeletion(channel=chat.name, chat_id="g", message_ids=("3",),
                                       event_id="d"))
    gate.release()
    await chat.settle()
    assert [r.split("]: ")[-1] for r in chat.replies] == ["first", "@bot fourth"]
    assert said(chat.requests, "second") == said(chat.requests, "third") == []


async def test_a_mention_edited_away_right_away_cancels_the_run_and_frees_the_chat(
        roost_app: Any) -> None:
    gate = Gate()
    chat = await roost_app([calling("peek", "total")], gate, loop=True)
    await chat.say("@bot the total is 41", group="g")
    # Right behind it: its run is created, maybe not yet run.
    await chat.hand_in(edit_of(chat, "1", "the total is 41", group="g", mentioned=False,
                               event="e1"))
    gate.release()
    await chat.settle()
    assert chat.replies == []
    assert await chat.ask("@bot the total is 43", group="g") == [
        "ok: [user (id user)]: @bot the total is 43"]


async def test_an_edit_racing_the_runs_start_is_answered_once(roost_app: Any) -> None:
    gate = Gate()
    chat = await roost_app([calling("peek", "total")], gate, loop=True)
    # The edit comes right behind the message: its run is created but has not yet run,
    # or is starting (whichever step it reached, it has not acted).
    await chat.say("the total is 41")
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))
    gate.release()
    await chat.settle()
    entry = await chat.app.inbox.original("console", "user", "1")
    assert entry is not None and entry.message.text == "the total is 42"
    assert chat.replies == ["ok: the total is 42"]
    assert "the total is 41" not in await history(chat.app, "default:console:direct:user")


async def test_an_edit_that_arrives_before_its_message_is_applied_to_it(
        roost_app: Any) -> None:
    gate = Gate()
    chat = await roost_app([calling("peek", "total")], gate, loop=True)
    # Delivered on another path, the edit overtakes the message it edits.
    await chat.hand_in(edit_of(chat, "1", "the total is 42", event="e1"))
    await chat.say("the total is 41")
    gate.release()
    await chat.settle()
    assert chat.replies == ["ok: the total is 42"]
    assert "the total is 41" not in await history(chat.app, "default:console:direct:user")


async def test_an_edit_is_no_catch_up_cursor(make_app: AppFactory) -> None:
    # Discord catches up from each chat's newest delivery id: a snowflake, never an edit's.
    app, _, _ = await make_app(scripted(ANSWER))
    sent = InboundMessage(channel="discord", chat_id="c1", chat_type="group", sender_id="u",
                          text="41", message_id="1000", event_id="1000")
    entry = await app.inbox.add(sent, "k")
    assert entry is not None
    edited = MessageEdit(dataclasses.replace(sent, text="42", event_id="1000@2024-01-01"))
    await app.dispatcher.receive(edited)
    await app.dispatcher.drain()
    assert await app.inbox.cursors("discord", 0, limit=10) == {"c1": "1000"}


async def test_an_edit_recorded_before_a_crash_is_applied_after_the_restart(
        make_app: AppFactory) -> None:
    def model() -> ScriptedProvider:
        return scripted(calling("peek", "first"), ANSWER, loop=True)

    gate = Gate()
    app, chat, _ = await make_app(model(), gate)
    await chat.say("first")
    await gate.waiting()
    await chat.say("the total is 41")  # queued
    original = await app.inbox.original(chat.name, chat.sender, "2")
    assert original is not None
    # Recorded, and the process died before it was applied.
    await app.inbox.add(edit_of(chat, "2", "the total is 42").message, original.session_key,
                        change="edit", edit_of=original.id)
    await crash(app)
    gate = Gate()
    gate.release()
    app, chat = await restart(make_app, model(), gate)
    await chat.settle()
    assert [r.removeprefix("ok: ") for r in chat.replies] == ["first", "the total is 42"]
    assert said(chat.requests, "41") == []


@pytest.fixture
async def replicas(pg_url: str, tmp_path: Path) -> AsyncIterator[tuple[list[Roost],
                                                                        list[ChatChannel],
                                                                        Gate]]:
    gate = Gate()
    async with replica_chats(pg_url, tmp_path, lambda: scripted(calling("peek", "total"),
                                                                loop=True), gate) as (apps, chats):
        yield apps, chats, gate


async def test_an_edit_arriving_at_the_other_replica_restarts_the_run(replicas: Any) -> None:
    apps, chats, gate = replicas
    await chats[0].say("the total is 41")
    await gate.waiting()
    runner = next(i for i, c in enumerate(chats) if c.requests)
    other = 1 - runner
    asked = len(chats[runner].requests)
    await chats[other].hand_in(edit_of(chats[other], "1", "the total is 42", event="e1"))
    await gate.waiting()  # the run started again where it runs
    await chats[other].hand_in(edit_of(chats[other], "1", "the total is 42", event="e1"))
    gate.release()
    for app in apps:
        await asyncio.wait_for(app.dispatcher.drain(), 30)
    assert chats[runner].replies == ["ok: the total is 42"] and chats[other].replies == []
    assert said(chats[runner].requests[asked:], "41") == [] and chats[other].requests == []
    assert "the total is 41" not in await history(apps[0], "default:console:direct:user")


async def replied(chats: list[ChatChannel], count: int) -> None:
    """Wait until the chats were sent ``count`` messages in all."""
    async with asyncio.timeout(30):
        while sum(len(c.sent) for c in chats) < count:
            for chat in chats:
                chat.arrived.clear()
            waits = [asyncio.ensure_future(c.arrived.wait()) for c in chats]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()


async def test_an_edit_delivered_to_both_replicas_corrects_the_answer_once(
        replicas: Any) -> None:
    apps, chats, gate = replicas
    gate.release()
    await chats[0].say("the total is 41")
    await replied(chats, 1)  # by whichever replica claimed it
    for app in apps:
        await asyncio.wait_for(app.dispatcher.drain(), 30)
    # A platform retrying its delivery at the other replica: both record it at once.
    edit = edit_of(chats[0], "1", "the total is 42", event="e1")
    await asyncio.gather(chats[0].hand_in(edit), chats[1].hand_in(edit))
    await replied(chats, 2)  # the holder claims it when woken
    for app in apps:
        await asyncio.wait_for(app.dispatcher.drain(), 30)
    replies = chats[0].replies + chats[1].replies
    assert len(replies) == 2
    assert sum("[Correction" in r and "the total is 42" in r for r in replies) == 1
