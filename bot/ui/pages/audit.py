"""``/ui/audit``: every action taken in the UI (who, what, target, when), newest first.

Paged by keyset: ``?before=<id>`` shows the entries older than that one.
"""

from __future__ import annotations

from aiohttp import web

from bot.storage.ui_accounts import UiAccountStore
from bot.ui.kit import NavEntry, UiRequest, UiRoute

PAGE = 50


async def audit(req: UiRequest) -> web.StreamResponse:
    """One page of the audit log."""
    raw = req.web.query.get("before", "")
    before = int(raw) if raw.isdigit() and len(raw) < 19 else None
    store = req.app.store
    entries = await UiAccountStore(store.db, store.lock, store.writer).audit_page(before,
                                                                                   PAGE + 1)
    older = entries[PAGE - 1].id if len(entries) > PAGE else None
    return req.render("audit.html", entries=entries[:PAGE], older=older,
                      paged=before is not None)


ROUTES = [UiRoute("GET", "/ui/audit", audit)]
NAV = NavEntry(label="Audit", path="/ui/audit", order=110)
