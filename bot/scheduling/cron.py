"""Schedules as text: cron expressions, ``every <duration>`` and ``at <time>``.

:func:`parse` turns the text a user or plugin wrote into a :class:`Schedule`,
which wraps the APScheduler trigger that computes the fire times. Three forms:

- a 5-field cron expression, ``minute hour day-of-month month day-of-week``,
  with standard cron meaning: day-of-week 0 and 7 are Sunday, and when both
  day fields are restricted a day matching *either* fires (APScheduler 3
  counts 0 as Monday and ANDs the day fields, so the text is translated);
- ``every <duration>``: a fixed interval (``every 90s``, ``every 1h30m``,
  ``every 2 hours``, ``every day``), counted from when the job was created;
- ``at <time>``: once, at an ISO time (``at 2025-03-01T09:00``, in the job's
  time zone unless it names an offset), a clock time (``at 9:30``: the next
  one) or a relative time (``at in 20 minutes``; ``in 20 minutes`` alone works
  too). It is resolved when the job is created and stored as an ISO time, so
  reloading the job gives the same instant.

Fire times depend only on the text, the time zone and the job's creation
time (the *anchor*), never on when the service happens to load the job; the
scheduler relies on that to recognize a fire time it already claimed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.combining import OrTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.date import DateTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]

ScheduleKind = Literal["cron", "every", "at"]

MAX_DURATION_SECONDS = 3650 * 86_400
"""Durations beyond ten years are refused (they overflow nothing, but mean a typo)."""
GAP_SAMPLES = 1_000
"""Consecutive fire times checked when looking for a cron expression's shortest gap."""


class ScheduleError(ValueError):
    """The schedule text cannot be used; the message says what is wrong and what works."""


FORMS = ('a 5-field cron expression ("0 9 * * 1-5"), "every <duration>" ("every 2h"), '
         'or "at <time>" ("at 2025-03-01T09:00", "at 18:30", "at in 20 minutes")')


# -- durations ----------------------------------------------------------------------

_UNITS: dict[str, int] = {}
for _names, _seconds in ((("s", "sec", "secs", "second", "seconds"), 1),
                         (("m", "min", "mins", "minute", "minutes"), 60),
                         (("h", "hr", "hrs", "hour", "hours"), 3_600),
                         (("d", "day", "days"), 86_400),
                         (("w", "wk", "wks", "week", "weeks"), 604_800)):
    for _name in _names:
        _UNITS[_name] = _seconds

_PART = re.compile(r"(\d+|an?\b)?\s*([a-z]+)")


def parse_duration(text: str) -> int:
    """Seconds in ``90s``, ``5m``, ``1h30m``, ``2 hours 10 minutes``, ``an hour``, ``day``.

    A unit without a number counts once (``every minute``). Raises
    :class:`ScheduleError` for anything else, or for zero or over ten years.
    """
    rest = text.strip().lower().replace(",", " ").replace(" and ", " ")
    if not rest:
        raise ScheduleError("missing duration: write e.g. 30s, 20m, 2h, 1d or 1h30m")
    total = 0
    pos = 0
    while pos < len(rest):
        if rest[pos].isspace():
            pos += 1
            continue
        match = _PART.match(rest, pos)
        if match is None or match.group(2) not in _UNITS:
            raise ScheduleError(f"cannot read {text.strip()!r} as a duration: write e.g. 30s, "
                                "20m, 2h, 1d or 1h30m")
        number = match.group(1)
        count = int(number) if number and number.isdigit() else 1
        total += count * _UNITS[match.group(2)]
        pos = match.end()
    if total <= 0:
        raise ScheduleError(f"{text.strip()!r} is no time at all; give a positive duration")
    if total > MAX_DURATION_SECONDS:
        raise ScheduleError(f"{text.strip()!r} is more than ten years")
    return total


def format_duration(seconds: int) -> str:
    """``5400`` → ``1h30m``; the compact form :func:`parse_duration` reads back."""
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name`` (``Europe/Paris``, ``UTC``), or :class:`ScheduleError`."""
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"{name!r} is not an IANA time zone name (e.g. UTC, "
                            "Europe/Berlin, America/New_York)") from exc


# -- schedules --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Schedule:
    """One parsed schedule: its canonical text and the trigger behind it.

    ``text`` is what gets stored (an ``at`` time resolved to ISO form);
    ``anchor`` is the job's creation time, which fire times are counted from.
    """

    kind: ScheduleKind
    text: str
    tz: ZoneInfo
    anchor: datetime
    trigger: Any
    interval: int | None = None
    run_date: datetime | None = None

    @property
    def one_shot(self) -> bool:
        """Whether the job runs once (``at``) and is then deleted."""
        return self.kind == "at"

    def first(self) -> datetime | None:
        """The first fire time: the ``at`` time, or the first one after the anchor."""
        if self.run_date is not None:
            return self.run_date
        if self.kind == "cron":
            # Nothing fires at the creation second itself: the first run is strictly after.
            return self.first_from(self.anchor + timedelta(seconds=1))
        return self.first_from(self.anchor)  # the interval trigger starts one interval later

    def first_from(self, moment: datetime) -> datetime | None:
        """The earliest fire time at or after ``moment`` (``None``: no more)."""
        if self.run_date is not None:
            return self.run_date if self.run_date >= moment else None
        return _aware(self.trigger.get_next_fire_time(None, moment))

    def following(self, fire: datetime) -> datetime | None:
        """The fire time after ``fire`` (``None``: no more)."""
        if self.run_date is not None:
            return None
        return _aware(self.trigger.get_next_fire_time(fire, fire))

    def shortest_gap(self, floor: float) -> float | None:
        """The shortest time between two runs, in seconds, if it is under ``floor``.

        Exact for ``every``; for a cron expression it checks the next
        :data:`GAP_SAMPLES` fire times, which covers a year of any expression
        that fires less than every few hours and an early repeat of any
        faster one. ``None`` when no gap under ``floor`` was found (and for
        one-shot schedules).
        """
        if self.interval is not None:
            return float(self.interval) if self.interval < floor else None
        if self.run_date is not None:
            return None
        fire = self.first()
        for _ in range(GAP_SAMPLES):
            if fire is None:
                return None
            after = self.following(fire)
            if after is None:
                return None
            gap = (after - fire).total_seconds()
            if gap < floor:
                return gap
            fire = after
        return None


def _aware(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None


def parse(text: str, tz: ZoneInfo, anchor: datetime, *, allow_at: bool = True) -> Schedule:
    """Parse schedule ``text`` for a job created at ``anchor`` in time zone ``tz``.

    Raises :class:`ScheduleError` with a message fit to show the user.
    """
    clean = " ".join(text.split())
    lower = clean.lower()
    if not clean:
        raise ScheduleError(f"the schedule is empty; use {FORMS}")
    if lower.startswith("every ") or lower == "every":
        seconds = parse_duration(clean[5:])
        # Counted from creation: the first run is one interval after the job was added.
        trigger = IntervalTrigger(seconds=seconds, start_date=anchor + timedelta(seconds=seconds),
                                  timezone=tz)
        return Schedule("every", f"every {format_duration(seconds)}", tz, anchor, trigger,
                        interval=seconds)
    if lower.startswith(("at ", "in ")) or lower in ("at", "in"):
        if not allow_at:
            raise ScheduleError(f"{clean!r}: one-shot schedules are for user jobs; use a cron "
                                "expression or every <duration>")
        when = _parse_at(clean[3:] if lower.startswith("at") else clean, tz, anchor)
        return Schedule("at", f"at {when.isoformat()}", tz, anchor,
                        DateTrigger(run_date=when, timezone=tz), run_date=when)
    fields = clean.split(" ")
    if len(fields) == 5:
        return Schedule("cron", clean, tz, anchor, _cron_trigger(clean, tz))
    raise ScheduleError(f"cannot read the schedule {clean!r}; use {FORMS}")


# -- at <time> -----------------------------------------------------------------------------

_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")


def _parse_at(text: str, tz: ZoneInfo, anchor: datetime) -> datetime:
    body = text.strip()
    lower = body.lower()
    if lower.startswith("in ") or lower == "in":
        return (anchor + timedelta(seconds=parse_duration(body[2:]))).astimezone(tz)
    clock = _CLOCK.fullmatch(body)
    if clock is not None:
        hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise ScheduleError(f"{body!r} is not a time of day")
        local = anchor.astimezone(tz)
        when = local.replace(hour=hour, minute=minute, second=second, microsecond=0)
        if when <= local:
            # Naive date arithmetic then re-localized, so "at 9:00" stays 9:00 across DST.
            when = (when.replace(tzinfo=None) + timedelta(days=1)).replace(tzinfo=tz)
        return when
    try:
        parsed = datetime.fromisoformat(body.replace(" ", "T", 1) if " " in body else body)
    except ValueError:
        raise ScheduleError(f"cannot read {body!r} as a time: use an ISO time "
                            "(2025-03-01T09:00, optionally with an offset), a clock time "
                            "(18:30) or 'in <duration>' (in 20 minutes)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    # Whole seconds: fire times are stored as floats and compared for equality.
    return parsed.astimezone(tz).replace(microsecond=0)


# -- cron expressions --------------------------------------------------------------------------

_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DOW_TERM = re.compile(r"(\*|[a-z]{3}|\d+)(?:-([a-z]{3}|\d+))?(?:/(\d+))?")


@functools.lru_cache(maxsize=4_096)
def _cron_trigger(expr: str, tz: ZoneInfo) -> Any:
    """The trigger for a cron expression in ``tz``.

    Cached and shared by every job with the same expression and zone: a cron
    trigger has no start date here (:meth:`Schedule.first` starts from the
    anchor) and is never modified, and building one is most of the cost of
    loading thousands of jobs at startup.
    """
    minute, hour, dom, month, dow = expr.split(" ")
    common = {"minute": minute, "hour": hour, "month": month, "timezone": tz}
    try:
        days = _weekdays(dow)
        if not dom.startswith("*") and not dow.startswith("*"):
            # Standard cron: with both day fields restricted, either one matching fires.
            return OrTrigger([CronTrigger(day=dom, **common),
                              CronTrigger(day_of_week=days, **common)])
        return CronTrigger(day=dom, day_of_week=days, **common)
    except ScheduleError as exc:
        raise ScheduleError(f"bad cron expression {expr!r}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise ScheduleError(f"bad cron expression {expr!r}: {exc}. Fields are minute (0-59), "
                            "hour (0-23), day of month (1-31), month (1-12), day of week "
                            "(0-7, 0 and 7 = Sunday, or sun-sat)") from None


def _weekdays(field: str) -> str:
    """A standard cron day-of-week field as APScheduler day names (``1-5`` → ``mon,...,fri``)."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for term in field.lower().split(","):
        match = _DOW_TERM.fullmatch(term)
        if match is None:
            raise ScheduleError(f"cannot read day of week {term!r}")
        start_s, end_s, step_s = match.groups()
        if start_s == "*":
            if end_s is not None:
                raise ScheduleError(f"cannot read day of week {term!r}")
            start, end = 0, 6
        else:
            start = _day_number(start_s)
            # "5/2" means from 5 to the end of the week, as in standard cron.
            end = _day_number(end_s) if end_s else (6 if step_s else start)
            if end_s and end == 0 and start > 0:
                end = 7  # "5-0" / "5-7": Friday through Sunday
        step = int(step_s) if step_s else 1
        if step < 1:
            raise ScheduleError(f"day of week step must be at least 1 in {term!r}")
        if end < start:
            raise ScheduleError(f"day of week range {term!r} runs backwards")
        days.update(day % 7 for day in range(start, end + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))


def _day_number(token: str) -> int:
    if token.isdigit():
        number = int(token)
        if number > 7:
            raise ScheduleError(f"day of week {number} is out of range (0-7, 0 and 7 = Sunday)")
        return number
    if token in _DAY_NAMES:
        return _DAY_NAMES.index(token)
    raise ScheduleError(f"unknown day of week {token!r} (use 0-7 or sun-sat)")
