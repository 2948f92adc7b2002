"""Built-in slash commands: /help, /stop, /stopall, /new (/reset), /status, /whoami."""

from __future__ import annotations

from bot.commands import Command, CommandContext
from bot.config import Settings
from bot.hookspecs import hookimpl


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
    if ctx.app.dispatcher.stop_oldest(ctx.session_key):
        return "Stopped."
    return "Nothing is running."


async def _stopall(ctx: CommandContext) -> str:
    runs, dropped = ctx.app.dispatcher.stop_all(ctx.session_key)
    if not runs and not dropped:
        return "Nothing is running."
    return f"Stopped {runs} run(s) and dropped {dropped} queued message(s)."


async def _new(ctx: CommandContext) -> str:
    await ctx.app.store.reset(ctx.session_key)
    return "Started a fresh conversation. Earlier messages are archived, not deleted."


async def _status(ctx: CommandContext) -> str:
    app = ctx.app
    session = await app.store.get(ctx.session_key)
    lines = [
        f"Session: {session.key} ({len(session.messages)} messages)",
        f"Model: {app.settings.model} via {app.provider.name}",
        f"Tokens: {session.input_tokens} in / {session.output_tokens} out",
        f"Running: {app.dispatcher.running_count(ctx.session_key)}, "
        f"queued: {app.dispatcher.queue_length(ctx.session_key)}",
        f"Active runs (all chats): {app.engine.active_runs}",
    ]
    if app.host.errors:
        lines.append("Plugin errors:")
        lines.extend(f"  {name}: {error}" for name, error in sorted(app.host.errors.items()))
    return "\n".join(lines)


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
    ]
