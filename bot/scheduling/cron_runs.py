"""Running one fire of a user's cron job: the turn, its retries, and the failure report."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple
from zoneinfo import ZoneInfo

from bot.contracts.messages import InboundMessage, OutboundMessage
from bot.resilience.retry import RetryPolicy
from bot.storage.jobs import Job

if TYPE_CHECKING:
    from bot.contracts.runtime import Runtime
    from bot.scheduling.due import Fire

log = logging.getLogger("roost.scheduling.cron_runs")

CRON_RETRY = RetryPolicy.fixed(30.0, 120.0, 480.0)


class Outcome(NamedTuple):
    """How one fire of a job ended: its (last) run, that run's status and error."""

    run_id: str | None
    status: str
    error: str
"""A failed cron run is retried after 30 s, 2 min and 8 min: about 10 minutes in all."""


async def run_cron_job(runtime: Runtime, job: Job, fire: Fire, tz: ZoneInfo,
                       retry: RetryPolicy, sleep: Callable[[float], Awaitable[None]], *,
                       wanted: Callable[[], bool]) -> Outcome:
    """Queue the job's turn in its chat, retry a failed one per ``retry``, report a give-up.

    ``wanted()`` is asked after each wait: a job removed meanwhile (or a
    scheduler closing) is neither retried nor reported. A run someone stopped
    (``/stop``) is not a failure. Returns how the fire ended: its last run's id
    (``None`` if none ran), status and error.
    """
    message = InboundMessage(channel=job.channel, chat_id=job.chat_id,
                             chat_type=job.chat_type, sender_id=job.owner_id,
                             text=job.message, thread_id=job.thread_id, mentioned=True)
    context = cron_context(job, fire, tz)
    error = ""
    run_id: str | None = None
    attempts = 1 + retry.retries
    for attempt in range(attempts):
        if attempt:
            delay = retry.delay(attempt)
            log.warning("job %s failed (%s); retry %d of %d in %gs", job.label, error,
                        attempt, attempts - 1, delay)
            await sleep(delay)
            if not wanted():
                # Removed while waiting: nothing to retry or report.
                return Outcome(run_id, "cancelled", error)
        try:
            result = await runtime.run_scheduled(
                message, mode="minimal", kind="cron", extra_context=context,
                deliver_failed=False, job=f"cron:{job.id}", approved=job.approved_tools)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the scheduler is closing
            log.info("job %s: its run was stopped", job.label)
            return Outcome(run_id, "cancelled", "stopped")
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            continue
        run_id = result.run_id
        if result.status != "failed":
            return Outcome(run_id, result.status, result.error)
        error = result.error or "the run failed"
    await report_failure(runtime, job, fire, attempts, error)
    return Outcome(run_id, "failed", error)


async def report_failure(runtime: Runtime, job: Job, fire: Fire, attempts: int,
                         error: str) -> None:
    """Log a given-up fire and tell the job's chat, if its channel is running."""
    log.error("job %s failed %d times for fire time %s: %s", job.label, attempts,
              fire.fire_time.isoformat(), error)
    if job.channel not in runtime.channels:
        return
    text = (f"Scheduled job {job.label} failed {attempts} times and was given up for "
            f"this run: {error}")
    try:
        await runtime.deliver(OutboundMessage(
            job.channel, job.chat_id, text, job.chat_type, thread_id=job.thread_id,
            kind="notice"))
    except Exception:
        log.exception("could not report the failure of job %s", job.id)


def cron_context(job: Job, fire: Fire, tz: ZoneInfo) -> str:
    """What the model is told about the job in a cron run (``<extra_context>``)."""
    when = fire.fire_time.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z")
    missed = (f" It stands for {fire.coalesced} runs that were due while the service was "
              "down." if fire.coalesced > 1 else "")
    return (f"This run was started by scheduled job {job.label} (schedule {job.schedule!r}, "
            f"time zone {job.timezone}) that user {job.owner_id} created in this chat; it is "
            f"the run for {when}.{missed} The user message is the job's instruction, not a new "
            "message. Carry it out and reply with what the chat should see, or reply exactly "
            "NO_REPLY if there is nothing worth sending.")
