"""Agents at run time: the resolver builds one from its config, the router caches it.

The router (spec agent-loop §9) resolves an agent lazily on its first run,
keeps it for ``agent_cache_ttl`` seconds and resolves it again after that or
after :meth:`AgentRouter.invalidate`. Runs in flight keep the :class:`Agent`
they started with, so an invalidation never changes a run half-way.

The resolver (§10) applies the fallbacks: an unknown provider becomes the
first registered one (with a warning), a context window ``<= 0`` becomes
200,000 tokens and ``max_iterations <= 0`` becomes 20.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bot.agents.judge import CorrectionResult, LLMJudge
from bot.agents.patterns import PatternLibrary
from bot.agents.tool_policy import ToolPolicy
from bot.config.agents import DEFAULT_AGENT, AgentConfig, AgentType, Binding, JudgeConfig
from bot.config.settings import ConfigError, Settings, load_settings
from bot.contracts.judge import Judge, Verdict
from bot.contracts.llm import LLMProvider, ToolSpec
from bot.contracts.messages import InboundMessage
from bot.contracts.tools import Tool
from bot.contracts.views import AgentError as AgentError
from bot.pluginhost.manager import PluginHost
from workspaces import TEMPLATE_NAMES, ensure_workspace, safe_component, workspace_dir

log = logging.getLogger("roost.agents.router")

FALLBACK_CONTEXT_WINDOW = 200_000
FALLBACK_MAX_ITERATIONS = 20
AGENT_WORKSPACES = "@agents"
"""Under the workspaces root, the directory of the non-default agents' workspaces.

``@`` never survives :func:`workspaces.safe_component`, so no channel's
directory can be called this.
"""


def workspaces_root(settings: Settings, agent: str) -> Path:
    """Where agent ``agent`` keeps its users' workspaces.

    The default agent's are directly under ``workspaces_dir`` (as before there
    were agents); another agent's under ``workspaces_dir/@agents/<agent>``.
    """
    if agent == DEFAULT_AGENT:
        return settings.workspaces_dir
    return settings.workspaces_dir / AGENT_WORKSPACES / safe_component(agent)


def user_workspace(settings: Settings, message: InboundMessage) -> Path:
    """The workspace of ``message``'s sender, under the agent its chat is bound to."""
    root = workspaces_root(settings, route(settings.bindings, message))
    return workspace_dir(root, message.channel, message.sender_id)


@functools.lru_cache(maxsize=4096)
def workspace_for(root: Path, channel: str, user_id: str) -> Path:
    """The sender's workspace under ``root`` (sanitizing and hashing ids is pure; cached)."""
    return workspace_dir(root, channel, user_id)


@dataclass(slots=True)
class JudgeStats:
    """How an agent's replies fared with its judges since the service started."""

    judged: int = 0
    passed: int = 0
    first_try: int = 0
    attempts: int = 0
    errors: int = 0

    def failed(self) -> None:
        """Count one reply whose judging failed (it went out unjudged)."""
        self.errors += 1

    def record(self, result: CorrectionResult) -> None:
        """Count one judged reply."""
        self.judged += 1
        self.attempts += result.attempts
        self.passed += result.passed
        self.first_try += result.passed and result.attempts == 1

    def describe(self) -> str:
        """``7/8 passed (88%), 5 on the first try, 1.4 attempts per reply``."""
        if not self.judged:
            text = "no replies judged yet"
        else:
            text = (f"{self.passed}/{self.judged} passed ({self.passed / self.judged:.0%}), "
                    f"{self.first_try} on the first try, "
                    f"{self.attempts / self.judged:.1f} attempts per reply")
        if self.errors:
            text += f", {self.errors} unjudged after a judge error"
        return text


@dataclass(slots=True)
class Agent:
    """A resolved agent: everything a run needs that differs between agents.

    ``provider`` is ``None`` when the agent uses the service's own provider
    (the engine's), which keeps one client for the common case.
    """

    name: str
    config: AgentConfig
    settings: Settings
    provider: LLMProvider | None
    policy: ToolPolicy
    workspaces_root: Path
    patterns: PatternLibrary | None = None
    judges: tuple[Judge, ...] = ()
    resolved_at: float = 0.0
    _tools: tuple[Mapping[str, Tool], dict[str, Tool], Mapping[str, ToolSpec],
                  frozenset[str]] | None = field(
        default=None, repr=False)
    _seeded: set[Path] = field(default_factory=set, repr=False)

    @property
    def type(self) -> AgentType:
        """``open`` (per-user persona files) or ``predefined`` (the agent's own)."""
        return self.config.type

    @property
    def bootstrap_dir(self) -> Path | None:
        """The agent's persona and template files, if configured."""
        return self.config.bootstrap_dir

    @property
    def judge(self) -> JudgeConfig | None:
        """Self-correction settings, when the agent has judges."""
        return self.config.judge if self.judges else None

    async def workspace(self, channel: str, user_id: str) -> Path:
        """The workspace of ``user_id`` on ``channel`` under this agent, seeded with the
        agent's templates the first time the agent serves that user (a predefined agent's
        persona is its own: the user's workspace gets only USER.md)."""
        path = workspace_for(self.workspaces_root, channel, user_id)
        if path not in self._seeded:
            await asyncio.to_thread(ensure_workspace, path, self.bootstrap_dir,
                                    ("USER.md",) if self.type == "predefined"
                                    else TEMPLATE_NAMES)
            self._seeded.add(path)
        return path

    def tools(self, registered: Mapping[str, Tool], groups: Mapping[str, str]) -> dict[str, Tool]:
        """The registered tools this agent's policy lets a run offer and execute.

        Cached until the registered tools change (a plugin enabled or disabled).
        """
        return self._offered(registered, groups)[0]

    def specs(self, registered: Mapping[str, Tool],
              groups: Mapping[str, str]) -> Mapping[str, ToolSpec]:
        """What the model is shown of each of :meth:`tools`, by name (cached alike)."""
        return self._offered(registered, groups)[1]

    def needing_approval(self, registered: Mapping[str, Tool],
                         groups: Mapping[str, str]) -> frozenset[str]:
        """Which of :meth:`tools` wait for a person's approval (cached alike)."""
        return self._offered(registered, groups)[2]

    def _offered(self, registered: Mapping[str, Tool], groups: Mapping[str, str]
                 ) -> tuple[dict[str, Tool], Mapping[str, ToolSpec], frozenset[str]]:
        cached = self._tools
        if cached is not None and cached[0] is registered:
            return cached[1], cached[2], cached[3]
        allowed = self.policy.filter(registered, groups)
        specs = MappingProxyType({name: tool.spec() for name, tool in allowed.items()})
        approve = self.policy.needing_approval(allowed, groups)
        self._tools = (registered, allowed, specs, approve)
        return allowed, specs, approve


class _ConfiguredJudge:
    """A plugin's judge under the name, weight and criteria an agent gave it."""

    def __init__(self, inner: Judge, name: str, weight: float, criteria: str) -> None:
        self.inner = inner
        self.name = name
        self.weight = weight
        self.criteria = criteria

    async def score(self, request_text: str, reply: str,
                    criteria: str | None = None) -> Verdict:
        return await self.inner.score(request_text, reply, criteria or self.criteria)


class AgentResolver:
    """Builds :class:`Agent` objects from ``settings.agents``.

    ``default_provider`` is the service's provider (the engine's); ``judges``
    returns the judges plugins offer, by name.
    Providers the resolver creates are kept per (provider, script) and reused
    by later resolutions; :meth:`aclose` closes them.
    """

    def __init__(self, settings: Settings, host: PluginHost,
                 default_provider: LLMProvider,
                 judges: Callable[[], Mapping[str, Judge]]) -> None:
        self.settings = settings
        self.host = host
        self.default_provider = default_provider
        self.plugin_judges = judges
        self._providers: dict[tuple[str, str], LLMProvider] = {}

    def names(self) -> list[str]:
        """Every agent that can be resolved: the configured ones and ``default``."""
        return sorted(set(self.settings.agents) | {DEFAULT_AGENT})

    async def resolve(self, name: str) -> Agent:
        """Build agent ``name``; raises :class:`AgentError` when it cannot run."""
        base = self.settings
        config = base.agents.get(name)
        if config is None:
            if name != DEFAULT_AGENT:
                raise AgentError(f"no agent named {name!r} (configured: "
                                 f"{', '.join(self.names())})")
            config = AgentConfig()
        settings = self._settings(name, config)
        provider, provider_name = await self._provider(name, config.provider, settings)
        if provider_name != base.provider:
            settings = settings.model_copy(update={"provider": provider_name})
        patterns = None
        if config.patterns is not None:
            p = config.patterns
            patterns = await asyncio.to_thread(
                PatternLibrary, p.dir, top_k=p.top_k, min_score=p.min_score,
                check_interval=p.check_interval)
            for source, why in patterns.errors.items():
                log.warning("agent %s: pattern %s skipped: %s", name, source, why)
        if config.bootstrap_dir is not None and not config.bootstrap_dir.is_dir():
            log.warning("agent %s: bootstrap_dir %s is not a directory; the built-in "
                        "templates are used instead", name, config.bootstrap_dir)
        judges = await self._judges(name, config, settings, provider)
        root = workspaces_root(base, name)
        log.info("agent %s resolved: %s/%s, window %d, %d iterations, tools %s, %d judge(s)",
                 name, settings.provider, settings.model, settings.context_window,
                 settings.max_iterations, config.tools.profile, len(judges))
        return Agent(name, config, settings, provider, ToolPolicy(
            config.tools.profile, config.tools.allow, config.tools.deny,
            config.tools.approve), root, patterns,
            judges, time.monotonic())

    def _settings(self, name: str, config: AgentConfig) -> Settings:
        base = self.settings
        updates: dict[str, Any] = {}
        window = base.context_window if config.context_window is None else config.context_window
        if window <= 0:
            log.warning("agent %s: context_window %d is not positive; using %d", name, window,
                        FALLBACK_CONTEXT_WINDOW)
            window = FALLBACK_CONTEXT_WINDOW
        iterations = (base.max_iterations if config.max_iterations is None
                      else config.max_iterations)
        if iterations <= 0:
            log.warning("agent %s: max_iterations %d is not positive; using %d", name,
                        iterations, FALLBACK_MAX_ITERATIONS)
            iterations = FALLBACK_MAX_ITERATIONS
        for key, value in (("context_window", window), ("max_iterations", iterations),
                           ("model", config.model), ("max_tokens", config.max_tokens),
                           ("script", config.script),
                           ("approval_timeout", config.approval_timeout)):
            if value is not None and value != getattr(base, key):
                updates[key] = value
        # Runs see setting changes made to the service's own object (tests,
        # embedders), so the common case shares it rather than copying.
        return base.model_copy(update=updates) if updates else base

    async def _provider(self, agent: str, requested: str | None,
                        settings: Settings) -> tuple[LLMProvider | None, str]:
        """The agent's provider and its name; ``None`` means the service's own."""
        base = self.settings
        if (requested is None or requested == base.provider) and settings.script == base.script:
            return None, base.provider
        specs = list(await self.host.hooks.roost_providers(settings=settings))
        if not specs:
            raise AgentError(f"agent {agent}: no provider plugin is loaded")
        name = requested or base.provider
        spec = next((s for s in specs if s.name == name), None)
        if spec is None:
            spec = specs[0]
            log.warning("agent %s: unknown provider %r; falling back to %r, the first "
                        "registered (known: %s)", agent, name, spec.name,
                        ", ".join(s.name for s in specs))
        if spec.name == base.provider and settings.script == base.script:
            return None, spec.name
        missing = spec.missing(settings)
        if missing:
            raise AgentError(f"agent {agent}: {missing}")
        key = (spec.name, str(settings.script or ""))
        provider = self._providers.get(key)
        if provider is None:
            provider = self._providers[key] = spec.create(settings)
        return provider, spec.name

    async def _judges(self, agent: str, config: AgentConfig, settings: Settings,
                      provider: LLMProvider | None) -> tuple[Judge, ...]:
        judge = config.judge
        if judge is None:
            return ()
        offered = self.plugin_judges()
        judges: list[Judge] = []
        used: set[str] = set()
        for entry in judge.judges:
            name = entry.name or entry.type
            if name in used:
                name = f"{name}-{len(judges) + 1}"
            used.add(name)
            criteria = entry.criteria or judge.criteria
            if entry.type == "llm":
                own = provider
                if entry.provider is not None:
                    judge_settings = settings.model_copy(update={"model": entry.model or
                                                                 settings.model})
                    own, _ = await self._provider(f"{agent} (judge {name})", entry.provider,
                                                  judge_settings)
                judges.append(LLMJudge(own or self.default_provider,
                                       entry.model or settings.model, criteria, name=name,
                                       weight=1.0 if entry.weight is None else entry.weight))
                continue
            plugin = offered.get(entry.type)
            if plugin is None:
                raise AgentError(f"agent {agent}: no judge of type {entry.type!r} (built in: "
                                 f"llm; from plugins: {', '.join(sorted(offered)) or 'none'})")
            weight = plugin.weight if entry.weight is None else entry.weight
            judges.append(_ConfiguredJudge(plugin, name, weight, criteria))
        return tuple(judges)

    async def aclose(self) -> None:
        """Close the providers this resolver created."""
        for provider in self._providers.values():
            try:
                await provider.aclose()
            except Exception:
                log.exception("closing the %s provider failed", provider.name)
        self._providers.clear()


@dataclass(slots=True)
class _Cached:
    agent: Agent
    expires: float


class AgentRouter:
    """Chooses the agent for a message and caches resolved agents with a TTL."""

    def __init__(self, resolver: AgentResolver, *, ttl: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.resolver = resolver
        self.settings = resolver.settings
        self.ttl = self.settings.agent_cache_ttl if ttl is None else ttl
        self.clock = clock
        self.resolutions = 0
        self.stats: dict[str, JudgeStats] = {}
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._generation: dict[str, int] = {}

    def route(self, message: InboundMessage) -> str:
        """The agent bound to ``message``'s chat (most specific binding), else ``default``."""
        return route(self.settings.bindings, message)

    async def get(self, name: str) -> Agent:
        """Agent ``name``: cached while its TTL lasts, resolved again after it."""
        cached = self._cache.get(name)
        if cached is not None and self.clock() < cached.expires:
            return cached.agent
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            cached = self._cache.get(name)
            if cached is not None and self.clock() < cached.expires:
                return cached.agent
            generation = self._generation.get(name, 0)
            agent = await self.resolver.resolve(name)
            self.resolutions += 1
            # An invalidation while resolving means the config changed under us:
            # use the result for this run but do not keep it.
            if self._generation.get(name, 0) == generation:
                self._cache[name] = _Cached(agent, self.clock() + self.ttl)
            return agent

    async def reread(self) -> str:
        """Re-read the agents and bindings from the config file the service started
        from; what was done, in a phrase. Raises :class:`AgentError` (nothing changed)
        when the file has errors."""
        settings = self.settings
        if settings.config_file is None:
            return "no config file to re-read; resolved again from the running configuration"
        try:
            fresh = await asyncio.to_thread(load_settings, settings.config_file)
        except ConfigError as exc:
            raise AgentError(f"{settings.config_file} has errors; nothing changed:\n{exc}") \
                from None
        settings.agents = fresh.agents
        settings.bindings = fresh.bindings
        return f"re-read {settings.config_file}"

    def peek(self, name: str) -> Agent | None:
        """Agent ``name`` if it is cached and fresh; never resolves."""
        cached = self._cache.get(name)
        return cached.agent if cached is not None and self.clock() < cached.expires else None

    def invalidate(self, name: str | None = None) -> bool:
        """Forget agent ``name`` (every agent for ``None``); True if one was cached."""
        names = list(self._cache) if name is None else [name]
        dropped = False
        for each in names:
            self._generation[each] = self._generation.get(each, 0) + 1
            dropped |= self._cache.pop(each, None) is not None
        return dropped

    def permits_anywhere(self, name: str, tools: Mapping[str, Tool],
                         groups: Mapping[str, str]) -> bool:
        """Whether some configured agent's tool policy lets tool ``name`` (one of
        ``tools``, grouped by ``groups``) run."""
        offered = {name: tools[name]} if name in tools else {}
        return any(name in ToolPolicy(c.tools.profile, c.tools.allow, c.tools.deny)
                   .filter(offered, groups) for c in self.settings.agents.values())

    def stats_for(self, name: str) -> JudgeStats:
        """The judge statistics of agent ``name`` (kept across re-resolutions)."""
        stats = self.stats.get(name)
        if stats is None:
            stats = self.stats[name] = JudgeStats()
        return stats

    async def aclose(self) -> None:
        """Close the providers resolved agents created."""
        self._cache.clear()
        await self.resolver.aclose()


def route(bindings: list[Binding], message: InboundMessage) -> str:
    """The agent for ``message``: the most specific matching binding, else the default."""
    best: Binding | None = None
    for binding in bindings:
        if binding.matches(message) and (best is None
                                         or binding.specificity > best.specificity):
            best = binding
    return best.agent if best is not None else DEFAULT_AGENT
