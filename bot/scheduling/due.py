"""Which fire times are due: misfires skipped, the rest coalesced into one run per job.

A job is due when its next fire time is not after ``now``. Fire times older than
the grace period are skipped and logged (the service was down too long for them to
be useful); the due fire times inside it become one run, for the latest.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.contracts.jobs import JobSpec
from bot.scheduling.cron import Schedule
from bot.storage.jobs import Job

log = logging.getLogger("roost.scheduling.due")

_MAX_CATCH_UP = 100_000
"""Fire times walked when coalescing; only a sub-second system job could get near it."""


@dataclass(slots=True, eq=False)
class Entry:
    """A loaded job: its row, its parsed schedule and its next fire time."""

    job: Job
    schedule: Schedule
    next_fire: datetime | None
    spec: JobSpec | None = None
    """The plugin's job, for system jobs."""


@dataclass(frozen=True, slots=True)
class Fire:
    """One run the scheduler started: the job, the fire time, how many it stands for."""

    job: Job
    fire_time: datetime
    coalesced: int = 1
    """Due fire times this run covers (more than 1 after downtime)."""


Wanted = tuple[Entry, datetime, int]
"""A job to run: its entry, the fire time to claim, how many due fire times it covers."""


def due(entries: Iterable[Entry], now: datetime, grace: int, *,
        running: Collection[str], channel: str | None = None,
        ) -> tuple[list[Wanted], list[Entry]]:
    """The runs due at ``now``, and the entries that will never fire again.

    Cron jobs count only where their channel is ``running`` (and, given
    ``channel``, only that channel's cron jobs); the others stay due. An entry
    whose misfires were skipped gets its next fire time moved past them.
    """
    earliest = now - timedelta(seconds=grace)
    wanted: list[Wanted] = []
    expired: list[Entry] = []
    for entry in entries:
        fire = entry.next_fire
        if fire is None or fire > now:
            continue
        job = entry.job
        if job.kind == "cron" and (job.channel not in running
                                   or (channel is not None and job.channel != channel)):
            continue  # left due: its channel catches it up when it starts
        if channel is not None and job.kind != "cron":
            continue
        if fire < earliest:
            skipped_from = fire
            fire = entry.schedule.first_from(earliest)
            log.warning("job %s: run(s) due since %s were missed by more than %ds "
                        "(misfire_grace_seconds) and are skipped", job.label,
                        skipped_from.isoformat(), grace)
            if fire is None or fire > now:
                entry.next_fire = fire
                if fire is None:
                    expired.append(entry)
                continue
        latest, count = fire, 1
        while count < _MAX_CATCH_UP:
            after = entry.schedule.following(latest)
            if after is None or after > now:
                break
            latest, count = after, count + 1
        wanted.append((entry, latest, count))
    return wanted, expired
