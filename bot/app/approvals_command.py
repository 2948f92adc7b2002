"""``/approvals``: the latest approval decisions, for admins."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.contracts.commands import Command, CommandContext
from bot.engine.approvals import OUTCOMES
from bot.storage.approvals import ApprovalStore

SHOWN = 20
"""Decisions listed, newest first."""
ARGUMENTS_SHOWN = 200
"""Characters of each call's (masked) arguments in the list."""


def approvals_command(store: ApprovalStore) -> Command:
    """The ``/approvals`` command reading ``store``."""
    async def handler(ctx: CommandContext) -> str:
        rows = await store.recent(SHOWN)
        if not rows:
            return "No tool call has asked for approval yet."
        lines = [f"The last {len(rows)} approval request(s), newest first:"]
        for row in rows:
            asked = datetime.fromtimestamp(row.created_at, UTC).strftime("%Y-%m-%d %H:%M")
            outcome = "waiting" if row.state == "pending" else (
                f"{OUTCOMES.get(row.state, row.state)} by {row.decided_by}")
            arguments = row.arguments if len(row.arguments) <= ARGUMENTS_SHOWN else (
                row.arguments[:ARGUMENTS_SHOWN] + f"... ({len(row.arguments)} characters)")
            lines.append(f"- {asked} UTC {row.channel}:{row.requester} {row.tool} "
                         f"{arguments}: {outcome}")
        return "\n".join(lines)

    return Command("approvals", "The latest tool calls that waited for approval",
                   handler, admin_only=True)
