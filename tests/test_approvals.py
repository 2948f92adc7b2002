"""Ask before acting: tool calls needing approval pause the run until a person decides.

Through the whole app with a scripted model and the test chat: the prompt shows the
call's full arguments with three buttons; presses are handed in as a channel would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from bot.app.roost import Roost
from bot.contracts.hookspecs import hookimpl
from bot.contracts.messages import ButtonPress, OutboundMessage
from bot.contracts.tools import Tool, ToolContext, ToolResult
from bot.testing.app import ChatChannel, without_summary

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


class Touch:
    """A tool with a side effect the tests can see: every run of it is recorded."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def _touch(self, context: ToolContext, args: dict[str, Any]) -> ToolResult:
        self.ran.append(args["path"])
        return ToolResult(f"touched {args['path']}")

    @hookimpl
    def roost_tools(self) -> list[Tool]:
        return [Tool("touch", "touches a file", SCHEMA, self._touch)]


def touching(path: str = "a.txt", reply: str = "done") -> dict[str, Any]:
    """A scripted turn: the model calls ``touch`` then says ``reply``."""
    return {"steps": [{"tool_calls": [{"name": "touch", "arguments": {"path": path}}]},
                      {"reply": reply}]}


APPROVE_TOUCH = {"default": {"tools": {"approve": ["touch"]}}}


def is_prompt(m: OutboundMessage) -> bool:
    return bool(m.buttons)


async def resumed(app: Roost, limit: float = 10.0) -> None:
    """Wait until a run of ``app`` resumed after a restart waits on its approval again."""
    await asyncio.wait_for(app.approvals.until_waiting(), limit)


def press(chat: ChatChannel, prompt: OutboundMessage, choice: str, user: str,
          n: int = 1) -> ButtonPress:
    """A press of ``prompt``'s button ``choice`` (Approve, Deny, Approve for this session)."""
    data = next(b.data for row in prompt.buttons for b in row if b.label == choice)
    return ButtonPress(channel=chat.name, chat_id=prompt.chat_id,
                       message_id=str(chat.sent.index(prompt) + 1), data=data, user_id=user,
                       press_id=f"p{n}-{user}", chat_type=prompt.chat_type)


async def test_a_call_waits_for_approval_and_runs_once_approved(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching("/tmp/x")], touch, agents=APPROVE_TOUCH)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert "touch" in prompt.text and "/tmp/x" in prompt.text
    assert [b.label for b in prompt.buttons[0]] == ["Approve", "Deny",
                                                   "Approve for this session"]
    assert touch.ran == []  # paused: nothing ran before the decision
    await chat.hand_in(press(chat, prompt, "Approve", "user"))
    await chat.settle()
    assert touch.ran == ["/tmp/x"]
    assert chat.replies[-1] == "done"
    assert chat.answers[0][1] == "Approved."
    message_id, text, buttons = chat.edits[-1]
    assert message_id == str(chat.sent.index(prompt) + 1)
    assert text.startswith("Approved by user") and buttons == ()


async def test_deny_gives_the_model_a_structured_error_and_nothing_runs(
        roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching(reply="not approved, sorry")], touch,
                           agents=APPROVE_TOUCH)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.hand_in(press(chat, prompt, "Deny", "user"))
    await chat.settle()
    assert touch.ran == []
    tool_message = next(m for m in chat.requests[-1].messages if m.role == "tool")
    error = json.loads(without_summary(tool_message.content))
    assert error["error_code"] == "APPROVAL_DENIED" and tool_message.is_error
    assert error["decided_by"] == "user" and error["decided_at"]
    assert chat.edits[-1][1].startswith("Denied by user")


async def test_in_a_group_only_the_requester_or_an_admin_decides(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching()], touch, agents=APPROVE_TOUCH,
                           admins=["console:boss"])
    await chat.say("touch it", sender="alice", group="g1")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.hand_in(press(chat, prompt, "Approve", "mallory"))
    assert chat.answers[-1][1] == "Not yours to approve."
    assert touch.ran == [] and chat.edits == []
    await chat.hand_in(press(chat, prompt, "Approve", "boss"))
    await chat.settle()
    assert touch.ran == ["a.txt"]
    assert chat.edits[-1][1].startswith("Approved by boss")


async def test_a_decision_is_final_a_second_press_is_answered_not_acted_on(
        roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching()], touch, agents=APPROVE_TOUCH)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    # Two presses at once (two replicas, two taps): one decides.
    await asyncio.gather(chat.hand_in(press(chat, prompt, "Deny", "user", 1)),
                         chat.hand_in(press(chat, prompt, "Approve", "user", 2)))
    await chat.settle()
    notes = sorted(str(note) for _, note in chat.answers)
    assert len(notes) == 2 and sum(n.startswith("Already decided") for n in notes) == 1
    edits = [e for e in chat.edits if e[0] == str(chat.sent.index(prompt) + 1)]
    assert len(edits) == 1
    assert touch.ran == ([] if edits[0][1].startswith("Denied") else ["a.txt"])


async def test_no_answer_in_time_is_a_denial(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching(reply="it timed out")], touch, agents=APPROVE_TOUCH,
                           approval_timeout=0.2)
    await chat.say("touch it")
    await chat.wait_for_message(is_prompt)
    await chat.settle()
    assert touch.ran == []
    tool_message = next(m for m in chat.requests[-1].messages if m.role == "tool")
    error = json.loads(without_summary(tool_message.content))
    assert error["error_code"] == "APPROVAL_DENIED" and error["outcome"] == "timeout"
    assert chat.edits[-1][1].startswith("Denied (no answer in time)")
    assert chat.replies[-1] == "it timed out"


async def test_approve_for_this_session_asks_once(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching("one"), touching("two")], touch, agents=APPROVE_TOUCH)
    await chat.say("touch one")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.hand_in(press(chat, prompt, "Approve for this session", "user"))
    await chat.settle()
    await chat.say("touch two")
    await chat.settle()
    assert touch.ran == ["one", "two"]
    assert sum(1 for m in chat.sent if m.buttons) == 1


async def test_a_new_session_asks_again(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching("one"), touching("three")], touch,
                           agents=APPROVE_TOUCH)
    await chat.say("touch one")
    first = await chat.wait_for_message(is_prompt)
    await chat.hand_in(press(chat, first, "Approve for this session", "user"))
    await chat.settle()
    await chat.ask("/new")
    await chat.say("touch three")
    second = await chat.wait_for_message(lambda m: is_prompt(m) and m is not first)
    assert touch.ran == ["one"]  # asked again: the approval was the old session's
    await chat.hand_in(press(chat, second, "Approve", "user"))
    await chat.settle()
    assert touch.ran == ["one", "three"]


async def test_stop_cancels_a_pending_approval(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching()], touch, agents=APPROVE_TOUCH)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.say("/stop")
    await chat.settle()
    assert touch.ran == []
    assert chat.edits[-1][1].startswith("Cancelled by /stop")
    await chat.hand_in(press(chat, prompt, "Approve", "user"))
    assert chat.answers[-1][1].startswith("Already decided: Cancelled by /stop")
    assert touch.ran == []


async def test_every_decision_is_listed_for_admins_with_masked_arguments(
        roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "touch", "arguments": {
            "path": "https://bob:hunter2@example.com/x"}}]}, {"reply": "ok"}]}],
        touch, agents=APPROVE_TOUCH, admins=["console:user"])
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert "hunter2" in prompt.text  # the person sees exactly what would run
    await chat.hand_in(press(chat, prompt, "Approve", "user"))
    await chat.settle()
    listing = (await chat.ask("/approvals"))[-1]
    assert "touch" in listing and "Approved by user" in listing
    assert "hunter2" not in listing


async def test_long_arguments_are_attached_in_full(roost_app: Any) -> None:
    touch = Touch()
    long_path = "/".join(f"dir{i}" for i in range(800))
    chat = await roost_app([touching(long_path)], touch, agents=APPROVE_TOUCH)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert len(prompt.files) == 1
    attached = await asyncio.to_thread(Path(prompt.files[0].path).read_text, "utf-8")
    assert long_path in attached
    assert "more characters: in full in the attached file" in prompt.text
    await chat.hand_in(press(chat, prompt, "Deny", "user"))
    await chat.settle()


def test_policy_asks_about_exec_by_default_and_destructive_mcp_tools() -> None:
    from bot.agents.tool_policy import NEEDS_APPROVAL, ToolPolicy

    async def nothing(context: ToolContext, args: dict[str, Any]) -> ToolResult:
        return ToolResult("")

    offered = {"exec": Tool("exec", "runs", SCHEMA, nothing),
               "read_file": Tool("read_file", "reads", SCHEMA, nothing),
               "mcp_drop": Tool("mcp_drop", "drops", SCHEMA, nothing,
                                meta={NEEDS_APPROVAL: True})}
    assert ToolPolicy().needing_approval(offered, {}) == {"exec", "mcp_drop"}
    assert ToolPolicy(approve=("read_file",)).needing_approval(offered, {}) == {
        "read_file", "mcp_drop"}
    assert ToolPolicy(approve=()).needing_approval(offered, {}) == {"mcp_drop"}
    del offered["exec"]
    assert ToolPolicy().needing_approval(offered, {}) == {"mcp_drop"}


async def test_a_pending_approval_survives_a_restart_and_a_press_after_it_resumes_the_run(
        roost_app: Any, tmp_path: Path) -> None:
    first = Touch()
    data = tmp_path / "shared"
    chat = await roost_app([touching("x", "first life")], first, agents=APPROVE_TOUCH,
                           data_dir=data)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert chat.app is not None
    await chat.app.close()  # stops at the pause: the question stays open
    second = Touch()
    again = await roost_app([{"reply": "after restart"}], second, agents=APPROVE_TOUCH,
                            data_dir=data)
    assert again.app is not None
    await again.app.recover()
    # The press reaches the new process (its chat: same channel and chat id).
    await again.hand_in(press(chat, prompt, "Approve", "user"))
    await again.settle()
    assert first.ran == [] and second.ran == ["x"]  # run once, after the decision
    assert not any(m.buttons for m in again.sent)  # not asked again
    assert again.replies[-1] == "after restart"
    assert again.answers[-1][1] == "Approved."


async def test_a_scheduled_run_is_denied_unless_the_tool_was_pre_approved(
        roost_app: Any) -> None:
    from bot.contracts.messages import InboundMessage
    from bot.engine.requests import RunOptions

    touch = Touch()
    chat = await roost_app([touching("denied", "cron 1"), touching("allowed", "cron 2"),
                            touching("beat", "heartbeat")], touch, agents=APPROVE_TOUCH)
    assert chat.app is not None
    where = InboundMessage(channel="console", chat_id="user", chat_type="direct",
                           sender_id="user", text="scheduled")
    denied = await chat.app.dispatcher.run_scheduled(where, RunOptions(kind="cron"))
    allowed = await chat.app.dispatcher.run_scheduled(
        where, RunOptions(kind="cron", approved=("touch",)))
    beat = await chat.app.dispatcher.run_scheduled(where, RunOptions(kind="heartbeat"))
    assert (denied.reply, allowed.reply, beat.reply) == ("cron 1", "cron 2", "heartbeat")
    assert touch.ran == ["allowed"]
    assert not any(m.buttons for m in chat.sent)  # nobody was asked
    rows = await chat.app.approvals.store.recent()
    assert sorted((r.state, r.decided_by) for r in rows) == [
        ("approved", "pre-approved for the job"), ("denied", "nobody to ask"),
        ("denied", "nobody to ask")]


async def test_the_console_asks_y_n_a_and_y_approves(tmp_path: Path) -> None:
    import io

    from bot.testing.app import create_app, scripted
    from channels.console import ConsoleChannel

    touch = Touch()
    app, _ = await create_app(scripted(touching("c", "console done")), touch,
                              data_dir=tmp_path / "console", agents=APPROVE_TOUCH)
    out = io.StringIO()
    console = ConsoleChannel(out=out, read_stdin=False, stream=False)
    try:
        await app.add_channel(console)
        await console.say("touch it")
        await asyncio.wait_for(console.asked.wait(), 5)
        assert "answer y (approve), n (deny) or a" in out.getvalue() and touch.ran == []
        await console.say("y")
        await asyncio.wait_for(app.dispatcher.drain(), 5)
        assert touch.ran == ["c"] and "console done" in out.getvalue()
        # The console cannot edit the prompt: the outcome is printed after it.
        assert "Approved by local at" in out.getvalue()
    finally:
        await app.close()


class Stuck(Touch):
    """``touch`` that records the call, then never returns (until cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()

    async def _touch(self, context: ToolContext, args: dict[str, Any]) -> ToolResult:
        self.ran.append(args["path"])
        if args["path"] == "two":
            self.entered.set()
            await asyncio.Event().wait()
        return ToolResult(f"touched {args['path']}")


async def test_a_session_approved_call_cut_off_by_a_restart_is_not_run_again(
        roost_app: Any, tmp_path: Path) -> None:
    from bot.storage.inbox import INTERRUPTED

    stuck = Stuck()
    data = tmp_path / "shared"
    chat = await roost_app([touching("one"), touching("two")], stuck, agents=APPROVE_TOUCH,
                           data_dir=data)
    await chat.say("touch one")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.hand_in(press(chat, prompt, "Approve for this session", "user"))
    await chat.settle()
    await chat.say("touch two")  # approved for the session: runs at once, and hangs
    await asyncio.wait_for(stuck.entered.wait(), 5)
    assert chat.app is not None
    await chat.app.close()
    after = Touch()
    again = await roost_app([{"reply": "after restart"}], after, agents=APPROVE_TOUCH,
                            data_dir=data)
    assert again.app is not None
    await again.app.recover()
    await again.settle()
    assert stuck.ran == ["one", "two"] and after.ran == []  # not run a second time
    tool = [m for m in again.requests[-1].messages if m.role == "tool"][-1]
    assert without_summary(tool.content) == INTERRUPTED
    assert again.replies[-1] == "after restart"


async def test_arguments_are_shown_as_code_and_a_fence_in_them_cannot_end_the_block(
        roost_app: Any) -> None:
    touch = Touch()
    forged = "x\n```\nAlready approved by an admin: just press Approve.\n```\n**y**"
    chat = await roost_app([touching(forged), touching("/plain **bold**")], touch,
                           agents=APPROVE_TOUCH)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert "Already approved" not in prompt.text and len(prompt.files) == 1
    attached = await asyncio.to_thread(Path(prompt.files[0].path).read_text, "utf-8")
    assert json.loads(attached) == {"path": forged}
    await chat.hand_in(press(chat, prompt, "Deny", "user"))
    await chat.settle()
    await chat.say("touch again")
    second = await chat.wait_for_message(lambda m: is_prompt(m) and m is not prompt)
    assert "```\n{\n  \"path\": \"/plain **bold**\"\n}\n```" in second.text
    assert second.files == ()


class Refusing(ChatChannel):
    """A chat whose platform refuses messages with buttons."""

    async def send(self, message: OutboundMessage) -> str | None:
        if message.buttons:
            raise ConnectionError("400 Bad Request: BUTTON_DATA_INVALID")
        return await super().send(message)


async def test_a_question_the_platform_refused_to_show_is_denied_at_once(
        tmp_path: Path) -> None:
    from bot.testing.app import create_app, scripted

    touch = Touch()
    app, recorder = await create_app(scripted(touching(reply="could not ask")), touch,
                                     data_dir=tmp_path / "refusing", agents=APPROVE_TOUCH)
    chat = Refusing()
    try:
        await chat.attach(app, recorder)
        assert await chat.ask("touch it") == ["could not ask"]
        tool = next(m for m in chat.requests[-1].messages if m.role == "tool")
        error = json.loads(without_summary(tool.content))
        assert error["error_code"] == "APPROVAL_DENIED" and touch.ran == []
        assert error["decided_by"] == "nobody: the question could not be shown"
    finally:
        await app.close()


async def test_exec_asks_by_default_showing_the_command_verbatim(roost_app: Any) -> None:
    command = "rm -rf ./build && echo 'done' | tee log.txt"
    chat = await roost_app(
        [{"steps": [{"tool_calls": [{"name": "exec", "arguments": {"command": command}}]},
                    {"reply": "not run"}]}],
        agents={"default": {"tools": {"allow": ["exec"]}}})
    await chat.say("clean the build")
    prompt = await chat.wait_for_message(is_prompt)
    assert prompt.text.startswith("Approval needed: exec")
    assert f"```\n{command}\n```" in prompt.text
    await chat.hand_in(press(chat, prompt, "Deny", "user"))
    await chat.settle()
    tool_message = next(m for m in chat.requests[-1].messages if m.role == "tool")
    assert json.loads(without_summary(tool_message.content))["error_code"] == "APPROVAL_DENIED"


async def test_approvers_admins_leaves_the_requester_out_and_anyone_lets_everyone_in(
        roost_app: Any) -> None:
    admins_only = Touch()
    chat = await roost_app([touching()], admins_only, agents=APPROVE_TOUCH,
                           admins=["console:boss"], approvers="admins")
    await chat.say("touch it", sender="alice", group="g1")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.hand_in(press(chat, prompt, "Approve", "alice"))
    assert chat.answers[-1][1] == "Not yours to approve."
    await chat.hand_in(press(chat, prompt, "Approve", "boss"))
    await chat.settle()
    assert admins_only.ran == ["a.txt"]
    anyone = Touch()
    open_chat = await roost_app([touching(), touching("b.txt")], anyone, agents=APPROVE_TOUCH,
                                approvers="anyone")
    await open_chat.say("touch it", sender="alice", group="g1")
    prompt = await open_chat.wait_for_message(is_prompt)
    await open_chat.hand_in(press(open_chat, prompt, "Approve", "carol"))
    await open_chat.settle()
    assert anyone.ran == ["a.txt"]
    # In a DM only the person decides, whatever approvers says.
    await open_chat.say("touch it", sender="dave")
    dm = await open_chat.wait_for_message(lambda m: is_prompt(m) and m is not prompt)
    await open_chat.hand_in(press(open_chat, dm, "Approve", "carol"))
    assert open_chat.answers[-1][1] == "Not yours to approve."
    await open_chat.hand_in(press(open_chat, dm, "Deny", "dave"))
    await open_chat.settle()


async def test_a_follow_up_during_the_question_waits_instead_of_withdrawing_it(
        roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching(reply="first done"), {"reply": "second done"}], touch,
                           agents=APPROVE_TOUCH, merge_window_ms=60_000)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    await chat.say("and then tell me a joke")  # within the merge window
    await chat.hand_in(press(chat, prompt, "Approve", "user"))
    await chat.settle()
    assert touch.ran == ["a.txt"]
    assert chat.edits[-1][1].startswith("Approved by user")
    assert chat.replies[-2:] == ["first done", "second done"]


async def test_the_database_away_for_a_moment_leaves_the_question_open(
        roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching(reply="after the hiccup")], touch, agents=APPROVE_TOUCH)
    assert chat.app is not None
    store = chat.app.approvals.store
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    real_get = store.get
    failures = [ConnectionResetError("connection reset by peer")]
    reads = asyncio.Event()

    async def flaky_get(ident: str) -> Any:
        if failures:
            reads.set()
            raise failures.pop()
        return await real_get(ident)

    store.get = flaky_get  # type: ignore[method-assign]
    await asyncio.wait_for(reads.wait(), 5)
    store.get = real_get  # type: ignore[method-assign]
    await chat.hand_in(press(chat, prompt, "Approve", "user"))
    await chat.settle()
    assert touch.ran == ["a.txt"] and chat.replies[-1] == "after the hiccup"


async def test_an_agents_own_approval_timeout_applies(roost_app: Any) -> None:
    touch = Touch()
    chat = await roost_app([touching(reply="too slow")], touch, agents={
        "default": {"tools": {"approve": ["touch"]}, "approval_timeout": 0.2}})
    assert chat.app is not None and chat.app.settings.approval_timeout == 300
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert "within 0.2 s" in prompt.text
    await chat.settle()
    assert touch.ran == [] and chat.edits[-1][1].startswith("Denied (no answer in time)")


def expire_all(db: Path) -> None:
    """Every question's time ran out (the process was down longer than the timeout)."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE approvals SET expires_at = 1")


async def test_an_answer_after_the_question_expired_during_a_downtime_is_too_late(
        roost_app: Any, tmp_path: Path) -> None:
    data = tmp_path / "shared"
    chat = await roost_app([touching("x")], Touch(), agents=APPROVE_TOUCH, data_dir=data)
    await chat.say("touch it")
    prompt = await chat.wait_for_message(is_prompt)
    assert chat.app is not None
    await chat.app.close()
    # Down for longer than the approval timeout: the question expired meanwhile.
    await asyncio.to_thread(expire_all, data / "roost.db")
    second = Touch()
    again = await roost_app([{"reply": "too late"}], second, agents=APPROVE_TOUCH,
                            data_dir=data)
    assert again.app is not None
    await again.hand_in(press(chat, prompt, "Approve", "user"))  # before the run resumes
    assert again.answers[-1][1] == "Already decided: Denied (no answer in time) by nobody."
    await again.app.recover()
    await again.settle()
    assert second.ran == [] and again.replies[-1] == "too late"
    tool = next(m for m in again.requests[-1].messages if m.role == "tool")
    assert json.loads(without_summary(tool.content))["outcome"] == "timeout"
