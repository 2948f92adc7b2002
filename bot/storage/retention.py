"""Retention: deleting answered inbox entries, stored errors, large results and run
traces past their age."""

from __future__ import annotations

import logging
import sqlite3
import time

from bot.contracts.services import Services

log = logging.getLogger("roost.storage.retention")

async def prune_stores(services: Services, days: int, *, trace_days: int) -> None:
    """Delete answered inbox entries, stored errors and large results older than
    ``days``, and runs' trace records (``runs`` and their spans) that ended more
    than ``trace_days`` ago.

    Runs at startup and daily as the ``error-retention`` job (plugins/error_tools.py).
    Conversation history (``messages``) is never pruned.
    """
    if services.inbox is not None:
        try:
            deleted = await services.inbox.prune(days)
        except (sqlite3.Error, ValueError):
            log.exception("could not prune the inbox")
        else:
            if deleted:
                log.info("deleted %d answered inbox entries older than %d days", deleted, days)
    for what, store in (("errors", services.errors), ("tool results", services.results)):
        if store is None:
            continue
        try:
            deleted = await store.delete_older_than(days)
        except (sqlite3.Error, ValueError):
            log.exception("could not delete stored %s older than %d days", what, days)
            continue
        if deleted:
            log.info("deleted %d stored %s older than %d days", deleted, what, days)
    try:
        runs, spans = await services.sessions.prune_runs(time.time() - trace_days * 86_400)
    except (sqlite3.Error, ValueError):
        log.exception("could not delete run traces older than %d days", trace_days)
    else:
        if runs:
            log.info("deleted %d runs and %d spans older than %d days", runs, spans, trace_days)
    if services.usage is not None:
        try:
            expired = await services.usage.drop_expired()
        except (sqlite3.Error, ValueError):
            log.exception("could not delete expired budget reservations")
        else:
            if expired:
                log.info("deleted %d expired budget reservations (of calls whose process "
                         "died)", expired)
