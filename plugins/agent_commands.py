"""Admin commands for agents: /agents, /agent [reload NAME], /patterns [NAME].

``/agent reload NAME`` re-reads ``roost.toml`` (when the service was started
from one): the new bindings apply at once, agent ``NAME`` is resolved again
right away so a mistake is reported here, and other agents pick up their edits
when their cache entry expires (``agent_cache_ttl``) or on their own reload.
"""

from __future__ import annotations

import asyncio
import time

from roost import (
    DEFAULT_AGENT,
    AgentConfig,
    AgentError,
    AgentView,
    Command,
    CommandContext,
    Settings,
    hookimpl,
)

MAX_PATTERNS_LISTED = 80


def _describe(name: str, config: AgentConfig, settings: Settings, agent: AgentView | None,
              tools: int) -> str:
    provider = config.provider or settings.provider
    model = config.model or settings.model
    parts = [f"{provider}/{model}", config.type]
    policy = config.tools
    shown = f"tools {policy.profile}"
    if policy.allow:
        shown += f" +{','.join(policy.allow)}"
    if policy.deny:
        shown += f" -{','.join(policy.deny)}"
    if agent is not None:
        shown += f" ({tools} offered)"
    parts.append(shown)
    if config.patterns is not None:
        count = f", {len(agent.patterns.patterns)} loaded" if agent and agent.patterns else ""
        parts.append(f"patterns {config.patterns.dir}{count}")
    if config.judge is not None:
        j = config.judge
        parts.append(f"{len(j.judges)} judge(s), {j.strategy} >= {j.threshold:.2f}, "
                     f"up to {j.max_retries} attempts")
    parts.append("resolved" if agent is not None else "not resolved yet")
    return f"- {name}: " + ", ".join(parts)


async def _agents(ctx: CommandContext) -> str:
    app = ctx.app
    settings, router = app.settings, app.agents
    configs = dict(settings.agents)
    configs.setdefault(DEFAULT_AGENT, AgentConfig())
    lines = ["Agents:"]
    for name in sorted(configs):
        agent = router.peek(name)
        plugins = app.snapshot
        tools = len(agent.tools(plugins.tools, plugins.tool_groups)) if agent else 0
        lines.append(_describe(name, configs[name], settings, agent, tools))
    if settings.bindings:
        lines.append("Bindings (the most specific match wins; on a tie, the first listed):")
        lines.extend(f"{i}. {b.describe()} -> {b.agent}"
                     for i, b in enumerate(settings.bindings, 1))
    else:
        lines.append("Bindings: none")
    lines.append(f"Unbound chats -> {DEFAULT_AGENT}. This chat -> {ctx.agent}.")
    return "\n".join(lines)


async def _agent(ctx: CommandContext) -> str:
    words = ctx.args.split()
    if not words:
        return f"This chat is served by agent {ctx.agent}. Usage: /agent reload <name>"
    if words[0] != "reload" or len(words) != 2:
        return "Usage: /agent reload <name>"
    return await _reload(ctx, words[1])


async def _reload(ctx: CommandContext, name: str) -> str:
    app = ctx.app
    settings, router = app.settings, app.agents
    try:
        note = await router.reread()
    except AgentError as exc:
        return str(exc)
    if name not in settings.agents and name != DEFAULT_AGENT:
        router.invalidate(name)
        known = ", ".join(sorted({*settings.agents, DEFAULT_AGENT}))
        return f"No agent named {name!r} ({note}; agents: {known})."
    router.invalidate(name)
    started = time.perf_counter()
    try:
        agent = await router.get(name)
    except AgentError as exc:
        return f"Agent {name} cannot run ({note}): {exc}"
    took = (time.perf_counter() - started) * 1000
    await app.invalidate_everywhere("agent", name)  # replicas re-read it too
    return (f"Reloaded agent {name} ({note}) in {took:.0f} ms: "
            f"{agent.settings.provider}/{agent.settings.model}, {agent.type}.")


async def _patterns(ctx: CommandContext) -> str:
    name = ctx.args.strip() or ctx.agent
    try:
        agent = await ctx.app.agents.get(name)
    except AgentError as exc:
        return str(exc)
    library = agent.patterns
    if library is None:
        return f"Agent {name} has no pattern library."
    await asyncio.to_thread(library.reload_if_changed)
    patterns = library.patterns
    lines = [f"Agent {name}: {len(patterns)} pattern(s) from {library.directory} "
             f"(top {library.top_k}, min score {library.min_score:g})"]
    for pattern in sorted(patterns, key=lambda p: -library.last_scores.get(p.name, -1.0))[
            :MAX_PATTERNS_LISTED]:
        score = library.last_scores.get(pattern.name)
        last = f"last match {score:.2f}" if score is not None else "not matched yet"
        lines.append(f"- {pattern.name} ({last}): {pattern.description}".rstrip(": "))
    if len(patterns) > MAX_PATTERNS_LISTED:
        lines.append(f"... and {len(patterns) - MAX_PATTERNS_LISTED} more")
    errors = library.errors
    if errors:
        lines.append("Skipped:")
        lines.extend(f"- {source}: {why}" for source, why in sorted(errors.items()))
    return "\n".join(lines)


@hookimpl
def roost_commands(settings: Settings) -> list[Command]:
    """The agent administration commands."""
    return [
        Command("agents", "list the agents and which chats they serve", _agents,
                admin_only=True),
        Command("agent", "show this chat's agent, or reload one after a config edit",
                _agent, admin_only=True, usage="[reload <name>]"),
        Command("patterns", "list an agent's patterns with their last match scores",
                _patterns, admin_only=True, usage="[agent]"),
    ]
