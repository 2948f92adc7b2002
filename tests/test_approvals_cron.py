"""Cron runs have nobody to ask: a tool needing approval is denied unless an admin
pre-approved it for the job (``/cron approve``), which ``/cron all`` shows."""

from __future__ import annotations

import json

from bot.testing.app import scripted, without_summary
from tests.test_approvals import APPROVE_TOUCH, Touch
from tests.test_cron import say
from tests.test_scheduler import CronAppFactory, FakeClock, add, cron_app, tick
from tests.test_ui_ops_pages import Start, seed, start_fixture

__all__ = ["cron_app", "start_fixture"]  # the fixtures


def touching_on(message: str) -> dict[str, object]:
    return {"match": message, "steps": [
        {"tool_calls": [{"name": "touch", "arguments": {"path": message}}]},
        {"reply": "cron run over"}]}


async def test_a_cron_run_is_denied_until_an_admin_pre_approves_the_tool(
        cron_app: CronAppFactory) -> None:
    touch = Touch()
    clock = FakeClock()
    provider = scripted(touching_on("nightly"), {"reply": "ok"}, loop=True)
    _, channel, _, scheduler = await cron_app(provider, touch, clock=clock,
                                              agents=APPROVE_TOUCH, admins=["test:boss"])
    view = await add(scheduler, "every 1 hour", "nightly")
    await tick(scheduler, clock, hours=1)
    assert touch.ran == []
    tool = next(m for m in provider.requests[-1].messages if m.role == "tool")
    error = json.loads(without_summary(tool.content))
    assert (error["error_code"], error["decided_by"]) == ("APPROVAL_DENIED", "nobody to ask")
    refused = await say(channel, f"/cron approve {view.job.id} touch")
    assert refused == "Only admins pre-approve tools for a job."
    approved = await say(channel, f"/cron approve {view.job.id} touch", sender="boss")
    assert "touch pre-approved" in approved
    assert "pre-approved: touch" in await say(channel, "/cron all", sender="boss")
    await tick(scheduler, clock, hours=1)
    assert touch.ran == ["nightly"]
    assert not any(m.buttons for m in channel.sent)  # nobody was ever asked


async def test_the_control_ui_jobs_page_shows_the_pre_approved_tools(start: Start) -> None:
    ui = await start()
    job_id = await seed(ui)
    scheduler = ui.app.services.scheduler
    assert scheduler is not None
    assert "pre-approved" not in await ui.page("viewer", "/ui/jobs")
    await scheduler.approve(job_id, ["exec", "<b>x</b>"])
    page = await ui.page("viewer", "/ui/jobs")
    assert "pre-approved: exec, &lt;b&gt;x&lt;/b&gt;" in page
