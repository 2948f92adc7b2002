"""Built-in slash commands: /help, /stop, /stopall, /new (/reset), /status, /whoami."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from roost import AgentError, AgentView, Command, CommandContext, Settings, hookimpl


async def _help(ctx: CommandContext) -> str:
    seen: set[str] = set()
    lines = ["Commands:"]
    for command in sorted(ctx.app.commands.values(), key=lambda c: c.name):
        if command.name in seen or (command.admin_only and not ctx.is_admin):
            continue
        seen.add(command.name)
        names = " ".join(f"/{n}" for n in (command.name, *command.aliases))
        usage = f" {command.usage}" if command.usage else ""
        admin = " (admin)" if command.admin_only else ""
        lines.append(f"{names}{usage} — {command.description}{admin}")
    return "\n".join(lines)


async def _stop(ctx: CommandContext) -> str:
    if ctx.app.stop_oldest(ctx.session_key):
        return "Stopped."
    # Replicas: the run may be another process's (it is asked over the database).
    runs, _ = await ctx.app.stop_elsewhere(ctx.session_key, "stop")
    return "Stopped." if runs else "Nothing is running."


async def _stopall(ctx: CommandContext) -> str:
    runs, dropped = ctx.app.stop_all(ctx.session_key)
    far_runs, far_dropped = await ctx.app.stop_elsewhere(ctx.session_key, "stopall")
    runs, dropped = runs + far_runs, dropped + far_dropped
    if not runs and not dropped:
        return "Nothing is running."
    return f"Stopped {runs} run(s) and dropped {dropped} queued message(s)."


async def _new(ctx: CommandContext) -> str:
    await ctx.app.store.reset(ctx.session_key)
    return "Started a fresh conversation. Earlier messages are archived, not deleted."


async def _status(ctx: CommandContext) -> str:
    app = ctx.app
    session = await app.store.get(ctx.session_key)
    agent: AgentView | None
    try:
        agent = await app.agents.get(ctx.agent)
        model = f"{agent.settings.model} via {(agent.provider or app.provider).name}"
    except AgentError as exc:
        agent, model = None, f"unavailable ({exc})"
    lines = [
        f"Session: {session.key} ({len(session.messages)} messages)",
        f"Agent: {ctx.agent}",
        f"Model: {model}",
        f"Tokens: {session.input_tokens} in / {session.output_tokens} out; prompt cache: "
        f"{session.cache_read_tokens} of the input read, {session.cache_write_tokens} written",
        f"Running: {app.running_count(ctx.session_key)}, "
        f"queued: {app.queue_length(ctx.session_key)}",
        f"Active runs (all chats): {app.active_runs}",
        f"Compactions: {session.compactions}"
        + (f", summary of {len(session.summary)} chars" if session.summary else ""),
    ]
    if session.context_tokens:
        t = session.context_tokens
        lines.append(
            f"Context (tokens, last run): system {t['rom']}, kernel {t['kernel']}, "
            f"summary {t['l2']}, recent {t['l1']}, message {t['current']}; "
            f"total {t['total']} of {t['budget']}")
    lines.extend(await app.spending(ctx.message, ctx.agent))
    if agent is not None and agent.judge is not None:
        j = agent.judge
        lines.append(f"Judges: {len(agent.judges)}, {j.strategy} >= {j.threshold:.2f}; "
                     f"{app.agents.stats_for(agent.name).describe()}")
    if ctx.is_admin:
        lines.extend(_tool_health(app.tool_metrics.snapshot(),
                                  app.breakers.snapshot()))
    lines.extend(f"{r.part}: {'ok' if r.ready else 'NOT READY'}, {r.detail}"
                 for r in await app.plugins.health(app))
    lines.extend(await app.plugins.status_lines(ctx))
    if app.plugins.errors:
        lines.append("Plugin errors:")
        lines.extend(f"  {name}: {error}" for name, error in sorted(app.plugins.errors.items()))
    return "\n".join(lines)


MAX_ERROR_CHARS = 3_000
MAX_PINS = 20
MAX_PIN_CHARS = 500


async def _pin(ctx: CommandContext) -> str:
    fact = ctx.args.strip()
    if not fact:
        return "Usage: /pin <a fact to keep in mind for this conversation>"
    if len(fact) > MAX_PIN_CHARS:
        return f"That is too long to pin ({len(fact)} characters; the limit is {MAX_PIN_CHARS})."
    session = await ctx.app.store.get(ctx.session_key)
    if len(session.facts) >= MAX_PINS:
        return f"This conversation already has {MAX_PINS} pinned facts; /unpin one first."
    await ctx.app.store.set_facts(session, [*session.facts, fact])
    return f"Pinned as #{len(session.facts)}."


async def _pins(ctx: CommandContext) -> str:
    session = await ctx.app.store.get(ctx.session_key)
    if not session.facts:
        return "Nothing is pinned. Use /pin <fact>."
    return "Pinned facts:\n" + "\n".join(f"#{i} {f}" for i, f in enumerate(session.facts, 1))


async def _unpin(ctx: CommandContext) -> str:
    session = await ctx.app.store.get(ctx.session_key)
    arg = ctx.args.strip().lstrip("#")
    if not arg.isdigit() or not 1 <= int(arg) <= len(session.facts):
        return f"Usage: /unpin <number from /pins, 1..{len(session.facts)}>" \
            if session.facts else "Nothing is pinned."
    facts = list(session.facts)
    removed = facts.pop(int(arg) - 1)
    await ctx.app.store.set_facts(session, facts)
    return f"Unpinned: {removed}"


def _tool_health(metrics: Mapping[str, Mapping[str, Any]],
                 breakers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Admin lines: per-tool errors, retries, timeouts and breaker state."""
    lines = []
    for name in sorted(set(metrics) | set(breakers)):
        m, b = metrics.get(name, {}), breakers.get(name, {})
        if not m.get("error_count") and b.get("state", "closed") == "closed":
            continue
        rate = m.get("retry_success_rate")
        lines.append(
            f"  {name}: {m.get('error_count', 0)} errors ({m.get('transient_error_count', 0)}"
            f" transient, {m.get('permanent_error_count', 0)} permanent), "
            f"{m.get('retry_count', 0)} retries"
            + (f" ({rate:.0%} succeeded)" if rate is not None else "")
            + f", {m.get('timeout_count', 0)} timeouts, breaker {b.get('state', 'closed')}"
            f" (opened {m.get('circuit_breaker_opens', 0)}x)")
    return ["Tool health:", *lines] if lines else ["Tool health: no tool errors."]


async def _errors(ctx: CommandContext) -> str:
    store = ctx.app.services.errors
    if store is None:
        return "The error store is not configured."
    error_id = ctx.args.strip()
    if not error_id:
        recent = await store.list(limit=10)
        if not recent:
            return "No tool errors stored."
        return "Latest tool errors:\n" + "\n".join(
            f"{e.id} {e.tool_name}: {e.short_summary}" for e in recent)
    found = await store.get(error_id)
    if found is None:
        return f"No error {error_id}."
    body = json.dumps(found.raw_error, indent=1, ensure_ascii=False)
    if len(body) > MAX_ERROR_CHARS:
        body = body[:MAX_ERROR_CHARS] + f"\n... (full error: roost errors show {found.id})"
    return (f"{found.id} at {found.iso_timestamp()} in {found.session_id}\n"
            f"Tool: {found.tool_name}\n{body}")


async def _whoami(ctx: CommandContext) -> str:
    m = ctx.message
    return (f"You are {m.display_name} (id {m.sender_id}) on {m.channel}, "
            f"in a {m.chat_type} chat {m.chat_id}. Admin: {'yes' if ctx.is_admin else 'no'}.\n"
            f"Session: {ctx.session_key}")


@hookimpl
def roost_commands(settings: Settings) -> list[Command]:
    """The commands every Roost deployment has."""
    return [
        Command("help", "list the commands", _help),
        Command("stop", "stop the oldest running answer in this chat", _stop),
        Command("stopall", "stop every running answer here and drop queued messages",
                _stopall),
        Command("new", "start a fresh conversation", _new, aliases=("reset",)),
        Command("status", "session, model, queue and token counts", _status),
        Command("whoami", "who Roost thinks you are", _whoami),
        Command("pin", "keep a fact in mind for this whole conversation", _pin,
                usage="<fact>"),
        Command("pins", "list the pinned facts", _pins),
        Command("unpin", "remove a pinned fact", _unpin, usage="<number>"),
        Command("errors", "latest tool errors, or one in full", _errors, admin_only=True,
                usage="[error id]"),
    ]
