"""The outbox page: replies not delivered yet or given up, and retrying or dropping one.

The list reads the open replies by the ``outbox_open`` index, newest first, a page
at a time. "Retry now" goes through :meth:`bot.storage.inbox.Inbox.retry`: with
replicas every replica is woken and one takes the reply over and sends it at once;
a single process sends it itself, replacing any attempt it had waiting. "Drop"
deletes a reply that is not being sent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.storage.inbox import OutboxEntry, decode_outbound
from bot.ui.queries.opsdb import PAGE_SIZE, id_cursor, rows

if TYPE_CHECKING:
    from bot.app.roost import Roost


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One reply not delivered: where to, its text, how it stands."""

    id: int
    channel: str
    chat_id: str
    text: str
    state: str
    """``pending`` (attempts go on) or ``failed`` (given up)."""
    attempts: int
    last_error: str
    created_at: float
    updated_at: float
    owner: str
    """The replica sending it ('' for a single process)."""
    sending: bool
    """A platform call for it may be under way: it cannot be retried or dropped now."""


@dataclass(frozen=True, slots=True)
class OutboxPage:
    """A page of open replies (newest first), the cursor of the next, and the counts."""

    rows: list[OutboxRow]
    next_cursor: str | None
    pending: int
    failed: int
    oldest_pending: float | None


async def outbox_page(app: Roost, *, before: str | None = None,
                      limit: int = PAGE_SIZE) -> OutboxPage:
    """Open replies older than cursor ``before`` (an outbox id), newest first."""
    below = id_cursor(before)
    where = " AND id < ?" if below is not None else ""
    params: tuple[object, ...] = (below,) if below is not None else ()
    found = await rows(
        app.store,
        "SELECT id, channel, chat_id, message, state, attempts, last_error, created_at,"
        " updated_at, owner, sending FROM outbox WHERE state IN ('pending', 'failed')"
        f"{where} ORDER BY id DESC LIMIT ?", (*params, limit + 1))
    page = [OutboxRow(int(r[0]), str(r[1]), str(r[2]), _text(str(r[3])), str(r[4]),
                      int(r[5]), str(r[6] or ""), float(r[7]), float(r[8]), str(r[9] or ""),
                      bool(r[10])) for r in found[:limit]]
    counts = {str(r[0]): (int(r[1]), r[2]) for r in await rows(
        app.store,
        "SELECT state, count(*), min(created_at) FROM outbox"
        " WHERE state IN ('pending', 'failed') GROUP BY state")}
    pending = counts.get("pending", (0, None))
    return OutboxPage(page, str(page[-1].id) if len(found) > limit else None,
                      pending[0], counts.get("failed", (0, None))[0],
                      float(pending[1]) if pending[1] is not None else None)


def _text(encoded: str) -> str:
    try:
        return decode_outbound(encoded).text
    except (ValueError, KeyError, TypeError):
        return encoded  # shown as stored (escaped like any text)


async def retry(app: Roost, outbox_id: int) -> OutboxEntry | None:
    """Make reply ``outbox_id`` due now and get it sent; ``None`` when it was delivered,
    dropped or is being sent."""
    entry = await app.inbox.retry(outbox_id)
    if entry is None:
        return None
    if app.dispatcher.replicas is None:
        # One process: nobody else takes it over; send it from here, now.
        reply = entry.message if entry.attempt_note is None else \
            dataclasses.replace(entry.message, attempt_note=entry.attempt_note)
        app.dispatcher.redeliveries.schedule(entry.id, reply, entry.draft_id, entry.attempts,
                                             delay=0.0)
    return entry


async def drop(app: Roost, outbox_id: int) -> bool:
    """Delete reply ``outbox_id`` if it is not delivered and not being sent; whether it was."""
    return await app.inbox.drop(outbox_id)
