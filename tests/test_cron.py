"""The cron tool and /cron: add, list and remove, ownership, the admin view, limits."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bot.config.settings import Settings
from bot.contracts.tools import Tool, ToolContext, ToolError
from bot.scheduling.scheduler import Scheduler
from bot.testing.app import ChatChannel, scripted
from plugins import cron as cron_plugin
from roost.testing import AppServices as Services
from tests.test_scheduler import T0, CronAppFactory, FakeClock, cron_app, tick

__all__ = ["cron_app"]  # the fixture, shared with test_scheduler

ADMIN = "boss"


def context(user: str = "u1", chat: str = "", chat_type: str = "direct",
            thread: str | None = None, channel: str = "test") -> ToolContext:
    """A tool context for ``user`` in ``chat`` (their direct chat by default)."""
    return ToolContext(user_id=user, channel=channel, chat_id=chat or user,
                       session_key=f"default:{channel}:{chat_type}:{chat or user}",
                       run_id="run-1", workspace=Path("/nonexistent"),
                       deadline=time.monotonic() + 30, chat_type=chat_type, thread_id=thread)


async def call(tool: Tool, ctx: ToolContext, **args: Any) -> str:
    result = await tool.execute(ctx, args)
    assert isinstance(result, str)
    return result


async def fails(tool: Tool, ctx: ToolContext, **args: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        await tool.execute(ctx, args)
    return info.value


async def say(channel: ChatChannel, text: str, *, sender: str = "u1") -> str:
    """Send a message, wait until it is answered, and return the (last) reply."""
    return (await channel.ask(text, sender=sender))[-1]


async def setup(cron_app: CronAppFactory, **settings: Any) -> tuple[
        Tool, Scheduler, ChatChannel, FakeClock]:
    clock = FakeClock()
    settings.setdefault("admins", [f"test:{ADMIN}"])
    app, channel, _, scheduler = await cron_app(scripted({"reply": "fired: {message}"},
                                                         loop=True), clock=clock, **settings)
    return app.engine.tools["cron"], scheduler, channel, clock


# -- the tool -------------------------------------------------------------------------------


async def test_the_model_schedules_a_job_that_later_runs_in_the_chat(
    cron_app: CronAppFactory,
) -> None:
    clock = FakeClock()
    add = {"action": "add", "schedule": "at in 20 minutes", "message": "Remind me to call mum",
           "name": "mum"}
    provider = scripted(
        {"match": "remind me in 20", "steps": [{"tool_calls": [{"name": "cron",
                                                                "arguments": add}]},
                                               {"reply": "Done, I'll remind you."}]},
        {"match": "call mum$", "reply": "Time to call mum!"})
    _app, channel, _, scheduler = await cron_app(provider, clock=clock)
    await say(channel, "remind me in 20 minutes to call mum")
    tool_result = next(m for m in provider.requests[-1].messages if m.role == "tool").content
    assert "Scheduled job" in tool_result and "'mum'" in tool_result
    assert "first run 2030-01-07 08:20 UTC" in tool_result and "runs once" in tool_result
    assert channel.replies == ["Done, I'll remind you."]
    [view] = await scheduler.jobs(channel="test", owner_id="u1")
    assert view.job.chat_id == "u1" and view.job.message == "Remind me to call mum"
    await tick(scheduler, clock, minutes=20)
    assert channel.replies[-1] == "Time to call mum!"
    assert await scheduler.jobs() == []


async def test_add_list_and_remove_through_the_tool(cron_app: CronAppFactory) -> None:
    tool, scheduler, _, _ = await setup(cron_app)
    ctx = context(chat="g1", chat_type="group", thread="t9")
    added = await call(tool, ctx, action="add", schedule="0 9 * * 1-5", message="standup notes",
                       name="standup", timezone="Europe/Paris")
    assert "0 9 * * 1-5 (Europe/Paris), first run 2030-01-08 09:00 CET" in added
    [view] = await scheduler.jobs()
    job = view.job
    assert (job.owner_id, job.chat_id, job.chat_type, job.thread_id) == ("u1", "g1", "group",
                                                                         "t9")
    listing = await call(tool, ctx, action="list")
    assert listing.startswith(f"{job.id} ('standup'): 0 9 * * 1-5 (Europe/Paris)")
    assert "in this chat" in listing and "'standup notes'" in listing
    removed = await call(tool, ctx, action="remove", id=job.id)
    assert removed == f"Removed job {job.id} ('standup') (0 9 * * 1-5)."
    assert await call(tool, ctx, action="list") == "The user has no scheduled jobs."


async def test_users_see_and_remove_only_their_own_jobs_admins_see_all(
    cron_app: CronAppFactory,
) -> None:
    tool, scheduler, _, _ = await setup(cron_app)
    await call(tool, context("u1"), action="add", schedule="every 1h", message="u1's secret")
    await call(tool, context("u2"), action="add", schedule="every 2h", message="u2's thing")
    [u1_job] = await scheduler.jobs(channel="test", owner_id="u1")
    u2_list = await call(tool, context("u2"), action="list")
    assert "u2's thing" in u2_list and "u1's secret" not in u2_list
    missing = await fails(tool, context("u2"), action="remove", id=u1_job.job.id)
    assert missing.code == "NOT_FOUND" and "you have no job" in str(missing)
    admin_view = await call(tool, context(ADMIN), action="list")
    assert "u1's secret" in admin_view and "u2's thing" in admin_view
    assert "owner test:u1" in admin_view and "owner test:u2" in admin_view
    await call(tool, context(ADMIN), action="remove", id=u1_job.job.id)
    assert [v.job.owner_id for v in await scheduler.jobs()] == ["u2"]


async def test_a_group_listing_hides_messages_of_jobs_from_other_chats(
    cron_app: CronAppFactory,
) -> None:
    tool, _, _, _ = await setup(cron_app)
    await call(tool, context("u1"), action="add", schedule="every 1h", message="private note")
    await call(tool, context("u1", chat="g1", chat_type="group"), action="add",
               schedule="every 1h", message="group note")
    in_group = await call(tool, context("u1", chat="g1", chat_type="group"), action="list")
    assert "group note" in in_group and "private note" not in in_group
    assert "in another chat" in in_group
    in_private = await call(tool, context("u1"), action="list")
    assert "private note" in in_private and "group note" in in_private


async def test_tool_refusals_are_clear(cron_app: CronAppFactory) -> None:
    tool, _, _, _ = await setup(cron_app, plugins={"plugins.cron": {"max_jobs_per_user": 1}})
    ctx = context()
    assert (await fails(tool, ctx)).code == "INVALID_ARGUMENT"
    assert (await fails(tool, ctx, action="pause")).code == "INVALID_ARGUMENT"
    unknown = await fails(tool, ctx, action="list", when="now")
    assert unknown.code == "INVALID_ARGUMENT" and "when" in str(unknown)
    assert (await fails(tool, ctx, action="add", message="x")).code == "INVALID_ARGUMENT"
    bad = await fails(tool, ctx, action="add", schedule="sometimes", message="x")
    assert bad.code == "INVALID_SCHEDULE" and "cron expression" in str(bad)
    short = await fails(tool, ctx, action="add", schedule="every 10s", message="x")
    assert short.code == "INTERVAL_TOO_SHORT" and "at most once every 1m" in str(short)
    await call(tool, ctx, action="add", schedule="every 1h", message="x")
    full = await fails(tool, ctx, action="add", schedule="every 2h", message="y")
    assert full.code == "LIMIT_REACHED" and "you already have 1 scheduled jobs" in str(full)
    assert (await fails(tool, ctx, action="remove")).code == "INVALID_ARGUMENT"


def test_the_tool_is_offered_only_with_a_scheduler(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert cron_plugin.roost_tools(settings, None) == []
    assert cron_plugin.roost_tools(settings, Services(sessions=None)) == []  # type: ignore[arg-type]
    fake: Any = object()
    [tool] = cron_plugin.roost_tools(settings, Services(sessions=None, scheduler=fake))  # type: ignore[arg-type]
    assert tool.name == "cron"
    schema: Mapping[str, Any] = tool.input_schema
    assert schema["required"] == ["action"] and schema["additionalProperties"] is False
    assert "UTC" in tool.description  # the default time zone the model should assume


# -- /cron --------------------------------------------------------------------------------------


async def test_cron_command_lists_and_removes_the_senders_jobs(cron_app: CronAppFactory) -> None:
    tool, scheduler, channel, _ = await setup(cron_app)
    assert (await say(channel, "/cron")).startswith("You have no scheduled jobs.")
    await call(tool, context("u1"), action="add", schedule="every 1h", message="water",
               name="hydrate")
    await call(tool, context("u2"), action="add", schedule="every 1h", message="u2 job")
    [mine] = await scheduler.jobs(channel="test", owner_id="u1")
    listing = await say(channel, "/cron")
    assert listing.startswith("Your scheduled jobs:\n")
    assert f"{mine.job.id} ('hydrate'): every 1h (UTC), next 2030-01-07 09:00 UTC" in listing
    assert "u2 job" not in listing
    [theirs] = await scheduler.jobs(channel="test", owner_id="u2")
    refused = await say(channel, f"/cron remove {theirs.job.id}")
    assert refused.startswith("Cannot remove it: you have no job")
    assert await say(channel, "/cron remove") == (
        "Usage: /cron remove ID (the ID is the first word of each line of /cron)")
    assert await say(channel, f"/cron remove {mine.job.id}") == (
        f"Removed job {mine.job.id} ('hydrate') (every 1h).")
    assert (await say(channel, "/cron")).startswith("You have no scheduled jobs.")
    assert (await say(channel, "/cron frobnicate")).startswith("Usage: /cron")


async def test_cron_all_is_for_admins(cron_app: CronAppFactory) -> None:
    tool, _, channel, _ = await setup(cron_app)
    await call(tool, context("u1"), action="add", schedule="every 1h", message="u1 job")
    await call(tool, context("u2", chat="g5", chat_type="group"), action="add",
               schedule="every 1h", message="u2 job")
    assert await say(channel, "/cron all") == (
        "/cron all is for admins only; /cron lists your own jobs.")
    everything = await say(channel, "/cron all", sender=ADMIN)
    assert everything.startswith("All scheduled jobs:\n")
    assert "owner test:u1" in everything and "owner test:u2" in everything
    assert "in test group chat g5" in everything and "u2 job" in everything
    help_text = await say(channel, "/help")
    assert "/cron [remove ID | all | approve ID TOOL...]" in help_text


async def test_jobs_listed_after_they_fire_show_the_next_run(cron_app: CronAppFactory) -> None:
    tool, scheduler, channel, clock = await setup(cron_app)
    await call(tool, context("u1"), action="add", schedule="every 1h", message="ping")
    await tick(scheduler, clock, hours=1)
    assert channel.replies[-1] == "fired: ping"
    assert T0.hour == 8
    assert "next 2030-01-07 10:00 UTC" in await say(channel, "/cron")
