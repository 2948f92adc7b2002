"""Retention: deleting answered inbox entries, stored errors and large results past their age."""

from __future__ import annotations

import logging
import sqlite3

from bot.contracts.services import Services

log = logging.getLogger("roost.storage.retention")


async def prune_stores(services: Services, days: int) -> None:
    """Delete stored errors and large results older than ``days``.

    Runs at startup and daily as the ``error-retention`` job (plugins/error_tools.py).
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
