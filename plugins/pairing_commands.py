"""Built-in admin commands for access and spend: /pair (approve, list, revoke) and /usage."""

from __future__ import annotations

import contextlib
import logging

from roost import (
    AccessView,
    Command,
    CommandContext,
    OutboundMessage,
    Settings,
    UsageScope,
    UsageView,
    day_of,
    hookimpl,
    month_of,
    normalize_code,
)

log = logging.getLogger("roost.plugins.pairing_commands")

PAIR_USAGE = "approve CODE | list | revoke USER"
APPROVED_NOTICE = "An admin approved you: you can talk to me now. Send your message again."


def _access(ctx: CommandContext) -> AccessView:
    store = ctx.app.services.access
    if store is None:
        raise RuntimeError("the pairing store is not set up")
    return store


def _usage_store(ctx: CommandContext) -> UsageView:
    store = ctx.app.services.usage
    if store is None:
        raise RuntimeError("the usage store is not set up")
    return store


def _ago(seconds: float) -> str:
    minutes = max(0, round(seconds / 60))
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h"


async def _pair(ctx: CommandContext) -> str:
    words = ctx.args.split()
    action = words[0].lower() if words else ""
    store = _access(ctx)
    if action == "approve" and len(words) == 2:
        return await _approve(ctx, store, words[1])
    if action == "list" and len(words) == 1:
        return await _list(store)
    if action == "revoke" and len(words) == 2:
        return await _revoke(ctx, store, words[1])
    return f"Usage: /pair {PAIR_USAGE}"


async def _approve(ctx: CommandContext, store: AccessView, code: str) -> str:
    admin = f"{ctx.message.channel}:{ctx.message.sender_id}"
    request = await store.approve(code, admin)
    await ctx.app.invalidate_everywhere("pairing")
    if request is None:
        return (f"No pending request has the code {normalize_code(code)} (it is wrong, "
                "expired or already used).")
    log.info("%s approved %s for DMs", admin, request.user)
    # Telling the user is a courtesy: their channel may be down, the approval stands.
    with contextlib.suppress(Exception):
        await ctx.app.deliver(OutboundMessage(request.channel, request.chat_id,
                                              APPROVED_NOTICE, kind="notice"))
    name = f"{request.display_name} " if request.display_name else ""
    return f"Approved {name}({request.user}). They can talk to me now."


async def _list(store: AccessView) -> str:
    now = store.clock()
    pending, paired = await store.pending(), await store.paired()
    lines = ["Pending pairing requests:" if pending else "No pending pairing requests."]
    for r in pending:
        name = f" {r.display_name}" if r.display_name else ""
        lines.append(f"  {r.code}  {r.user}{name}, expires in {_ago(r.expires_at - now)}, "
                     f"{r.refused} message(s) refused")
    lines.append("Approved users:" if paired else "No approved users.")
    for u in paired:
        name = f" {u.display_name}" if u.display_name else ""
        lines.append(f"  {u.user}{name}, approved by {u.approved_by} "
                     f"{_ago(now - u.approved_at)} ago")
    return "\n".join(lines)


async def _revoke(ctx: CommandContext, store: AccessView, user: str) -> str:
    found = await store.find_paired(user, ctx.message.channel)
    if not found:
        return f"No approved user {user}. /pair list shows them."
    if len(found) > 1:
        return (f"{user} is approved on several channels; say which: "
                + ", ".join(u.user for u in found))
    target = found[0]
    await store.revoke(target.channel, target.user_id)
    await ctx.app.invalidate_everywhere("pairing")  # replicas forget their cached approval
    log.info("%s:%s revoked %s", ctx.message.channel, ctx.message.sender_id, target.user)
    return f"Revoked {target.user}: their next DM gets a new pairing code."


async def _usage(ctx: CommandContext) -> str:
    store = _usage_store(ctx)
    now = store.clock()
    limit = 10
    if ctx.args.strip().isdigit():
        limit = max(1, min(50, int(ctx.args.strip())))
    lines: list[str] = []
    for title, period in (("today", day_of(now)), ("this month", month_of(now))):
        scopes: tuple[tuple[UsageScope, str], ...] = (
            ("user", "users"), ("group", "groups"), ("agent", "agents"))
        for scope, what in scopes:
            top = await store.top(scope, period, limit)
            if not top:
                continue
            lines.append(f"Top {what} {title} (UTC), tokens in/out:")
            lines.extend(f"  {s.subject}: {s.tokens:,} ({s.input_tokens:,}/"
                         f"{s.output_tokens:,}), {s.runs} run(s)"
                         + (f", cache read {s.cache_read_tokens:,}/written "
                            f"{s.cache_write_tokens:,}"
                            if s.cache_read_tokens or s.cache_write_tokens else "")
                         + (f", cost {s.cost:.2f}" if s.cost else "") for s in top)
    return "\n".join(lines) if lines else "No tokens spent today or this month."


@hookimpl
def roost_commands(settings: Settings) -> list[Command]:
    """/pair and /usage, for admins."""
    return [
        Command("pair", "approve, list or revoke who may DM the bot", _pair,
                admin_only=True, usage=PAIR_USAGE),
        Command("usage", "top spenders of tokens today and this month", _usage,
                admin_only=True, usage="[how many]"),
    ]
