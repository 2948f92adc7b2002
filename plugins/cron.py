"""Built-in plugin: users' scheduled jobs, through the ``cron`` tool and ``/cron``.

The ``cron`` tool (offered only when ``services.scheduler`` is set) lets the
model add, list and remove jobs for the user it is talking to:

- ``{action: "add", schedule, message, name?, timezone?}``: ``schedule`` is a
  5-field cron expression, ``every <duration>`` or ``at <time>`` (see
  :mod:`bot.scheduling.cron`); ``message`` is the instruction the model gets
  when the job fires, in this chat, as this user;
- ``{action: "list"}``: the user's jobs (admins: every job);
- ``{action: "remove", id}``: the user's own job (admins: any).

``/cron`` lists the sender's jobs, ``/cron remove ID`` removes one, and
``/cron all`` (admins) lists every job. In a group chat the messages of jobs
created in other chats are not shown: they may come from a private chat.
Failure codes: ``INVALID_ARGUMENT`` plus those of :class:`roost.JobError`,
and ``DATABASE_ERROR``.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field

from roost import (
    ChatType,
    Command,
    CommandContext,
    JobError,
    JobListing,
    SchedulerView,
    Services,
    Settings,
    Tool,
    ToolContext,
    ToolError,
    hookimpl,
)

log = logging.getLogger("roost.plugins.cron")

PREVIEW_CHARS = 80
"""Characters of a job's message shown in a listing."""

_ACTIONS = ("add", "list", "remove")
_KEYS = ("action", "schedule", "message", "name", "id", "timezone")

PLUGIN_NAME = "plugins.cron"


class CronConfig(BaseModel):
    """``[plugins."plugins.cron"]``: limits on users' scheduled jobs (``cron_*`` before)."""

    model_config = ConfigDict(extra="forbid")

    max_jobs_per_user: int = Field(20, ge=1)
    """Scheduled jobs one user may have."""
    min_interval_seconds: int = Field(60, ge=1)
    """The shortest interval a recurring job may have."""


@hookimpl
def roost_plugin_config_model() -> type[CronConfig]:
    """The ``[plugins."plugins.cron"]`` table."""
    return CronConfig


@hookimpl
def roost_tools(settings: Settings, services: Services | None) -> list[Tool]:
    """The ``cron`` tool, when the service runs a scheduler."""
    if services is None or services.scheduler is None:
        return []
    config = CronConfig.model_validate(settings.plugins.get(PLUGIN_NAME) or {})
    return [_cron_tool(services.scheduler, settings, config)]


@hookimpl
def roost_commands(settings: Settings) -> list[Command]:
    """``/cron``: list and remove your scheduled jobs."""
    return [Command("cron", "your scheduled jobs; remove one; all jobs and pre-approvals "
                    "(admins)", _cron_command,
                    usage="[remove ID | all | approve ID TOOL...]")]


# -- listing ------------------------------------------------------------------------------


def _when(view: JobListing) -> str:
    if view.next_fire is None:
        return "not scheduled in this process"
    return view.next_fire.astimezone(ZoneInfo(view.job.timezone)).strftime("%Y-%m-%d %H:%M %Z")


def format_job(view: JobListing, *, channel: str, chat_id: str, chat_type: str,
               show_owner: bool = False) -> str:
    """One line about a job, as the tool and ``/cron`` show it.

    The message is left out in a group chat for jobs created elsewhere, which
    may be private reminders from a direct chat.
    """
    job = view.job
    line = f"{job.label}: {job.schedule} ({job.timezone}), next {_when(view)}"
    if job.kind == "system":
        return f"{line} [system job]"
    here = job.channel == channel and job.chat_id == chat_id
    if here:
        line += ", in this chat"
    elif show_owner:
        line += f", in {job.channel} {job.chat_type} chat {job.chat_id}"
    else:
        line += ", in another chat"
    if show_owner:
        line += f", owner {job.channel}:{job.owner_id}"
    if job.approved_tools:
        line += f", pre-approved: {', '.join(job.approved_tools)}"
    if here or chat_type != "group":
        text = job.message if len(job.message) <= PREVIEW_CHARS else (
            job.message[:PREVIEW_CHARS] + "...")
        line += f" — {text!r}"
    return line


def format_jobs(views: Sequence[JobListing], *, channel: str, chat_id: str, chat_type: str,
                show_owner: bool = False, empty: str = "No scheduled jobs.") -> str:
    """Several jobs, one per line, or ``empty``."""
    if not views:
        return empty
    return "\n".join(format_job(v, channel=channel, chat_id=chat_id, chat_type=chat_type,
                                show_owner=show_owner) for v in views)


# -- the tool -----------------------------------------------------------------------------


def _cron_tool(scheduler: SchedulerView, settings: Settings, config: CronConfig) -> Tool:
    async def cron(context: ToolContext, args: Mapping[str, Any]) -> str:
        if not isinstance(args, Mapping):
            raise ToolError("arguments must be a JSON object", code="INVALID_ARGUMENT")
        unknown = sorted(str(k) for k in args if k not in _KEYS)
        if unknown:
            raise ToolError(f"unknown argument(s) {', '.join(unknown)}; expected "
                            f"{', '.join(_KEYS)}", code="INVALID_ARGUMENT")
        action = args.get("action")
        if action not in _ACTIONS:
            raise ToolError(f"'action' must be one of {', '.join(_ACTIONS)}",
                            code="INVALID_ARGUMENT")
        admin = settings.is_admin(context.channel, context.user_id)
        try:
            if action == "add":
                return await _add(scheduler, context, args, config)
            if action == "list":
                return await _list(scheduler, context, admin)
            return await _remove(scheduler, context, _text(args, "id"), admin)
        except JobError as exc:
            raise ToolError(str(exc), code=exc.code) from None
        except (sqlite3.Error, ValueError) as exc:
            log.exception("cron %s failed", action)
            raise ToolError(f"could not read or write the job store: {exc}",
                            code="DATABASE_ERROR", retryable=True) from exc

    return Tool(
        name="cron",
        description=(
            "Add, list or remove the user's scheduled jobs. When a job fires you get its "
            "message as an instruction from this user, in this chat, and your reply is posted "
            "here (NO_REPLY posts nothing). schedule: a cron expression ('0 9 * * 1-5'), "
            "'every 2h', or once: 'at 2025-03-01T09:00', 'at 18:30', 'at in 20 minutes'. "
            f"Times are {settings.timezone} unless timezone gives an IANA zone."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(_ACTIONS)},
                "schedule": {"type": "string"},
                "message": {"type": "string", "description": "What to do when it fires."},
                "name": {"type": "string"},
                "timezone": {"type": "string"},
                "id": {"type": "string", "description": "Job to remove."},
            },
            "required": ["action"],
            "additionalProperties": False,
        },
        execute=cron,
    )


def _text(args: Mapping[str, Any], name: str, *, required: bool = True) -> str:
    value = args.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise ToolError(f"'{name}' must be a non-empty string", code="INVALID_ARGUMENT")
    return value


def _chat_type(value: str) -> ChatType:
    return "group" if value == "group" else "direct"


async def _add(scheduler: SchedulerView, context: ToolContext, args: Mapping[str, Any],
               config: CronConfig) -> str:
    view = await scheduler.add(
        owner_id=context.user_id, channel=context.channel, chat_id=context.chat_id,
        chat_type=_chat_type(context.chat_type), thread_id=context.thread_id,
        schedule=_text(args, "schedule"), message=_text(args, "message"),
        name=_text(args, "name", required=False),
        timezone=_text(args, "timezone", required=False) or None,
        max_jobs=config.max_jobs_per_user, min_interval=config.min_interval_seconds)
    job = view.job
    once = " It runs once and is then deleted." if job.schedule.startswith("at ") else ""
    return (f"Scheduled job {job.label}: {job.schedule} ({job.timezone}), first run "
            f"{_when(view)}, in this chat.{once} Remove it with action remove and id "
            f"{job.id}, or /cron remove {job.id}.")


async def _list(scheduler: SchedulerView, context: ToolContext, admin: bool) -> str:
    views = await (scheduler.all_jobs() if admin else scheduler.jobs(
        channel=context.channel, owner_id=context.user_id))
    return format_jobs(views, channel=context.channel, chat_id=context.chat_id,
                       chat_type=context.chat_type, show_owner=admin,
                       empty="No scheduled jobs." if admin else "The user has no scheduled jobs.")


async def _remove(scheduler: SchedulerView, context: ToolContext, job_id: str, admin: bool) -> str:
    job = await scheduler.remove(job_id, channel=context.channel, owner_id=context.user_id,
                                 admin=admin)
    return f"Removed job {job.label} ({job.schedule})."


# -- /cron ----------------------------------------------------------------------------------

_USAGE = ("Usage: /cron (your jobs), /cron remove ID, /cron all (admins), "
          "/cron approve ID TOOL... (admins; no TOOL clears)")


async def _cron_command(ctx: CommandContext) -> str:
    scheduler = ctx.app.services.scheduler
    if scheduler is None:
        return "Scheduled jobs are not available: the scheduler is not running."
    m = ctx.message
    words = ctx.args.split()
    if not words or words[0].lower() in ("list", "ls"):
        views = await scheduler.jobs(channel=m.channel, owner_id=m.sender_id)
        body = format_jobs(views, channel=m.channel, chat_id=m.chat_id, chat_type=m.chat_type,
                           empty="You have no scheduled jobs. Ask me to schedule something, "
                                 "e.g. 'remind me every day at 9 to stretch'.")
        return body if not views else f"Your scheduled jobs:\n{body}"
    action = words[0].lower()
    if action == "all":
        if not ctx.is_admin:
            return "/cron all is for admins only; /cron lists your own jobs."
        return "All scheduled jobs:\n" + format_jobs(
            await scheduler.all_jobs(), channel=m.channel, chat_id=m.chat_id,
            chat_type=m.chat_type, show_owner=True)
    if action in ("remove", "rm", "delete", "del"):
        if len(words) != 2:
            return "Usage: /cron remove ID (the ID is the first word of each line of /cron)"
        try:
            job = await scheduler.remove(words[1], channel=m.channel, owner_id=m.sender_id,
                                         admin=ctx.is_admin)
        except JobError as exc:
            return f"Cannot remove it: {exc}."
        return f"Removed job {job.label} ({job.schedule})."
    if action == "approve":
        if not ctx.is_admin:
            return "Only admins pre-approve tools for a job."
        if len(words) < 2:
            return "Usage: /cron approve ID TOOL... (no TOOL clears the pre-approvals)"
        try:
            job = await scheduler.approve(words[1], [t.strip(",") for t in words[2:]])
        except JobError as exc:
            return f"Cannot pre-approve: {exc}."
        if not job.approved_tools:
            return f"Job {job.label}: no tool is pre-approved; its runs are denied every " \
                   "tool that needs approval."
        return (f"Job {job.label}: {', '.join(job.approved_tools)} pre-approved; its runs "
                "use them without asking.")
    return _USAGE
