"""Today's and yesterday's daily notes in the full-mode prompt (the memory plugin's
``roost_prompt_sections``).

Dates are UTC, like the pre-compaction flush's ``memory/<today>.md``, so the
notes one writes are the notes the other shows.
"""

from __future__ import annotations

import datetime as dt
import os

from roost import Order, PromptContext, PromptSection, hookimpl, read_cached

MAX_DAILY_NOTE_CHARS = 3_000
"""Each of today's and yesterday's notes is cut to this many characters in the prompt."""
DAILY_NOTES_ORDER = Order.TIME + 10
"""Right after the time line: both change during the day, so prompt caching loses nothing."""


def today_utc() -> dt.date:
    """Today's date in UTC: the day daily notes are filed under."""
    return dt.datetime.now(dt.UTC).date()


@hookimpl
def roost_prompt_sections(prompt: PromptContext) -> PromptSection | None:
    """Today's and yesterday's daily notes (full mode)."""
    return daily_notes(prompt)


def daily_notes(prompt: PromptContext) -> PromptSection | None:
    """Today's and yesterday's daily notes, each cut to :data:`MAX_DAILY_NOTE_CHARS` (full mode)."""
    if prompt.mode != "full":
        return None
    today = today_utc()
    blocks = []
    for day, label in ((today, "today"), (today - dt.timedelta(days=1), "yesterday")):
        rel = f"memory/{day.isoformat()}.md"
        # Opened once below the workspace, no link followed at open: a "note"
        # swapped for a link to outside reads as ''.
        body = read_cached(os.path.join(prompt.workspace, rel), MAX_DAILY_NOTE_CHARS,
                           within=prompt.workspace)
        if body:
            blocks.append(f'<file path="{rel}" day="{label}">\n{body}\n</file>')
    if not blocks:
        return None
    return PromptSection("daily_notes", "\n".join([
        "## Recent notes",
        "Your daily notes for today and yesterday (UTC dates), as you wrote them. Older "
        "notes and MEMORY.md are not shown: search them when the past matters.",
        *blocks,
    ]), DAILY_NOTES_ORDER)
