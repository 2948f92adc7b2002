"""Approvals on a channel without buttons (email, Matrix...): the prompt says how to answer
in text, and "approve ID" / "deny ID" / "approve ID session" are decided by a press's
rules (who may, once, in time) and never reach the model as a message."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from bot.app.roost import Roost
from bot.contracts.channel import Capabilities
from bot.contracts.messages import OutboundMessage
from bot.testing.app import ChatChannel, create_app, scripted
from tests.test_approvals import APPROVE_TOUCH, Touch, touching


class TextChat(ChatChannel):
    """A chat that can neither show buttons nor edit a message sent (like email)."""

    capabilities = Capabilities()

    async def edit(self, chat_id: str, message_id: str, text: str, buttons: object = (), *,
                   thread_id: str | None = None) -> bool:
        return False


def is_prompt(m: OutboundMessage) -> bool:
    return m.text.startswith("Approval needed")


def code_of(prompt: OutboundMessage) -> str:
    match = re.search(r'"approve ([0-9a-f]+)"', prompt.text)
    assert match is not None, prompt.text
    return match.group(1)


@pytest.fixture
async def chats(tmp_path: Path) -> AsyncIterator[list[tuple[Roost, TextChat, Touch]]]:
    made: list[tuple[Roost, TextChat, Touch]] = []
    yield made
    for app, _, _ in made:
        await app.close()


async def text_chat(made: list[tuple[Roost, TextChat, Touch]], tmp_path: Path,
                    turns: list[dict[str, object]], **settings: object) -> tuple[TextChat,
                                                                                 Touch]:
    touch = Touch()
    app, recorder = await create_app(scripted(*turns), touch,
                                     data_dir=tmp_path / f"text{len(made)}",
                                     agents=APPROVE_TOUCH, **settings)
    chat = TextChat()
    made.append((app, chat, touch))
    await chat.attach(app, recorder)
    return chat, touch


async def test_the_prompt_says_how_to_answer_and_a_text_answer_decides_once(
        chats: list[tuple[Roost, TextChat, Touch]], tmp_path: Path) -> None:
    await answered_in_text(chats, tmp_path)


async def test_a_text_answer_on_postgresql(chats: list[tuple[Roost, TextChat, Touch]],
                                           tmp_path: Path, pg_url: str) -> None:
    await answered_in_text(chats, tmp_path, database_url=pg_url)


async def answered_in_text(chats: list[tuple[Roost, TextChat, Touch]], tmp_path: Path,
                           **settings: object) -> None:
    """The prompt says how to answer; "approve ID" decides, once; the answers never reach
    the model, and words like one in a chat asking nothing do."""
    chat, touch = await text_chat(chats, tmp_path, [touching("/srv/t", "done"),
                                                    {"reply": "what shall I approve?"}],
                                  **settings)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    code = code_of(prompt)
    assert prompt.buttons == () and "/srv/t" in prompt.text
    assert f'"deny {code}"' in prompt.text and f'"approve {code} session"' in prompt.text
    assert touch.ran == []
    await chat.say(f"Approve {code.upper()}.")
    await chat.settle()
    assert touch.ran == ["/srv/t"] and chat.replies[-2:] == ["Approved.", "done"]
    await chat.say(f"deny {code}")  # final: answered, not acted on
    await chat.settle()
    assert chat.replies[-1] == "Already decided: Approved by user."
    assert touch.ran == ["/srv/t"]
    # The answers were decisions, never messages the model was asked about.
    assert [m.content for m in chat.requests[-1].messages if m.role == "user"] == ["touch it"]
    # With no question open in the chat, words that look like an answer are a message.
    assert await chat.ask("approve c0ffee") == ["what shall I approve?"]


async def test_in_a_group_someone_else_is_refused_and_an_unknown_id_is_said(
        chats: list[tuple[Roost, TextChat, Touch]], tmp_path: Path) -> None:
    chat, touch = await text_chat(chats, tmp_path, [touching(reply="refused")],
                                  admins=["console:boss"])
    await chat.say("touch it", sender="alice", group="g1")
    code = code_of(await chat.wait_for_message(is_prompt))
    await chat.say(f"approve {code}", sender="mallory", group="g1")
    await chat.say("approve 0000000", sender="alice", group="g1")
    await chat.say(f"deny {code}", sender="boss", group="g1")
    await chat.settle()
    assert chat.replies[-4:-1] == ["Not yours to approve.",
                                   "This approval request is unknown here.", "Denied."]
    assert touch.ran == [] and chat.replies[-1] == "refused"


async def test_approve_for_the_session_in_text_and_no_answer_in_time_is_told(
        chats: list[tuple[Roost, TextChat, Touch]], tmp_path: Path) -> None:
    chat, touch = await text_chat(
        chats, tmp_path, [touching("one"), touching("two"), touching("three", "late")],
        approval_timeout=0.3)
    await chat.say("touch one")
    code = code_of(await chat.wait_for_message(is_prompt))
    await chat.say(f"approve {code} session")
    await chat.settle()
    await chat.ask("touch two")  # approved for the session: not asked again
    assert touch.ran == ["one", "two"]
    assert sum(is_prompt(m) for m in chat.sent) == 1
    await chat.ask("/new")
    await chat.ask("touch three")  # a new session asks again; nobody answers
    assert touch.ran == ["one", "two"]
    # The prompt cannot be edited, so the outcome is a notice of its own.
    assert chat.replies[-2].startswith("Denied (no answer in time) by nobody")
    assert chat.replies[-1] == "late"


async def test_an_id_prefix_another_approval_of_the_chat_has_is_shown_longer(
        chats: list[tuple[Roost, TextChat, Touch]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from bot.storage import approvals as approval_rows

    ids = iter([uuid.UUID("abcdef00" + "0" * 24), uuid.UUID("abcdef11" + "1" * 24)])
    # The approvals' own ids only (their module's name for uuid), nobody else's.
    monkeypatch.setattr(approval_rows, "uuid", SimpleNamespace(uuid4=lambda: next(ids)))
    chat, touch = await text_chat(chats, tmp_path, [touching("one"), touching("two")])
    await chat.say("touch one")
    assert code_of(await chat.wait_for_message(is_prompt)) == "abcdef"
    await chat.ask("deny abcdef")
    await chat.say("touch two")
    second = await chat.wait_for_message(lambda m: is_prompt(m) and "two" in m.text)
    assert code_of(second) == "abcdef11"  # "abcdef" names the first one too
    await chat.ask("approve abcdef11")
    assert touch.ran == ["two"]
