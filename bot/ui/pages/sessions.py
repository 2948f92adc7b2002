"""``/ui/sessions``: every conversation (newest first, filtered, searchable, live) and
``/ui/sessions/<id>``: its transcript as the model saw it, live, with the operator's
actions on it (stop the running run, reset, compact now) and its image thumbnails.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlencode

from aiohttp import web

from bot.contracts.views import ERROR_ID_RE
from bot.ui.kit import NavEntry, UiRequest, UiRoute, sse
from bot.ui.queries import sessions as sq
from bot.ui.queries.reads import BadCursor
from bot.ui.session_actions import compact_now, reset_session, stop_run
from bot.ui.thumbnails import thumbnail

POLL = 0.5
"""Seconds between two reads of the store by a live view (each one indexed row)."""

DONE = {
    "stopped": "Stopped.",
    "idle": "Nothing is running.",
    "reset": "Started a fresh conversation. Earlier messages are archived, not deleted.",
    "compacted": "Compacted: the older messages are summarized.",
    "not-compacted": "Nothing to compact (too few messages, or it changed meanwhile).",
    "busy": "A compaction of this conversation is already running.",
    "archived": "This conversation is archived: nothing runs in it.",
}
"""The notices an action leaves (by code in ``?done=``: no text ever comes from a URL)."""


def plain(status: int, line: str) -> web.Response:
    """A one-line text answer (bad input, nothing there)."""
    return web.Response(status=status, text=f"{line}\n")


def session_filter(req: UiRequest) -> sq.SessionFilter:
    """The list's filters from the query string."""
    q = req.web.query
    return sq.SessionFilter(text=q.get("q", "").strip()[:200], user=q.get("user", "").strip(),
                            channel=q.get("channel", "").strip(),
                            agent=q.get("agent", "").strip())


def query_of(f: sq.SessionFilter, **more: str) -> str:
    """The query string of filters ``f`` (and ``more``), empty values left out."""
    pairs = {"q": f.text, "user": f.user, "channel": f.channel, "agent": f.agent, **more}
    return urlencode({k: v for k, v in pairs.items() if v})


def pieces(text: str) -> list[tuple[str, str]]:
    """``text`` cut around the error IDs in it: (text, error ID or "") pairs, so the
    template links each ID to its detail page without marking anything safe."""
    out: list[tuple[str, str]] = []
    last = 0
    for match in ERROR_ID_RE.finditer(text):
        if match.start() > last:
            out.append((text[last:match.start()], ""))
        out.append((match.group(0), match.group(0)))
        last = match.end()
    if last < len(text) or not out:
        out.append((text[last:], ""))
    return out


async def sessions(req: UiRequest) -> web.StreamResponse:
    """The list, or the search hits when ``q`` is given."""
    f = session_filter(req)
    before = req.web.query.get("before") or None
    try:
        if f.text:
            return req.render("sessions.html", filter=f, hits=await sq.search(
                req.app.store, f, before), page=None, query_of=query_of)
        page = await sq.list_sessions(req.app.store, f, before)
    except BadCursor as exc:
        return plain(400, str(exc))
    return req.render("sessions.html", filter=f, page=page, hits=None, query_of=query_of,
                      live=before is None)


def gone(req: UiRequest) -> bool:
    """Whether the client of a live view has gone (its polling stops at once)."""
    transport = req.web.transport
    return transport is None or transport.is_closing()


async def _list_changes(req: UiRequest, f: sq.SessionFilter) -> AsyncIterator[tuple[str, str]]:
    last = await sq.newest_activity(req.app.store)
    while True:
        await asyncio.sleep(POLL)
        if gone(req):
            return
        now = await sq.newest_activity(req.app.store)
        if now != last:
            last = now
            page = await sq.list_sessions(req.app.store, f)
            yield "rows", req.fragment("_sessions_rows.html", page=page)


async def list_events(req: UiRequest) -> web.StreamResponse:
    """The first page of the list again whenever a conversation moved (SSE ``rows``)."""
    return await sse(req, _list_changes(req, session_filter(req)))


def session_id(req: UiRequest) -> int:
    """The session id in the path (the route admits digits only)."""
    return int(req.web.match_info["session_id"])


async def detail(req: UiRequest) -> web.StreamResponse:
    """The transcript page: the newest messages (older ones by ``before``), its runs."""
    store = req.app.store
    found = await sq.session_detail(store, session_id(req))
    if found is None:
        return plain(404, f"no session {session_id(req)}")
    try:
        page = await sq.transcript(store, found.row.id, req.web.query.get("before") or None)
    except BadCursor as exc:
        return plain(400, str(exc))
    runs = await sq.runs_of(store, found.row.key, [m.run_id for m in page.messages])
    live = not req.web.query.get("before")
    newest = page.messages[-1].id if page.messages else 0
    return req.render("sessions_detail.html", s=found, page=page, runs=runs,
                      messages=page.messages,
                      run_of={r.id: r for r in runs}, pieces=pieces, live=live,
                      newest=newest, done=DONE.get(req.web.query.get("done", ""), ""))


async def _new_messages(req: UiRequest, sid: int, after: int
                        ) -> AsyncIterator[tuple[str, str]]:
    store = req.app.store
    while True:
        await asyncio.sleep(POLL)
        if gone(req):
            return
        if await sq.newest_message_id(store, sid) <= after:
            continue
        found = await sq.session_detail(store, sid)
        messages = await sq.messages_after(store, sid, after)
        if found is None or not messages:
            continue
        after = messages[-1].id
        runs = await sq.runs_of(store, found.row.key, [m.run_id for m in messages], limit=0)
        yield "messages", req.fragment("_sessions_messages.html", messages=messages,
                                       run_of={r.id: r for r in runs}, pieces=pieces,
                                       s=found)


async def detail_events(req: UiRequest) -> web.StreamResponse:
    """Messages stored after ``after`` as they arrive (SSE ``messages``), on any replica."""
    after = req.web.query.get("after", "0")
    if not after.isdigit() or len(after) > 18:
        return plain(400, "after must be a message id")
    return await sse(req, _new_messages(req, session_id(req), int(after)))


async def file(req: UiRequest) -> web.StreamResponse:
    """A thumbnail of an image a message carried (read from the user's workspace)."""
    info = req.web.match_info
    part = await sq.message_part(req.app.store, session_id(req), int(info["message_id"]),
                                 int(info["index"]))
    if part is None:
        return plain(404, "no such file")
    return await thumbnail(req.app.settings.workspaces_dir, part)


async def _act(req: UiRequest, action: str) -> web.StreamResponse:
    found = await sq.session_detail(req.app.store, session_id(req))
    if found is None:
        return plain(404, f"no session {session_id(req)}")
    target, key = f"session {found.row.id}", found.row.key
    if found.row.archived_at is not None:
        await req.audit(action, target, "refused: archived")
        return req.redirect(f"/ui/sessions/{found.row.id}?done=archived")
    if action == "stop":
        code = await stop_run(req.app, key)
        await req.audit("stop", target, f"{key}: {code}")
        return req.redirect(f"/ui/sessions/{found.row.id}?done={code}")
    if action == "reset":
        new_id = await reset_session(req.app, key)
        await req.audit("reset", target, f"{key}: now session {new_id}")
        return req.redirect(f"/ui/sessions/{new_id}?done=reset")
    code = await compact_now(req.app, key)
    await req.audit("compact", target, f"{key}: {code}")
    return req.redirect(f"/ui/sessions/{found.row.id}?done={code}")


async def stop(req: UiRequest) -> web.StreamResponse:
    """Stop the session's oldest running run, here or on the replica that runs it."""
    return await _act(req, "stop")


async def reset(req: UiRequest) -> web.StreamResponse:
    """Archive the conversation and start a fresh one (what ``/new`` does)."""
    return await _act(req, "reset")


async def compact(req: UiRequest) -> web.StreamResponse:
    """Summarize the older messages now."""
    return await _act(req, "compact")


_ID = r"{session_id:\d{1,18}}"

ROUTES = [
    UiRoute("GET", "/ui/sessions", sessions),
    UiRoute("GET", "/ui/sessions/events", list_events),
    UiRoute("GET", f"/ui/sessions/{_ID}", detail),
    UiRoute("GET", f"/ui/sessions/{_ID}/events", detail_events),
    UiRoute("GET", f"/ui/sessions/{_ID}/files/{{message_id:\\d{{1,18}}}}/{{index:\\d{{1,4}}}}",
            file),
    UiRoute("POST", f"/ui/sessions/{_ID}/stop", stop, role="operator"),
    UiRoute("POST", f"/ui/sessions/{_ID}/reset", reset, role="operator"),
    UiRoute("POST", f"/ui/sessions/{_ID}/compact", compact, role="operator"),
]
NAV = NavEntry(label="Sessions", path="/ui/sessions", order=20)
