"""A user's request for a cron job, checked: message, name, time zone, schedule, interval.

What the ``cron`` tool and ``/cron`` get back as :class:`JobError` is fit to show the
user; the per-user limit is checked where the row is inserted (one statement).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from bot.contracts.views import JobError as JobError
from bot.scheduling.cron import Schedule, ScheduleError, format_duration, parse, zone

MAX_MESSAGE_CHARS = 4_000
MAX_NAME_CHARS = 80
MAX_JOBS_PER_USER = 20
"""Cron jobs one user may have unless the caller says otherwise (the cron plugin's table)."""
MIN_INTERVAL_SECONDS = 60
"""The shortest interval of a recurring job unless the caller says otherwise."""


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A checked request: the cleaned message and name, the zone and the parsed schedule."""

    message: str
    name: str
    tz: ZoneInfo
    schedule: Schedule


def check_request(message: str, name: str, schedule: str, timezone: str | None, *,
                  default_tz: ZoneInfo, now: datetime, min_interval: int) -> JobRequest:
    """The request cleaned and parsed; raises :class:`JobError` when it cannot be a job.

    ``timezone=None`` means ``default_tz``; jobs may not run more often than every
    ``min_interval`` seconds, and a one-shot's time must be after ``now``.
    """
    message, name = message.strip(), " ".join(name.split())
    if not message:
        raise JobError("the job needs a message: what to do when it fires",
                       "INVALID_ARGUMENT")
    if len(message) > MAX_MESSAGE_CHARS:
        raise JobError(f"the message is {len(message)} characters; the limit is "
                       f"{MAX_MESSAGE_CHARS}", "INVALID_ARGUMENT")
    if len(name) > MAX_NAME_CHARS:
        raise JobError(f"the name is longer than {MAX_NAME_CHARS} characters",
                       "INVALID_ARGUMENT")
    try:
        tz = zone(timezone) if timezone else default_tz
    except ScheduleError as exc:
        raise JobError(str(exc), "INVALID_TIMEZONE") from None
    try:
        parsed = parse(schedule, tz, now)
    except ScheduleError as exc:
        raise JobError(str(exc), "INVALID_SCHEDULE") from None
    if parsed.run_date is not None and parsed.run_date <= now:
        raise JobError(f"{parsed.run_date.isoformat()} has already passed (it is now "
                       f"{now.astimezone(tz).isoformat()} in {tz.key})", "TIME_PASSED")
    floor = min_interval
    gap = parsed.shortest_gap(floor)
    if gap is not None:
        raise JobError(
            f"{parsed.text!r} would run every {format_duration(int(gap))}; jobs may run "
            f"at most once every {format_duration(floor)}", "INTERVAL_TOO_SHORT")
    return JobRequest(message, name, tz, parsed)


def new_id() -> str:
    """Eight hex digits: short enough to type in ``/cron remove``."""
    return secrets.token_hex(4)
