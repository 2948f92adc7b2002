"""Feedback: the 👍 and 👎 people put on Roost's replies, stored with the reply's run and
counted in ``/status`` for admins.

A vote is kept once per person, run and kind (a platform delivering a reaction again
changes nothing) and withdrawn when the reaction is removed. Skin tones count as the
plain emoji; Slack's ``:+1:``/``:thumbsup:`` and ``:-1:``/``:thumbsdown:`` count too.
"""

from __future__ import annotations

import re
import time
from typing import Any, Literal

from roost import CommandContext, Migrations, ReplyReaction, Runtime, hookimpl, transaction

Vote = Literal["up", "down"]

VOTES: dict[str, Vote] = {"👍": "up", ":+1:": "up", ":thumbsup:": "up",
                          "👎": "down", ":-1:": "down", ":thumbsdown:": "down"}
"""The emoji that are votes, as channels hand them in."""
SKIN = re.compile("[\U0001f3fb-\U0001f3ff\ufe0f]|::skin-tone-[2-6]")
"""Skin-tone modifiers (Unicode, and Slack's name suffix) and the variation selector."""
SHOWN = 3
"""The latest votes in the conversation that ``/status`` lists."""


def vote_of(emoji: str) -> Vote | None:
    """The vote ``emoji`` is (skin tones ignored), or ``None``."""
    return VOTES.get(SKIN.sub("", emoji))


@hookimpl
def roost_migrations() -> Migrations:
    return Migrations("feedback", ["""
        CREATE TABLE feedback_votes (
            run_id TEXT NOT NULL,
            channel TEXT NOT NULL,
            user_id TEXT NOT NULL,
            vote TEXT NOT NULL CHECK (vote IN ('up', 'down')),
            session_key TEXT NOT NULL,
            user_name TEXT NOT NULL,
            voted_at REAL NOT NULL,
            PRIMARY KEY (run_id, channel, user_id, vote)
        );
        CREATE INDEX feedback_votes_session ON feedback_votes(session_key, voted_at);
    """])


@hookimpl
async def roost_reaction(reaction: ReplyReaction, app: Runtime) -> None:
    event = reaction.event
    vote = vote_of(event.emoji)
    if vote is None:
        return
    key = (reaction.run_id, event.channel, event.user_id, vote)

    async def body(db: Any) -> None:
        if event.added:
            await db.execute(
                "INSERT INTO feedback_votes (run_id, channel, user_id, vote, session_key,"
                " user_name, voted_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id, channel, user_id, vote) DO NOTHING",
                (*key, reaction.session_key, event.user_name[:100], time.time()))
        else:
            await db.execute(
                "DELETE FROM feedback_votes WHERE run_id = ? AND channel = ? AND user_id = ?"
                " AND vote = ?", key)

    await transaction(app.store.db, app.store.lock, body)


@hookimpl
async def roost_status(context: CommandContext) -> list[str] | None:
    if not context.is_admin:
        return None
    store = context.app.store
    async with store.lock, store.db.execute(
        "SELECT vote, session_key = ?, COUNT(*) FROM feedback_votes GROUP BY vote, 2",
        (context.session_key,),
    ) as cur:
        counts = await cur.fetchall()
    async with store.lock, store.db.execute(
        "SELECT vote, user_name, user_id, run_id FROM feedback_votes WHERE session_key = ?"
        " ORDER BY voted_at DESC LIMIT ?", (context.session_key, SHOWN),
    ) as cur:
        latest = await cur.fetchall()
    here = {v: 0 for v in ("up", "down")}
    everywhere = dict(here)
    for vote, same, count in counts:
        everywhere[vote] += int(count)
        if same:
            here[vote] += int(count)
    lines = [f"Feedback on replies: here 👍 {here['up']} 👎 {here['down']}; "
             f"all chats 👍 {everywhere['up']} 👎 {everywhere['down']}"]
    lines.extend(f"  {'👍' if vote == 'up' else '👎'} {name or user} on run {run_id}"
                 for vote, name, user, run_id in latest)
    return lines
